"""An FSDP2 training script as users bring it, in the shape of PyTorch's own FSDP2 example
(pytorch/examples distributed/FSDP2): built on the meta device, fully_shard on each block and the
root, to_empty and reset_parameters, a few Adam steps, a DCP checkpoint.  Meant for
`torchrun --nproc_per_node 2 own_fsdp2.py`; nothing in it knows about workbench, and it prints its
loss without flushing."""
import argparse

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    def __init__(self, vocab=64, dim=16, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def main(args):
    dist.init_process_group()
    rank = dist.get_rank()
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Model()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    assert isinstance(model, FSDPModule)
    model.to_empty(device="cpu")
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    if rank == 0:
        print(f"parameters: {sum(p.numel() for p in model.parameters())} "
              f"(this rank holds {sum(p.to_local().numel() for p in model.parameters())})")

    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        tokens = torch.randint(0, 64, (8, 12), generator=gen)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
        loss.backward()
        optim.step()
        optim.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item():.4f}")

    if args.checkpoint:
        model_state, optim_state = get_state_dict(model, optim)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=args.checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--checkpoint", default="")
    main(parser.parse_args())
