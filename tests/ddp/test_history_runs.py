"""Run history and comparison over run folders written as the ranks write them (no processes)."""
from __future__ import annotations

import pytest

import workbench
from tests.support.lifecycle import ENDLESS, wait_for_step
from workbench.config import JobConfig

pytestmark = pytest.mark.timeout(60)



@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_runs_widget_cancels_and_resumes_a_real_run(tmp_path):
    from workbench.ui import RunsView

    cfg = JobConfig.from_dict({"task": {"options": {"n_train": 256, "n_val": 32}},
                               "train": {"micro_batch_size": 16, **ENDLESS, "checkpoint_every_steps": 5},
                               "dist": {"procs_per_node": 2, "threads_per_rank": 1},
                               "launch": {"run_root": str(tmp_path)}})
    run = workbench.submit(cfg)  # only the Cancel button and resumed.cancel() end it
    wait_for_step(run, 12)
    view = RunsView(tmp_path)
    view.select.value = (str(run.folder),)
    view.buttons["Cancel"].click()
    assert f"cancelled {run.folder.name}" in view.message.value
    assert run.wait(timeout=120).state == "cancelled"
    stopped_at = int(run.metrics()["step"].max())
    kept = workbench.runs(tmp_path).iloc[0]  # ended: its row is kept in the folder (row.json)
    assert kept["status"] == "cancelled" and run.dir.row_cache.exists()
    view.buttons["Resume"].click()
    assert "resumed" in view.message.value, view.message.value
    resumed = view.dashboard.run
    wait_for_step(resumed, stopped_at + 1)  # it went on from its checkpoint, in the same folder
    assert resumed.folder == run.folder and len(workbench.runs(tmp_path)) == 1
    view.dashboard.stop()
    resumed.cancel()
    assert resumed.wait(timeout=120).state == "cancelled"
    again = workbench.runs(tmp_path).iloc[0]  # the kept row was for the first attempt's files: read again
    assert again["steps"] > kept["steps"] and again["end"] > kept["end"]



def _train_logging_train_loss(steps: int) -> None:  # as a notebook cell would define it: pickled by value
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import workbench

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(torch.distributed.get_rank())
    for step in range(1, steps + 1):
        x = torch.randn(8, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        workbench.log(step=step, train_loss=loss)
        if step % 4 == 0:
            workbench.log(step=step, val_loss=loss.item() / 2)  # merged into the step's record


@pytest.mark.ddp
@pytest.mark.timeout(180)
def test_compare_and_runs_show_the_train_loss_a_function_run_logged(tmp_path):
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2, "threads_per_rank": 1},
                               "launch": {"run_root": str(tmp_path)}})
    run = workbench.submit_fn(_train_logging_train_loss, 12, cfg=cfg)
    assert run.wait(timeout=150).state == "finished", run.exception()
    frame = run.metrics()
    assert "train_loss" in frame and "loss" not in frame
    fig = workbench.compare([run], x="step")
    assert fig.axes[0].get_title(loc="left") == "training loss (reduced) · train_loss"
    (line,) = [ln for ln in fig.axes[0].lines if ln.get_label() == run.folder.name]
    mean = frame.groupby("step")["train_loss"].mean()
    assert line.full_x.tolist() == list(range(1, 13)) and line.full_raw.tolist() == pytest.approx(mean.tolist())
    assert fig.axes[1].get_title(loc="left") == "val_loss"
    (val,) = fig.axes[1].lines
    assert val.get_xdata().tolist() == [4, 8, 12]
    row = workbench.runs(tmp_path).iloc[0]
    assert row["loss_metric"] == "train_loss" and row["last_loss"] == pytest.approx(mean.iloc[-1])
