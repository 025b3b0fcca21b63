"""A wider Task: models that compute their own loss (nanoGPT's GPT(idx, targets)) and dict batches
(Hugging Face's model(**batch) with labels) train in the engine unchanged, and train exactly like
the same model with a separate loss_fn.  Real 2-rank gloo runs; unit checks of the loss rules."""
from __future__ import annotations

import tempfile

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from tests.support.ddp import run_ranks
from tests.support.tasks_for_tests import Output
from workbench.config import JobConfig
from workbench.engine.builtin_tasks import accuracy, synthetic_classification
from workbench.engine.env import DistEnv
from workbench.engine.monitor import RankMonitor
from workbench.engine.tasks import Task
from workbench.engine.trainer import Trainer
from workbench.runfolder.layout import RunDir

pytestmark = pytest.mark.timeout(180)



class OwnLoss(nn.Module):
    """nanoGPT style: forward(x, targets) -> (logits, loss)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x)
        return logits, F.cross_entropy(logits, targets)






class LabelsModel(nn.Module):
    """Hugging Face style: forward(input_values=..., labels=...) -> Output(loss, logits)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, input_values: torch.Tensor, labels: torch.Tensor) -> Output:
        logits = self.net(input_values)
        return Output(F.cross_entropy(logits, labels), logits)



class DictDataset(Dataset):
    def __init__(self, pairs: Dataset):
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.pairs[i]
        return {"input_values": x, "labels": y}



def _task(shape: str) -> Task:
    torch.manual_seed(0)
    base = synthetic_classification(n_train=256, n_val=64)
    if shape == "loss_fn":
        return base
    if shape == "own_loss":
        return Task(model=OwnLoss(base.model), train_dataset=base.train_dataset, val_dataset=base.val_dataset,
                    metrics={"accuracy": lambda out, y: accuracy(out[0], y)})
    return Task(model=LabelsModel(base.model), train_dataset=DictDataset(base.train_dataset),
                val_dataset=DictDataset(base.val_dataset),
                metrics={"accuracy": lambda out, batch: accuracy(out.logits, batch["labels"])})



def _fit(rank: int, shape: str) -> dict:
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 8, "grad_accum_steps": 2, "max_steps": 6,
                                         "optimizer": "sgd", "lr": 0.1, "checkpoint_every_steps": 100, "eval_every_steps": 3},
                               "dist": {"check_every_steps": None}})
    run = RunDir(tempfile.mkdtemp())
    env = DistEnv.from_environ()
    trainer = Trainer(cfg, _task(shape), env, "cpu", run, RankMonitor(run, env.rank, env.world_size))
    summary = trainer.fit()
    params = torch.cat([p.detach().flatten() for p in trainer.model.module.parameters()])
    return {"params": params, "eval": summary["last_eval"], "steps": summary["steps"]}



def _fit_each(rank: int, shapes: tuple[str, ...]) -> dict[str, dict]:
    """Every shape trained in turn by the same two ranks (one process group, fresh models)."""
    return {shape: _fit(rank, shape) for shape in shapes}


@pytest.mark.ddp
def test_own_loss_and_dict_batches_train_exactly_like_a_loss_fn():
    out = run_ranks(_fit_each, shapes=("loss_fn", "own_loss", "dict_batch"))
    for shape in ("own_loss", "dict_batch"):
        for rank in (0, 1):
            reference = out[rank]["loss_fn"]
            assert out[rank][shape]["steps"] == 6
            torch.testing.assert_close(out[rank][shape]["params"], reference["params"])
            assert out[rank][shape]["eval"] == pytest.approx(reference["eval"]), shape
        assert set(out[0][shape]["eval"]) == {"val_loss", "val_accuracy"}
