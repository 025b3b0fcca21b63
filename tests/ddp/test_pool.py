"""Warm ranks (workbench.Pool), for real: a local 2-rank gloo pool runs engine, function and script
jobs back to back, each in its own run folder with the same results as a cold run; a job that
raises, hangs or is cancelled takes its workers down and the pool serves the next job with fresh
ones; memory returns to the baseline; closing, the context manager, the idle timeout and a killed
controller leave no process behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import workbench
from tests.support.lifecycle import assert_nothing_left, cfg, run_processes, wait_for_step, wait_until
from workbench.engine.warm import rss_mb
from workbench.errors import ConfigError, SubmitError
from workbench.proctree import Proc, command_line
from workbench.runfolder.layout import read_json

pytestmark = [pytest.mark.ddp]

MEMORY_SLACK_MB = 50


def _cfg(tmp_path: Path, **train):
    return cfg(tmp_path, **{"max_steps": 12, "checkpoint_every_steps": None, **train})


def _workers(pool) -> list[Proc]:
    return [p for p in pool.dir.recorded("worker") if p.alive()]


def _baseline(pool) -> dict[int, float]:
    return {r: read_json(pool.dir.ready(r))["rss_mb"] for r in range(2)}


def _check_memory(pool, run) -> list[float]:
    """Every rank's memory after the job (its done record, and /proc now) within the slack of the
    baseline its warm worker recorded once up."""
    base = _baseline(pool)
    number = read_json(run.dir.meta)["pool"]["job"]
    after = [read_json(pool.dir.done(number, r))["rss_mb"] for r in range(2)]
    now = sorted(rss_mb(p.pid) for p in _workers(pool))
    growth = [a - base[r] for r, a in enumerate(after)]
    print(f"\n[pool memory] baseline {base} MB, after job {number}: {after} MB (now {now}), growth {growth} MB")
    assert all(g < MEMORY_SLACK_MB for g in growth), (base, after)
    return growth


def _final_losses(run) -> list[float]:
    frame = run.metrics()
    return frame.sort_values("step").groupby("rank")["loss"].last().tolist()


@pytest.mark.timeout(300)
def test_an_fsdp2_job_runs_in_the_warm_pool_and_a_ddp_job_after_it_trains_the_same_losses(pool, tmp_path):
    sharded = pool.submit(_cfg(tmp_path, lr=0.2, dist={"strategy": "fsdp2"}))
    replicated = pool.submit(_cfg(tmp_path, lr=0.2))  # the same ranks, after the fsdp2 job
    for run in (sharded, replicated):
        assert run.wait(timeout=150).state == "finished", run.exception()
    assert sharded.events().query("event == 'start'")["strategy"].tolist() == ["fsdp2", "fsdp2"]
    assert _final_losses(sharded) == pytest.approx(_final_losses(replicated), rel=1e-6)


@pytest.mark.timeout(300)
def test_engine_jobs_back_to_back_match_cold_runs(pool, tmp_path):
    runs = [pool.submit(_cfg(tmp_path, lr=lr)) for lr in (0.05, 0.2)]  # the second queues behind the first
    for run in runs:
        assert run.wait(timeout=120).state == "finished", run.exception()
        assert sorted(run.metrics()["rank"].unique()) == [0, 1]
        assert run.metrics().groupby("rank")["step"].max().tolist() == [12, 12]
    assert runs[0].folder != runs[1].folder
    assert _final_losses(runs[0]) != _final_losses(runs[1]), "different lr, different losses"
    cold = workbench.submit(_cfg(tmp_path, lr=0.2))
    assert cold.wait(timeout=180).state == "finished", cold.exception()
    assert _final_losses(runs[1]) == pytest.approx(_final_losses(cold), rel=1e-5), "fresh seeds, model, optimizer"
    _check_memory(pool, runs[1])
    # the warm workers were forked from their agents (whose controller imported torch, not
    # torch._dynamo: a pool runs user code), and show the command line a fresh one has
    assert [read_json(pool.dir.procs(r))["forked"] for r in range(2)] == [True, True]
    for worker in _workers(pool):
        assert command_line(worker.pid)[1:] == ["-m", "workbench.engine.warm", str(pool.dir.root)]
    again = workbench.Run.load(runs[1].folder)  # a pool job's folder reattaches like any other
    assert again.status().state == "finished" and again.job.done()
    assert_nothing_left(cold.folder)


def _initial_seed():
    import torch

    return torch.initial_seed()


@pytest.mark.timeout(200)
def test_functions_run_in_the_pool_and_errors_name_the_field(pool, tmp_path):
    def reduce_rank(scale):
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)  # all ranks: the pool's group
        return scale * value.item()

    run = pool.submit_fn(reduce_rank, 2.0)
    assert run.results() if run.wait(timeout=60).state == "finished" else run.exception()
    assert run.results() == [6.0, 6.0]
    seeds = []  # unseeded torch in a job, as in a fresh process: a seed of its own on each rank, each job
    for _ in range(2):
        probe = pool.submit_fn(_initial_seed)
        assert probe.wait(timeout=60).state == "finished", probe.exception()
        seeds += probe.results()
    assert len(set(seeds)) == 4, seeds  # every rank and job had torch's default seed, 67280421310721
    _check_memory(pool, run)
    with pytest.raises(ConfigError, match=r"^dist: .* 1 = 1 ranks, the pool .* has 2.*dist.procs_per_node"):
        pool.submit_fn(reduce_rank, 1.0, cfg=_cfg(tmp_path, dist={"procs_per_node": 1}))
    with pytest.raises(ConfigError, match=r"dist.backend: this job asks nccl.*set dist.backend=auto"):
        pool.submit(_cfg(tmp_path, dist={"backend": "nccl"}))
    assert not list((tmp_path / "runs").glob("*")), "nothing was made for a refused job"


def _raise_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("boom on rank one")
    dist.barrier()  # rank 0 waits here for a rank that never comes


def _ranks_sum():
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


@pytest.mark.timeout(200)
def test_a_job_that_raises_fails_and_the_pool_respawns(pool):
    before = {p.pid for p in _workers(pool)}
    run = pool.submit_fn(_raise_on_rank_one)
    assert run.wait(timeout=60).state == "failed"
    failure = run.exception()
    assert failure.rank == 1 and failure.type == "ValueError" and "boom on rank one" in failure.message
    assert "_raise_on_rank_one" in failure.traceback
    following = pool.submit_fn(_ranks_sum)
    assert following.wait(timeout=90).state == "finished", following.exception()
    assert following.results() == [2.0, 2.0]
    after = {p.pid for p in _workers(pool)}
    assert after and not after & before, "the workers of a failed job are never used again"
    assert not any(Proc(pid).alive() for pid in before)


def _steps_slowly():
    import time

    import workbench

    for step in range(1, 100_000):
        workbench.log(step=step, loss=1.0 / step)
        time.sleep(0.05)


@pytest.mark.timeout(200)
def test_cancelling_a_job_keeps_the_pool(pool):
    before = {p.pid for p in _workers(pool)}
    run = pool.submit_fn(_steps_slowly)
    wait_for_step(run, 3, timeout=60)
    run.cancel()
    assert run.status().state == "cancelled"
    assert pool.alive()
    following = pool.submit_fn(_ranks_sum)
    assert following.wait(timeout=90).state == "finished", following.exception()
    assert not {p.pid for p in _workers(pool)} & before


@pytest.mark.timeout(300)
def test_a_hung_job_is_found_and_the_pool_respawns(pool):
    run = pool.submit_fn(_steps_slowly, cfg=pool.cfg.replace(dist__lost_after_s=10))  # lost after 10 s
    wait_for_step(run, 3, timeout=60)
    stopped = read_json(run.dir.status(1))["pid"]
    os.kill(stopped, signal.SIGSTOP)  # a hung rank: its neighbour names it lost, its agent kills it
    status = run.wait(timeout=200)
    assert status.state == "failed"
    failure = run.exception()
    assert failure.rank == 1 and failure.type == "Lost", failure
    assert not Proc(stopped).alive()
    following = pool.submit_fn(_ranks_sum)
    assert following.wait(timeout=90).state == "finished", following.exception()


@pytest.mark.timeout(120)
def test_run_cell_keeps_a_namespace_and_tags_errors(pool):
    first = pool.run_cell("x = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\nprint('rank', rank)\nx")
    assert [o["stdout"] for o in first] == ["rank 0\n", "rank 1\n"]
    assert [o["result"] for o in first] == ["tensor([3.])", "tensor([3.])"]
    second = pool.run_cell("if rank == 1:\n    raise KeyError('only here')\nx.item() * 2")
    assert second[0]["outcome"] == "finished" and second[0]["result"] == "6.0"
    assert second[1]["outcome"] == "raised" and "KeyError: 'only here'" in second[1]["error"]
    stuck = pool.run_cell("if rank == 0:\n    raise RuntimeError('before the collective')\ndist.barrier()")
    assert stuck[0]["outcome"] == "raised" and stuck[1]["outcome"] in ("cancelled", "failed")
    after = pool.run_cell("rank")  # restarted: a fresh namespace, the pool serves on
    assert [o.get("result") for o in after] == ["0", "1"], after


@pytest.mark.timeout(180)
def test_closing_leaves_nothing(tmp_path):
    with workbench.Pool(_cfg(tmp_path)) as pool:
        pool.wait_ready(120)
        run = pool.submit_fn(_steps_slowly)  # still running at close: it ends with the pool
        wait_for_step(run, 2, timeout=60)
    assert not run_processes(pool.dir.root)
    assert run.job.done() and run.status().done
    assert run.status().state == "cancelled", run.exception()  # was: failed, with no reason given
    assert "the pool closed while it ran" in run.meta["cancelled_by"]
    with pytest.raises(SubmitError, match="is closed"):
        pool.submit_fn(_ranks_sum)


@pytest.mark.timeout(180)
def test_the_idle_timeout_ends_the_pool(tmp_path):
    pool = workbench.Pool(_cfg(tmp_path), idle_timeout_s=2).wait_ready(120)
    wait_until(lambda: not run_processes(pool.dir.root), 60, "the idle pool ended")
    assert "idle" in read_json(pool.dir.meta)["closed_by"]
    assert not pool.alive()
    pool.close()


@pytest.mark.timeout(180)
def test_a_killed_controller_leaves_nothing(tmp_path):
    pool = workbench.Pool(_cfg(tmp_path)).wait_ready(120)
    controller = Proc.from_dict(read_json(pool.dir.meta)["controller"])
    os.kill(controller.pid, signal.SIGKILL)
    wait_until(lambda: not run_processes(pool.dir.root), 60, "the pool's ranks ended with their controller")
    pool.job.done()  # reap it
    assert not pool.alive()
    pool.close()


SCRIPT = """
import os, sys
import torch
import torch.distributed as dist
import workbench

dist.init_process_group("gloo")  # as under torchrun: the pool's group is up, this finds it
value = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(value)
for step in range(1, 4):
    workbench.log(step=step, loss=value.item() / step)
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "env", os.environ.get("POOL_TEST"))
dist.destroy_process_group()  # leaves the pool's group up for the next job
"""


@pytest.mark.timeout(200)
def test_scripts_run_in_the_pool(pool, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = pool.submit_script(script, ["--lr", "0.1"], cwd=tmp_path, env={"POOL_TEST": "yes"})
    assert run.wait(timeout=90).state == "finished", run.exception()
    assert run.metrics().groupby("rank")["loss"].first().tolist() == [3.0, 3.0]
    assert "argv ['--lr', '0.1'] cwd " + tmp_path.name + " env yes" in run.logs(1, "out")
    following = pool.submit_fn(_ranks_sum)  # the group is still up, cwd and env are the pool's again
    assert following.wait(timeout=90).state == "finished", following.exception()
    assert pool.run_cell("import os\nos.environ.get('POOL_TEST'), os.getcwd() == %r" % str(tmp_path))[0]["result"] \
        == "(None, False)"


@pytest.mark.timeout(180)
def test_the_cli_lists_and_closes_pools(tmp_path):
    import subprocess

    from tests.support.lifecycle import CLI

    pool = workbench.Pool(_cfg(tmp_path), name="cli-pool").wait_ready(120)
    root = str(tmp_path / "runs")
    listed = subprocess.run([*CLI, "pools", "--run-root", root], capture_output=True, text=True, timeout=60)
    line = next(line for line in listed.stdout.splitlines() if line.startswith("cli-pool"))
    assert line.split()[1:5] == ["local", str(pool.job.job_id), "2", "open"], listed.stdout
    closed = subprocess.run([*CLI, "pools", "--run-root", root, "--close", "cli-pool"], capture_output=True,
                            text=True, timeout=60)
    assert closed.returncode == 0 and "pool cli-pool closed" in closed.stdout, closed.stderr
    assert not pool.alive() and not run_processes(pool.dir.root)
    again = subprocess.run([*CLI, "pools", "--run-root", root], capture_output=True, text=True, timeout=60)
    assert "no open pools" in again.stdout
    pool.job.done()  # reap the controller
