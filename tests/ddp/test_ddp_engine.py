"""Real multi-process DDP behaviour of the engine: 2 ranks, gloo, CPU."""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.distributed as dist

from tests.support.ddp import run_ranks
from workbench.config import JobConfig
from workbench.engine.builtin_tasks import synthetic_classification
from workbench.engine.env import DistEnv
from workbench.engine.monitor import RankMonitor
from workbench.engine.trainer import Trainer
from workbench.runfolder.layout import RunDir

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(180), pytest.mark.xdist_group("ddp_engine")]


def _trainer(cfg: JobConfig, run_dir: str, **task_options) -> Trainer:
    torch.manual_seed(0)
    task = synthetic_classification(n_train=256, n_val=64, **task_options)
    env = DistEnv.from_environ()
    monitor = RankMonitor(RunDir(run_dir), env.rank, env.world_size)
    return Trainer(cfg, task, env, "cpu", RunDir(run_dir), monitor)


def _cfg(**train) -> JobConfig:
    base = {"micro_batch_size": 8, "optimizer": "sgd", "lr": 0.1, "grad_clip_norm": None, **train}
    return JobConfig.from_dict({"train": base})


def _shard_indices(rank: int) -> dict:
    trainer = _trainer(_cfg(), tempfile.mkdtemp())
    seen = {}
    for epoch in (0, 1):
        trainer.loader.sampler.set_epoch(epoch)
        seen[epoch] = list(trainer.loader.sampler)
    return seen


def _all_checks(rank: int) -> dict:
    """Every check of this file, by the same two ranks (one process group; each builds its own
    trainer): what each test reads from."""
    return {"shards": _shard_indices(rank), "grads": _grads_after_step(rank), "one_step": _accumulated_and_single(rank)}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_ranks(_all_checks)


def test_shards_are_disjoint_cover_the_dataset_and_reshuffle(ranks):
    seen = [r["shards"] for r in ranks]
    for epoch in (0, 1):
        a, b = set(seen[0][epoch]), set(seen[1][epoch])
        assert not a & b
        assert a | b == set(range(256))
    assert seen[0][0] != seen[0][1], "set_epoch must reshuffle between epochs"


def _grads_after_step(rank: int) -> dict:
    trainer = _trainer(_cfg(), tempfile.mkdtemp())
    trainer.optimizer.zero_grad = lambda set_to_none=True: None  # keep the grads of the step to compare
    trainer.loader.sampler.set_epoch(0)
    trainer.train_step(iter(trainer.loader))
    grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
    gathered = [torch.zeros_like(grads) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, grads)
    trainer.steplog.flush()
    return {"grads": gathered, "loss": trainer.monitor.metrics.path.read_text()}


def test_gradients_are_identical_on_every_rank_after_a_step(ranks):
    out = [r["grads"] for r in ranks]
    grads = out[0]["grads"]
    assert grads[0].abs().sum() > 0
    assert torch.equal(grads[0], grads[1])
    assert out[0]["loss"] != out[1]["loss"], "ranks must have trained on different data"


def _params_after_one_step(rank: int, micro: int, accum: int) -> torch.Tensor:
    trainer = _trainer(_cfg(micro_batch_size=micro, grad_accum_steps=accum), tempfile.mkdtemp())
    trainer.loader.sampler.set_epoch(0)
    trainer.train_step(iter(trainer.loader))
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


def _accumulated_and_single(rank: int) -> dict[str, torch.Tensor]:
    """One step of 4 x 8 accumulated and one of 32, by the same two ranks (one process group)."""
    return {"accumulated": _params_after_one_step(rank, micro=8, accum=4),
            "single": _params_after_one_step(rank, micro=32, accum=1)}


def test_accumulated_micro_steps_match_one_larger_batch(ranks):
    out = [r["one_step"] for r in ranks]
    torch.testing.assert_close(out[0]["accumulated"], out[0]["single"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[1]["accumulated"], out[0]["accumulated"])
