"""Measured scaling: real short runs at world sizes 1 and 2 (submitit LocalExecutor, gloo, CPU)."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

import workbench
from tests.support.tasks_for_tests import slow_on
from workbench.cli import main
from workbench.config import JobConfig
from workbench.errors import ConfigError
from workbench.launch.scaling_bench import COLUMNS, bench_config, benchmark_scaling
from workbench.results.plots import plot_scaling

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300), pytest.mark.xdist_group("scaling_bench")]  # one bench fixture


def _cfg(root: Path) -> JobConfig:
    return JobConfig.from_dict({"task": {"options": {"n_train": 2048, "n_val": 64}},
                                "train": {"micro_batch_size": 32}, "launch": {"run_root": str(root)}})


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> pd.DataFrame:
    root = tmp_path_factory.mktemp("bench")
    return workbench.benchmark_scaling(_cfg(root), world_sizes=(2, 1), steps=20, warmup_steps=5)


def test_benchmark_measures_every_world_size(bench):
    assert list(bench.columns) == COLUMNS
    assert bench["world_size"].tolist() == [1, 2] and bench["effective_batch"].tolist() == [32, 64]
    assert (bench["samples_per_s"] > 0).all() and (bench["step_time_s"] > 0).all()
    assert bench["speedup"].iloc[0] == 1.0 and bench["efficiency"].iloc[0] == 1.0
    assert bench["efficiency"].iloc[1] == pytest.approx(bench["speedup"].iloc[1] / 2)
    assert bench["expected_speedup"].tolist() == [1.0, 1.8] and bench["ideal_speedup"].tolist() == [1.0, 2.0]
    assert (bench["steps"] == 15).all() and (bench["mem_mb_per_rank"] > 0).all()
    split = bench["data_time_s"] + bench["compute_s"] + bench["comm_wait_s"].fillna(0)
    assert split.tolist() == pytest.approx(bench["step_time_s"].tolist(), rel=0.05)
    folder = Path(bench.attrs["folder"])
    assert (folder / "scaling.csv").exists() and folder.parent.name.startswith("bench")


def test_benchmark_runs_are_short_and_reportable(bench):
    run = workbench.Run.load(bench["run_dir"].iloc[1])
    assert run.result()["steps"] == 20
    assert set(run.events()["event"]) & {"eval"} == set(), "the benchmark does not evaluate"
    rep = run.report()
    assert rep["world_size"] == 2 and rep["samples_per_s"] > 0
    assert "throughput:" in workbench.results.analysis.format_report(rep)


def test_plot_and_table_take_the_measurement(bench):
    fig = plot_scaling(bench)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    table = workbench.scaling_table(_cfg(Path("runs")), (1, 2, 4), measured=bench)
    assert table["speedup"].iloc[0] == 1.0 and table["speedup"].iloc[2] != table["speedup"].iloc[2]


def test_show_prints_the_report(bench, capsys):
    assert main(["show", bench["run_dir"].iloc[1]]) == 0
    out = capsys.readouterr().out
    assert "step time per rank" in out and "stragglers:" in out
    assert "memory (each rank's process, peak RSS): peak " in out  # on CPU mem_mb is the process's, not the step's
    assert "peak memory a rank over its first two steps: " in out  # the step's: tracked tensors


def test_cli_bench_scaling(tmp_path, capsys):
    config = tmp_path / "job.yaml"
    _cfg(tmp_path).to_yaml(config)
    assert main(["bench-scaling", str(config), "--world-sizes", "1", "--steps", "8", "--warmup-steps", "2",
                 "--set", "train.micro_batch_size=16"]) == 0
    out = capsys.readouterr().out
    assert "samples_per_s" in out and "expected_speedup" in out
    plots = list(tmp_path.glob("scaling-*/scaling.png"))
    assert len(plots) == 1 and str(plots[0]) in out


def test_bad_world_sizes_and_steps_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="world_sizes: 0 is not a positive"):
        benchmark_scaling(_cfg(tmp_path), world_sizes=(0, 2))
    with pytest.raises(ConfigError, match="warmup_steps < steps"):
        benchmark_scaling(_cfg(tmp_path), world_sizes=(1,), steps=5, warmup_steps=5)
    slurm = _cfg(tmp_path).replace(launch__executor="slurm", dist__procs_per_node=4)
    with pytest.raises(ConfigError, match="do not fill whole nodes"):
        bench_config(slurm, 6, 10)
    assert bench_config(slurm, 8, 10).dist.nodes == 2 and bench_config(slurm, 2, 10).dist.procs_per_node == 2
    assert not list(tmp_path.iterdir()), "nothing runs when the arguments are wrong"


def test_cli_bench_scaling_names_the_failing_rank(tmp_path, capsys):
    config = tmp_path / "job.yaml"
    _cfg(tmp_path).replace(task__name="tests.support.tasks_for_tests:failing_at",
                           task__options={"step_calls": 3, "rank": 0, "n_train": 2048, "n_val": 64}).to_yaml(config)
    assert main(["bench-scaling", str(config), "--world-sizes", "1,2", "--steps", "8", "--warmup-steps", "2"]) == 1
    err = capsys.readouterr().err
    assert "rank 0" in err and "injected failure on rank 0" in err
    assert [p.name for p in tmp_path.glob("scaling-*/*")] == ["world1"], "stops at the first failed run"


def test_report_of_a_real_run_flags_the_slow_rank(tmp_path):
    cfg = _cfg(tmp_path).replace(train__max_steps=15, train__checkpoint_every_steps=100)
    run = workbench.submit(cfg, task=functools.partial(slow_on, 1, 0.01, n_train=2048, n_val=64))
    assert run.wait(timeout=120).state == "finished", run.exception()
    rep = run.report()
    assert rep["stragglers"]["rank"].tolist() == [1], workbench.results.analysis.format_report(rep)
    if "comm_wait_s" in run.metrics():  # the fast rank spends its spare time waiting in the all-reduce
        waits = rep["breakdown"].set_index("rank")["comm_wait_s"]
        assert waits[0] > waits[1] + 0.005
