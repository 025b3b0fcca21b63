"""The terminal as a new user meets it: --set and the shortcut flags validated once, `workbench check`
importing a named factory (and saying so), progress lines at an even cadence with every rank at the
same step, numbers for people, a next-steps line, and SLURM's own words when it refuses."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from tests.support import REPO
from workbench.cli import main
from workbench.cli.commands import load_config
from workbench.cli.parser import _parser
from workbench.cli.printing import ProgressPrinter, _num, cadence, next_steps, summary_line, table_for_people
from workbench.config import JobConfig
from workbench.errors import ConfigError
from workbench.launch.executors import slurm_failure
from workbench.launch.run import Run
from workbench.runfolder.layout import RunDir
from workbench.runfolder.writer import JsonlWriter

pytestmark = pytest.mark.timeout(60)

QUICKSTART = str(REPO / "examples" / "quickstart.yaml")


def _load(*argv: str) -> JobConfig:
    return load_config(_parser().parse_args(list(argv)))


def test_the_shortcut_flags_and_set_are_applied_together_then_validated_once():
    cfg = _load("run", QUICKSTART, "--executor", "slurm", "--set", "dist.nodes=2")
    assert (cfg.launch.executor, cfg.dist.nodes) == ("slurm", 2)
    assert _load("run", QUICKSTART, "--set", "dist.procs_per_node=4", "--nproc", "3").dist.procs_per_node == 3
    with pytest.raises(ConfigError) as caught:  # still one line when the combination is wrong
        _load("run", QUICKSTART, "--set", "dist.nodes=2")
    assert caught.value.problems == ["dist.nodes: local runs use one machine, got 2; set dist.nodes: 1 or "
                                     "launch.executor: slurm"]


def test_a_yaml_that_only_the_flags_make_valid_is_judged_with_them(tmp_path):
    path = tmp_path / "two_nodes.yaml"
    path.write_text("dist: {nodes: 2, procs_per_node: 1}\n")
    assert _load("run", str(path), "--executor", "slurm").dist.nodes == 2


def test_check_imports_a_named_factory_says_so_and_names_a_missing_attribute(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("task: {name: 'json:no_such_factory'}\n")
    assert main(["check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "[workbench] importing json to check task.name (this runs the module's code)" in out
    assert err.splitlines() == ["workbench: task.name: json:no_such_factory: module json has no no_such_factory; "
                                "check the name after the colon"]
    assert main(["check", QUICKSTART]) == 0
    out, _ = capsys.readouterr()
    said = out.splitlines()  # a built-in task imports nothing; its memory is traced, and it fits
    assert len(said) == 2 and said[1] == "config OK", said
    assert said[0].startswith("memory: ") and " MiB a rank at train.micro_batch_size " in said[0], said


def test_the_cadence_is_a_round_number_of_steps_giving_about_20_lines():
    assert [cadence(n) for n in (None, 0, 10, 20, 30, 192, 1000, 12_000)] == [None, None, 1, 1, 2, 10, 50, 1000]


def _write(run: RunDir, rank: int, steps: range) -> None:
    writer = JsonlWriter(run.metrics(rank))
    for step in steps:
        writer.write({"rank": rank, "step": step, "time": time.time(), "loss": 1.0 / step + rank / 100,
                      "loss_reduced": 1.0 / step, "lr": 1e-3, "samples_per_s": 13407.8849, "step_time_s": 0.0123,
                      "comm_wait_s": 0.00615, "mem_mb": 312.2})
    writer.close()


def test_progress_lines_come_every_n_steps_with_every_rank_at_that_step(tmp_path, capsys):
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})
    run_dir = RunDir(tmp_path / "run").prepare(cfg, "local")
    events = JsonlWriter(run_dir.events(0))
    events.write({"event": "start", "rank": 0, "time": time.time(), "world_size": 2, "device": "cpu",
                  "effective_batch": 64, "lr": 1e-3, "warmup_steps": 5, "steps_per_epoch": 30, "total_steps": 60})
    events.close()
    _write(run_dir, 0, range(1, 17))
    _write(run_dir, 1, range(1, 12))  # rank 1 is behind: a line waits for both
    run, printer = Run(run_dir.root), ProgressPrinter()

    def poll(final: bool = False) -> list[str]:
        run.metric_frames.poll()
        printer(run, final=final)
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("  step")]

    assert poll() == ["  step  5/60 | loss 0.2 (rank 0 0.2, rank 1 0.21) | lr 0.001 | 26,816 samples/s | "
                      "12.3 ms/step (50% comm) | 312 MiB",
                      "  step 10/60 | loss 0.1 (rank 0 0.1, rank 1 0.11) | lr 0.001 | 26,816 samples/s | "
                      "12.3 ms/step (50% comm) | 312 MiB"]
    assert poll() == []
    _write(run_dir, 1, range(12, 27))
    _write(run_dir, 0, range(17, 24))
    assert [line.split(" |")[0] for line in poll()] == ["  step 15/60", "  step 20/60"]
    assert [line.split(" |")[0] for line in poll(final=True)] == ["  step 23/60"]  # the last step all ranks reached


def test_a_script_without_a_known_total_gets_a_line_every_few_seconds(tmp_path):
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})
    run_dir = RunDir(tmp_path / "run").prepare(cfg, "local")
    writer = JsonlWriter(run_dir.metrics(0))  # a script that logs on rank 0 only
    for step in range(1, 8):
        writer.write({"rank": 0, "step": step, "time": time.time(), "loss": 0.5})
    writer.close()
    run, printer = Run(run_dir.root), ProgressPrinter()
    run.metric_frames.poll()
    assert printer.due(run, 100.0, final=False) == []  # waits a little for the other rank
    assert printer.due(run, 100.0 + printer.script_every_s, final=False) == [7]


def test_numbers_and_tables_are_for_people():
    assert [_num(v) for v in (13407.8849, 0.034512, 2.0, 192, 3.5e-05, "x")] == ["13,408", "0.03451", "2", "192",
                                                                                 "3.5e-05", "x"]
    table = pd.DataFrame({"step": [192, 192], "final_loss": [0.0323812, 0.0396], "step_time_s": [0.00861, 0.0087],
                          "samples_per_s": [13407.884900, 11513.2], "mem_mb": [315.9, 315.0]},
                         index=pd.Index([0, 1], name="rank"))
    text = table_for_people(table)
    assert "13,408" in text and "13407.884900" not in text and "0.03238" in text and "316" in text, text
    status = pd.DataFrame({"rank": [0], "state": ["finished"], "heartbeat_age_s": [3199.91234], "pid": [25724]})
    assert table_for_people(status, index=False).splitlines()[1].split() == ["0", "finished", "3200", "25724"]
    summary = {"steps": 192, "stop_reason": "max_steps", "last_eval": {"val_loss": 0.07401307680993341}}
    assert summary_line(summary) == "[workbench] summary: 192 steps (max_steps), val_loss 0.07401 (last evaluation)"
    script = {"status": "finished", "script": "train.py", "steps": None, "output_lines": 32}  # logged no step
    assert summary_line(script) == "[workbench] summary: finished (no step logged)"


def test_the_next_steps_line_names_the_folder_as_this_shell_can(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = next_steps(tmp_path / "runs" / "quickstart-1")
    assert line == ("[workbench] next: `workbench show runs/quickstart-1`, or in a notebook "  # whole: a kernel
                    f"`workbench.Run.load('{tmp_path.resolve()}/runs/quickstart-1').dashboard()`")  # starts elsewhere
    assert "show /" in next_steps(Path("/elsewhere/run"))


def test_slurm_refusals_are_one_line_in_slurms_own_words():
    unreachable = "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n"
    assert slurm_failure("sbatch", unreachable, 1) == (
        "sbatch failed (exit 1): sbatch: error: Batch job submission failed: Unable to contact slurm controller "
        "(connect failure); the SLURM controller does not answer: check that `sinfo` works here, or ask your "
        "cluster's admins")
    rejected = "sbatch: error: Batch job submission failed: Node count specification invalid"
    line = slurm_failure("sbatch", rejected, 1)
    assert "Node count specification invalid" in line and "launch.slurm" in line and "\n" not in line


def test_the_run_prints_the_lr_as_the_table_does(tmp_path, capsys):
    """`workbench run` printed 0.00283 where `workbench table` printed 0.002828 for the same lr (issue 29)."""
    from types import SimpleNamespace

    from workbench.cli import main
    from workbench.cli.printing import print_start

    start = {"world_size": 2, "device": "cpu", "effective_batch": 128, "lr": 0.002 * 2 ** 0.5, "warmup_steps": 28,
             "steps_per_epoch": 32, "total_steps": 60}
    run = SimpleNamespace(event_summary=lambda: SimpleNamespace(start=start))
    assert print_start(run)
    said = capsys.readouterr().out
    assert main(["table", str(REPO / "examples" / "quickstart.yaml"), "--world-sizes", "2"]) == 0
    table = capsys.readouterr().out
    assert "peak lr 0.002828 after 28 warmup steps" in said and " 0.002828 " in table, (said, table)
