"""Built-in and user tasks, precision, world-size change on resume, reading a finished run back."""

from __future__ import annotations

import pytest

import workbench
from workbench.cli import main
from workbench.config import JobConfig

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(180)]


def _cfg(tmp_path, task: dict, **train) -> JobConfig:
    return JobConfig.from_dict({"task": task, "train": {"micro_batch_size": 8, "max_steps": 12, **train},
                                "dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})


def test_char_lm_trains_with_bf16_autocast_and_reports_its_metric(tmp_path):
    run = workbench.submit(_cfg(tmp_path, {"name": "charlm"}, precision="bf16", eval_every_steps=12))
    assert run.wait(timeout=150).state == "finished", run.exception()
    frame = run.metrics()
    first, last = frame.groupby("step")["loss_reduced"].first().iloc[[0, -1]]
    assert last < first
    evals = run.events().query("event == 'eval'")
    assert "val_bits_per_char" in evals and evals["val_bits_per_char"].notna().all()


def test_a_factory_named_in_yaml_is_used(tmp_path):
    path = tmp_path / "job.yaml"
    _cfg(tmp_path, {"name": "tests.support.tasks_for_tests:slow", "options": {"delay_s": 0.0, "n_train": 512}}).to_yaml(path)
    run = workbench.submit(JobConfig.from_yaml(path))
    assert run.wait(timeout=120).state == "finished", run.exception()
    assert run.metrics().groupby("rank")["step"].max().tolist() == [12, 12]


def test_resume_on_fewer_ranks_says_how_batch_lr_and_warmup_change(tmp_path):
    cfg = _cfg(tmp_path, {"options": {"n_train": 1024}}, lr=1e-3, warmup_steps=10, max_steps=6, eval_every_steps=6)
    first = workbench.submit(cfg)
    assert first.wait(timeout=120).state == "finished"
    evaluated = first.result()["last_eval"]
    smaller = cfg.replace(dist__procs_per_node=1, train__micro_batch_size=4, train__max_steps=10,
                          train__keep_batch_on_resize=False)
    with pytest.warns(workbench.ResizeWarning, match="lr 0.002 -> 0.0005"):
        again = workbench.submit(smaller, run_dir=first.folder)
    assert again.wait(timeout=120).state == "finished", again.exception()
    message = again.events().query("event == 'rescale'")["message"].iloc[0]
    assert "world size 2 -> 1" in message and "effective batch 16 -> 4" in message
    assert "lr 0.002 -> 0.0005" in message and "warmup 20 -> 5" in message
    assert "train.keep_batch_on_resize is false" in message
    assert again.metrics().query("rank == 0")["step"].max() == 10
    assert again.result()["last_eval"] == evaluated and evaluated, "no eval in steps 7-10: step 6's is the last"
    # config.yaml keeps what the ranks trained with (the reference batch 8 pinned): run.config's own scaling
    # table gives the run's lr and warmup, not those of the config as passed (its own reference 4: 0.001, 10)
    start = again.events().query("event == 'start' and rank == 0").sort_values("time").iloc[-1]
    row = workbench.scaling_table(again.config, (1,)).iloc[0]
    assert (row["lr"], row["warmup_steps"]) == (pytest.approx(start["lr"]), start["warmup_steps"]) == (
        pytest.approx(0.0005), 5)


def test_a_finished_run_reads_back_completely(tmp_path, capsys):
    run = workbench.submit(_cfg(tmp_path, {"options": {"n_train": 512}}))
    assert run.wait(timeout=120).state == "finished"
    again = workbench.Run.load(run.folder)
    assert again.status().state == "finished"
    assert again.metrics().equals(run.metrics())
    assert again.result()["steps"] == 12
    assert again.logs(1) == run.logs(1)  # rank 1's own stdout and stderr, interleaved (logs/rank1.log)
    assert "submitit" in again.logs(1, "out") + again.logs(1, "err")  # submitit's per-task files, launcher lines too
    assert main(["show", str(run.folder)]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and "final_loss" in out
