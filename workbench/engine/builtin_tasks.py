"""Built-in tasks that need no download: synthetic classification and a tiny character-level LM.

Datasets are generated from a fixed data seed, so every rank builds exactly the same dataset and
the DistributedSampler decides which rank sees which sample.
"""

from __future__ import annotations

import math
from importlib import resources

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from workbench.engine.tasks import Task


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output.argmax(dim=-1) == target).float().mean()


def synthetic_classification(n_train: int = 4096, n_val: int = 512, dim: int = 32, classes: int = 4,
                             hidden: int = 64, noise: float = 3.0, dropout: float = 0.0,
                             data_seed: int = 1234) -> Task:
    """Gaussian clusters in `dim` dimensions, one per class; an MLP classifier."""
    gen = torch.Generator().manual_seed(data_seed)
    centres = torch.randn(classes, dim, generator=gen) * 2.0

    def make(n: int) -> TensorDataset:
        labels = torch.randint(0, classes, (n,), generator=gen)
        points = centres[labels] + noise * torch.randn(n, dim, generator=gen)
        return TensorDataset(points, labels)

    model = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, classes))
    return Task(model=model, train_dataset=make(n_train), val_dataset=make(n_val),
                loss_fn=F.cross_entropy, metrics={"accuracy": accuracy})


class CharDataset(Dataset):
    """Every window of `block_size` characters, the target being the window shifted by one."""

    def __init__(self, ids: torch.Tensor, block_size: int):
        self.ids, self.block_size = ids, block_size

    def __len__(self) -> int:
        return len(self.ids) - self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i: i + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class TinyTransformer(nn.Module):
    """A decoder-only transformer: embeddings, causal encoder layers, a tied output head."""

    mask: torch.Tensor

    def __init__(self, vocab: int, block_size: int, d_model: int, n_head: int, n_layer: int, dropout: float):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        # The head is tied to the embedding: with nn.Embedding's N(0, 1) the logits' spread grows as sqrt(d_model)
        # (a loss of 191 at GPT-2 small's width, 768, where log(vocab) is 4.2, and training that diverges in bf16,
        # seen on an H200).  GPT-2's 0.02 starts every width near log(vocab).
        nn.init.normal_(self.tok.weight, std=0.02)
        self.pos = nn.Parameter(torch.zeros(block_size, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block_size), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos[:t]
        x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        return self.norm(x) @ self.tok.weight.T


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def bits_per_char(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return lm_loss(logits, target).detach() / math.log(2)


def char_lm(block_size: int = 32, d_model: int = 32, n_head: int = 2, n_layer: int = 1,
            dropout: float = 0.0, val_fraction: float = 0.1) -> Task:
    """A tiny character-level language model on the text shipped with the package."""
    text = resources.files("workbench").joinpath("data/tiny.txt").read_text()
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    split = int(len(ids) * (1 - val_fraction))
    model = TinyTransformer(len(vocab), block_size, d_model, n_head, n_layer, dropout)
    return Task(model=model, train_dataset=CharDataset(ids[:split], block_size),
                val_dataset=CharDataset(ids[split:], block_size), loss_fn=lm_loss,
                metrics={"bits_per_char": bits_per_char})
