"""An engine run's ranks are forked from a local controller that imported torch once
(workbench.engine.forked) and train exactly as fresh processes do; a script's forked rank does what
a fresh one does, and one given a variable torch reads as it loads is fresh; WORKBENCH_FORK=0
starts every rank fresh; a controller stopped while it
imports torch starts no rank, and the run reads cancelled; a session's later controllers are forked
from its warm starters (workbench.launch.starter: one for the engine's runs, one for user code) while
they match, and the starters leave with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import workbench
from tests.support import REPO, SCRIPTS
from tests.support.lifecycle import run_processes
from tests.support.runs import local_cfg
from workbench.proctree import Proc
from workbench.runfolder.layout import RunDir, read_json

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]

SCRIPT = SCRIPTS / "train_ddp.py"


def _forked(run: workbench.Run) -> list[bool]:
    folder = RunDir(run.folder)
    return [bool((read_json(folder.procs(rank)) or {}).get("forked")) for rank in (0, 1)]


def test_forked_ranks_train_the_same_losses_as_fresh_ones(tmp_path, monkeypatch):
    cfg = local_cfg(tmp_path, max_steps=12, checkpoint_every_steps=None)
    warm = workbench.submit(cfg)
    assert warm.wait(timeout=180).state == "finished", warm.exception()
    monkeypatch.setenv("WORKBENCH_FORK", "0")
    fresh = workbench.submit(cfg)
    assert fresh.wait(timeout=180).state == "finished", fresh.exception()
    assert _forked(warm) == [True, True] and _forked(fresh) == [False, False]
    losses = [run.metrics().sort_values(["step", "rank"])["loss"].tolist() for run in (warm, fresh)]
    assert losses[0] == losses[1] and len(losses[0]) == 24  # bit for bit: same seeds, same data, same steps
    assert not run_processes(warm.folder) and not run_processes(fresh.folder)


FACTS = r'''
import atexit, json, os, sys, threading, time
dynamo_at_start = "torch._dynamo" in sys.modules  # never imported before a fork for user code
import torch
import torch.distributed as dist

out = os.path.join(sys.argv[1], f"rank{os.environ['RANK']}")
dist.init_process_group("gloo")
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
log = open(out + ".log", "w")  # noqa: SIM115 - never flushed nor closed, as scripts leave them
log.write(json.dumps({"name": __name__, "argv": sys.argv[2:], "path0": sys.path[0], "total": total.item(),
                      "world": dist.get_world_size(), "main_file": sys.modules["__main__"].__file__,
                      "threads": torch.get_num_threads(), "seed": torch.initial_seed(),
                      "dynamo_at_start": dynamo_at_start}) + "\n")
dist.destroy_process_group()

def late():
    time.sleep(0.3)
    with open(out + ".thread", "w") as fh:
        fh.write("done")

threading.Thread(target=late).start()  # not a daemon: the rank's end waits for it
atexit.register(lambda: print("atexit sees the thread's file:", os.path.exists(out + ".thread")))
print("unflushed last line")
'''


def test_a_scripts_forked_ranks_do_what_fresh_ones_do_and_a_load_time_variable_starts_them_fresh(tmp_path,
                                                                                                   monkeypatch):
    script = tmp_path / "code" / "facts.py"
    script.parent.mkdir()
    script.write_text(FACTS)
    runs, facts = {}, {}
    for how in ("forked", "fresh", "load-time env"):
        out = tmp_path / how
        out.mkdir()
        env = {"TORCH_SHOW_CPP_STACKTRACES": "1"} if how == "load-time env" else {}
        monkeypatch.setenv("WORKBENCH_FORK", "0" if how == "fresh" else "1")
        run = runs[how] = workbench.submit_script(script, [str(out), "--flag"], local_cfg(tmp_path), nproc=2,
                                                  env=env)
        assert run.wait(timeout=180).state == "finished", run.exception()
        facts[how] = []
        for rank in (0, 1):
            found = json.loads((out / f"rank{rank}.log").read_text())
            assert found.pop("seed") not in [f.get("seed") for f in facts[how]]  # seeded anew per rank
            facts[how].append(found)
            assert run.logs(rank).splitlines()[-2:] == ["unflushed last line", "atexit sees the thread's file: True"]
    assert _forked(runs["forked"]) == [True, True]
    assert _forked(runs["fresh"]) == [False, False] and _forked(runs["load-time env"]) == [False, False]
    assert facts["forked"] == facts["fresh"] == facts["load-time env"]
    assert facts["forked"][0] == {"name": "__main__", "argv": ["--flag"], "path0": str(script.parent), "total": 3.0,
                                  "world": 2, "main_file": str(script), "threads": 1, "dynamo_at_start": False}
    assert not any(run_processes(run.folder) for run in runs.values())


def _catches(pid: int, sig: int) -> bool:
    """The process has a handler for `sig` (/proc/PID/status SigCgt)."""
    with open(f"/proc/{pid}/status") as fh:
        caught = next(int(line.split()[1], 16) for line in fh if line.startswith("SigCgt:"))
    return bool(caught >> (sig - 1) & 1)


def test_a_controller_stopped_while_it_imports_torch_starts_no_rank_and_the_run_reads_cancelled(tmp_path):
    run = workbench.submit(local_cfg(tmp_path, max_steps=12, checkpoint_every_steps=None))
    controller = Proc.from_dict((read_json(RunDir(run.folder).meta) or {}).get("controller"))
    assert controller is not None
    deadline = time.monotonic() + 30
    while not _catches(controller.pid, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.01)  # its stop handler is in place: it is importing torch now (seconds)
    os.kill(controller.pid, signal.SIGTERM)  # as `kill PID` from a terminal
    assert run.wait(timeout=120).state == "cancelled"
    assert not any(RunDir(run.folder).procs(rank).exists() for rank in (0, 1))  # no agent started
    assert not run_processes(run.folder)


def test_a_controller_that_cannot_preload_torch_says_so_and_the_ranks_report_the_import_error(tmp_path, monkeypatch):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "sympy.py").write_text("raise ImportError('a sympy.py of the user shadows the package')\n")
    monkeypatch.setenv("PYTHONPATH", f"{shadow}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    run = workbench.submit(local_cfg(tmp_path, max_steps=4, checkpoint_every_steps=None))
    assert run.wait(timeout=180).state == "failed"
    log = RunDir(run.folder).controller_log.read_text()
    assert "not preloading torch (ImportError: a sympy.py of the user shadows the package)" in log, log
    assert "shadows the package" in str(run.exception())
    assert not run_processes(run.folder)


SESSION = r'''
import functools, json, os, signal, sys, threading, time
import workbench
from tests.support.tasks_for_tests import gated
from workbench.config import JobConfig
from workbench.launch import starter
from workbench.proctree import command_line
from workbench.runfolder.layout import RunDir, read_json

cfg = JobConfig.from_dict({"task": {"name": "synthetic", "options": {"n_train": 512, "n_val": 64}},
                           "train": {"max_steps": 6, "checkpoint_every_steps": None},
                           "dist": {"procs_per_node": 2}, "launch": {"run_root": sys.argv[1]}})
facts = []

def one(note):
    gate = os.path.join(os.getcwd(), "gate-" + str(len(facts)))
    run = workbench.submit(cfg, task=functools.partial(gated, gate, 3, n_train=512, n_val=64))
    process = run.job._process
    shown = command_line(process.pid)  # while the ranks hold before step 4: a 6-step run had ended here once
    open(gate, "w").close()
    state = run.wait(timeout=120).state
    losses = run.metrics().sort_values(["step", "rank"])["loss"].tolist()
    forked = [bool((read_json(RunDir(run.folder).procs(r)) or {}).get("forked")) for r in (0, 1)]
    facts.append({"note": note, "state": state, "controller": type(process).__name__, "shown": shown,
                  "folder": str(run.folder), "losses": losses, "forked": forked, "code": process.poll(),
                  "starter": process.starter.process.pid if hasattr(process, "starter") else None})

one("first")                       # a fresh controller
submitter = threading.Thread(target=one, args=("second",))  # as a sweep's driver or the form's submit
submitter.start()
submitter.join()                   # the starter starts, outlives the thread; this run waited for its imports
one("third")                       # forked from the starter
import torch._dynamo               # as a cell that compiles: sets TORCHINDUCTOR_CACHE_DIR, as the starter's import did
one("after torch._dynamo")         # still the starter
os.environ["UNREAD_SETTING"] = "1"   # no import of the starter read it, nor does torch as it loads
one("unread setting")              # still the starter: the controller gets it as every run's variable
os.environ["TORCH_SOME_SETTING"] = "1"  # one torch may read as it loads
one("other environment")           # a fresh controller: the starter imported without it
del os.environ["TORCH_SOME_SETTING"]
one("environment back")            # the starter again
original_starter = starter._starters[True].process.pid
os.environ["TORCH_SOME_SETTING"] = "2"  # set for good, as a cell does
one("set for good")                # a fresh controller
one("set for good, again")         # the starter is replaced by one with this environment, and used
one("set for good, third")         # forked from the new starter
first_starter = starter._starters[True].process.pid
os.kill(first_starter, signal.SIGKILL)
starter._starters[True].process.wait()
one("starter killed")              # a new starter, and this run forked from it
second_starter = starter._starters[True]
starter.code_stamp = lambda: 0.0   # workbench's files changed on disk since the starter imported them
one("code changed")                # that starter is closed; this run forked from a new one
second_starter.process.wait(30)    # it left when its socket closed
third_starter = starter._starters[True].process.pid
slow = starter.Starter(dict(os.environ))  # one that never gets ready (stopped while it imports)
os.kill(slow.process.pid, signal.SIGSTOP)
began = time.monotonic()
waited = [slow.usable(dict(os.environ), wait_s=1.0), round(time.monotonic() - began, 1)]
os.kill(slow.process.pid, signal.SIGKILL)
slow.process.wait()
waited.append(slow.usable(dict(os.environ), wait_s=60.0))  # dead: no wait
slow.close()

script = os.path.join(os.getcwd(), "ddp_script.py")  # user code: the other kind of starter
with open(script, "w") as fh:
    fh.write("import sys\nprint('dynamo at start:', 'torch._dynamo' in sys.modules, flush=True)\n"
             + open(sys.argv[2]).read())
scripts = []

def one_script(note):
    run = workbench.submit_script(script, ["--steps", "4"], cfg, nproc=2)
    process = run.job._process
    state = run.wait(timeout=120).state
    scripts.append({"note": note, "state": state, "controller": type(process).__name__, "code": process.poll(),
                    "folder": str(run.folder), "losses": run.metrics().sort_values(["step", "rank"])["loss"].tolist(),
                    "forked": [bool((read_json(RunDir(run.folder).procs(r)) or {}).get("forked")) for r in (0, 1)],
                    "dynamo": [line for r in (0, 1) for line in run.logs(r).splitlines() if "dynamo" in line]})

one_script("first script")         # a fresh controller (the engine's starter imported torch._dynamo)
one_script("second script")        # the user code's starter starts; this run waited for it
one_script("third script")         # forked from the user code's starter
print(json.dumps({"runs": facts, "scripts": scripts, "waited": waited,
                  "starters": [original_starter, first_starter, second_starter.process.pid, third_starter,
                               slow.process.pid, starter._starters[False].process.pid]}))
'''


def test_a_session_forks_its_later_controllers_from_one_warm_starter_that_leaves_with_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", SESSION, str(tmp_path / "runs"), str(SCRIPT)], capture_output=True,
                          text=True, timeout=220, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    runs = {r["note"]: r for r in result["runs"]}
    assert [r["state"] for r in result["runs"]] == ["finished"] * 12
    assert runs["unread setting"]["starter"] == runs["third"]["starter"] == runs["environment back"]["starter"]
    kinds = {note: r["controller"] for note, r in runs.items()}
    fresh = {"first", "other environment", "set for good"}  # every other run forked from a starter
    assert kinds == {note: "Popen" if note in fresh else "StartedController" for note in runs}
    assert len(set(result["starters"])) == 6  # replaced after another environment, a kill, a code change
    # a starter that never gets ready: the run waits its bound, then starts fresh; a dead one: no wait
    assert result["waited"][0] is False and result["waited"][1] >= 0.9 and result["waited"][2] is False
    for r in result["runs"]:
        assert r["forked"] == [True, True] and r["code"] == 0
        assert r["losses"] == runs["first"]["losses"]  # the same seeds and data: bit for bit
        # a forked controller shows the command line a fresh one has (workbench.launch.ours checks it)
        assert r["shown"][1:] == ["-m", "workbench.launch.local_controller", str(Path(r["folder"]) / "logs")]
    # user code's controllers: their own starter, which never imported torch._dynamo before a fork
    scripts = {r["note"]: r for r in result["scripts"]}
    assert {note: r["controller"] for note, r in scripts.items()} == {
        "first script": "Popen", "second script": "StartedController", "third script": "StartedController"}
    for r in result["scripts"]:
        assert r["state"] == "finished" and r["code"] == 0 and r["forked"] == [True, True]
        assert r["dynamo"] == ["dynamo at start: False"] * 2
        assert r["losses"] == scripts["first script"]["losses"] and len(r["losses"]) == 8
    deadline = time.monotonic() + 10
    while any(Proc.of(pid) for pid in result["starters"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in result["starters"] if Proc.of(pid)]  # gone with the session
    for r in result["runs"] + result["scripts"]:
        assert not run_processes(Path(r["folder"]))
