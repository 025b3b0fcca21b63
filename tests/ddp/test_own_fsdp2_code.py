"""Users' own FSDP2 code runs unchanged (issue 32 item 4): a function given to submit_fn and a script
given to submit_script or `workbench launch` that call torch.distributed.fsdp.fully_shard themselves,
save with torch.distributed.checkpoint, and Lightning's FSDP2 strategy (ModelParallelStrategy) under
`workbench launch`.  Real 2-rank gloo runs on CPU, tiny models.

Lightning's `strategy="fsdp"` (FSDP1) is not here: Lightning 2.6 refuses it on CPU in the Trainer's
constructor ("The strategy `fsdp` requires a GPU accelerator, but received `accelerator='cpu'`"),
before any process group exists, so the run fails in the user's own line, as it would under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import assert_nothing_left
from workbench.config import JobConfig

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]
OWN_FSDP2 = SCRIPTS / "own_fsdp2.py"
LIGHTNING_FSDP2 = SCRIPTS / "integrations" / "lightning_fsdp2.py"
STEPS = 5


def _cfg(root: Path) -> JobConfig:
    return JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(root)}})


def test_a_function_that_shards_its_own_model_trains_as_its_ddp_twin(tmp_path):
    def fsdp2_training(steps: int, checkpoint: str) -> dict:  # a user's own FSDP2 loop, as in a notebook cell
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.fsdp import fully_shard

        import workbench

        dist.init_process_group("gloo")  # as under torchrun: it finds the group submit_fn brought up
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(8 if i == 0 else 16, 16), torch.nn.Tanh())
                                      for i in range(3)), torch.nn.Linear(16, 2))
        full = {name: p.numel() for name, p in model.named_parameters()}
        for block in model:
            fully_shard(block)
        fully_shard(model)
        local = {name: p.to_local().numel() for name, p in model.named_parameters()}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(rank)  # each rank its own data
        for step in range(1, steps + 1):
            x = torch.randn(16, 8, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), torch.stack([x.sum(1), x[:, 0]], 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            workbench.log(step=step, loss=loss)
        model_state, optim_state = get_state_dict(model, opt)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint)
        dist.destroy_process_group()  # leaves the group for workbench to end
        return {"rank": rank, "full": full, "local": local,
                "dtensor": all(type(p).__name__ == "DTensor" for p in model.parameters())}

    def ddp_training(steps: int) -> dict:  # the same model, seed and data, hand-written DDP
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        import workbench

        rank = dist.get_rank()
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(8 if i == 0 else 16, 16), torch.nn.Tanh())
                                      for i in range(3)), torch.nn.Linear(16, 2))
        ddp = DDP(model)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(rank)
        for step in range(1, steps + 1):
            x = torch.randn(16, 8, generator=gen)
            loss = torch.nn.functional.mse_loss(ddp(x), torch.stack([x.sum(1), x[:, 0]], 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            workbench.log(step=step, loss=loss)
        return {"rank": rank, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}

    checkpoint = tmp_path / "dcp"
    fsdp2 = workbench.submit_fn(fsdp2_training, STEPS, str(checkpoint), cfg=_cfg(tmp_path / "runs"))
    ddp = workbench.submit_fn(ddp_training, STEPS, cfg=_cfg(tmp_path / "runs"))
    for run in (fsdp2, ddp):
        assert run.wait(timeout=240).state == "finished", run.exception()
    sharded = fsdp2.results()
    assert [r["rank"] for r in sharded] == [0, 1] and all(r["dtensor"] for r in sharded)
    for name, numel in sharded[0]["full"].items():  # every dim 0 is even: each rank holds exactly half
        assert [r["local"][name] for r in sharded] == [numel // 2, numel // 2], name
    losses = {name: run.metrics().pivot_table(index="step", columns="rank", values="loss")
              for name, run in (("fsdp2", fsdp2), ("ddp", ddp))}
    assert losses["fsdp2"].index.tolist() == list(range(1, STEPS + 1)) and list(losses["fsdp2"].columns) == [0, 1]
    numpy.testing.assert_allclose(losses["fsdp2"].to_numpy(), losses["ddp"].to_numpy(), rtol=1e-5)
    assert sorted(p.name for p in checkpoint.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    saved = _load_dcp(checkpoint, tmp_path / "joined.pt")["model"]
    for name, value in ddp.results()[0]["state"].items():  # the shards joined are DDP's weights
        torch.testing.assert_close(saved[name], value, rtol=1e-5, atol=1e-6)
    for run in (fsdp2, ddp):
        assert_nothing_left(run.folder)


def _load_dcp(folder: Path, joined: Path) -> dict:
    """A DCP checkpoint joined into one state dict, here, without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(folder, joined)
    return torch.load(joined, weights_only=True)


def _steps_printed(text: str, rank: int) -> list[int]:
    return [int(line.split()[3]) for line in text.splitlines() if line.startswith(f"rank {rank} step ")]


def test_an_fsdp2_script_that_knows_nothing_of_workbench_runs_under_submit_script(tmp_path):
    checkpoint = tmp_path / "dcp"
    run = workbench.submit_script(OWN_FSDP2, ["--steps", str(STEPS), "--checkpoint", str(checkpoint)],
                                  _cfg(tmp_path / "runs"), nproc=2)
    assert run.wait(timeout=240).state == "finished", run.exception()
    for rank in (0, 1):  # printed without flush: every line still reaches the rank's log
        assert _steps_printed(run.logs(rank), rank) == list(range(1, STEPS + 1)), run.logs(rank)[-2000:]
    assert "parameters: 4320 (this rank holds 2160)" in run.logs(0)
    assert run.result()["output_lines"] >= STEPS
    assert sorted(p.name for p in checkpoint.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    saved = _load_dcp(checkpoint, tmp_path / "joined.pt")["model"]
    assert saved["head.weight"].shape == (64, 16) and all(v.isfinite().all() for v in saved.values())
    assert run.health()["warnings"] == [] and run.health()["stalled_ranks"] == []
    assert_nothing_left(run.folder)


def test_an_fsdp2_script_under_workbench_launch_shows_both_ranks_steps(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "launch", "--nproc", "2",
                           "--set", f"launch.run_root={tmp_path / 'runs'}", str(OWN_FSDP2), "--steps", str(STEPS)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for rank in (0, 1):  # the terminal shows each rank's own lines, prefixed as torchrun's --tee would
        shown = [line.removeprefix(f"[rank {rank}] ") for line in lines if line.startswith(f"[rank {rank}] rank ")]
        assert _steps_printed("\n".join(shown), rank) == list(range(1, STEPS + 1)), proc.stdout[-3000:]
    assert "[workbench] finished (no metrics logged;" in proc.stdout and "ranks 0:finished, 1:finished" in proc.stdout
    (folder,) = (tmp_path / "runs").iterdir()
    assert workbench.Run.load(folder).status().state == "finished"
    assert_nothing_left(folder)


def test_lightning_fsdp2_under_workbench_launch(tmp_path):
    """ModelParallelStrategy: Lightning's FSDP2, on CPU with gloo; the module shards itself."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "launch", "--nproc", "2", "--quiet",
                           "--set", f"launch.run_root={tmp_path / 'runs'}", str(LIGHTNING_FSDP2), str(out)],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (folder,) = (tmp_path / "runs").iterdir()
    run = workbench.Run.load(folder)
    frame = run.metrics()
    losses = frame.pivot_table(index="step", columns="rank", values="train_loss")
    assert losses.index.tolist() == list(range(12)) and list(losses.columns) == [0, 1]  # the Trainer counts from 0
    assert (losses[0] != losses[1]).any()  # each rank's own batches, its own loss
    held = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for name, (kind, numel, _) in held[0].items():
        assert kind == "DTensor" and [h[name][2] for h in held] == [numel // 2, numel // 2], name
    shards = sorted(p.name for p in (out / "last.ckpt").iterdir() if p.suffix == ".distcp")
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    assert run.health()["warnings"] == []
    assert_nothing_left(folder)
