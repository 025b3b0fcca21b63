"""workbench.submit_fn: a plain training function run on every rank in processes of its own (forked
warm from the run's controller, never from the caller), with the process group up; per-rank
streams, every rank's return value, failures with their traceback."""

from __future__ import annotations

import pytest

import workbench
from workbench.config import JobConfig
from workbench.errors import RunFailed
from workbench.runfolder.layout import RunDir, read_json

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(180)]


def _cfg(tmp_path) -> JobConfig:
    return JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})


def test_a_function_trains_on_every_rank_and_returns_each_ranks_value(tmp_path):
    def train(steps: int, lr: float = 0.1) -> dict:  # as if defined in a notebook cell: pickled by value
        import os

        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        import workbench

        rank = dist.get_rank()
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        gen = torch.Generator().manual_seed(rank)
        for step in range(1, steps + 1):
            x = torch.randn(8, 4, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            workbench.log(step=step, loss=loss)
        return {"rank": rank, "world": dist.get_world_size(), "backend": dist.get_backend(),
                "elastic": dist.is_torchelastic_launched(), "threads": torch.get_num_threads(),
                "weight": model.module.weight.detach().clone(), "pid": os.getpid()}

    run = workbench.submit_fn(train, 6, cfg=_cfg(tmp_path), lr=0.05)
    assert run.wait(timeout=150).state == "finished", run.exception()
    results = run.results()
    assert [r["rank"] for r in results] == [0, 1] and {r["world"] for r in results} == {2}
    assert {r["backend"] for r in results} == {"gloo"} and all(r["elastic"] for r in results)
    assert results[0]["weight"].equal(results[1]["weight"])  # DDP kept the replicas identical
    assert results[0]["pid"] != results[1]["pid"]
    assert [(read_json(RunDir(run.folder).procs(rank)) or {}).get("forked") for rank in (0, 1)] == [True, True]
    frame = run.metrics()
    assert frame.groupby("rank")["step"].max().tolist() == [6, 6]
    assert frame.pivot_table(index="step", columns="rank", values="loss").diff(axis=1)[1].abs().sum() > 0
    assert run.status().step == 6 and "train" in run.folder.name


def test_an_exception_on_one_rank_fails_the_run_with_its_traceback(tmp_path):
    def flaky() -> int:
        import torch.distributed as dist

        if dist.get_rank() == 1:
            raise ValueError("rank 1 cannot go on")
        dist.barrier()  # rank 0 waits for a peer that is gone: the run must still end
        return 0

    run = workbench.submit_fn(flaky, cfg=_cfg(tmp_path))
    assert run.wait(timeout=150).state == "failed"
    failure = run.exception()
    assert (failure.rank, failure.type, failure.message) == (1, "ValueError", "rank 1 cannot go on")
    assert "in flaky" in failure.traceback
    with pytest.raises(RunFailed, match="rank 1 .*ValueError: rank 1 cannot go on"):
        run.results()
