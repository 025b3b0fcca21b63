"""A warm pool's worker (workbench.Pool): one rank that stays up between jobs.

    python -m workbench.engine.warm POOL_DIR

Started by its pool agent (``workbench.engine.pool_agent``) with the torchrun environment.  It
imports torch, sets its threads and brings the default process group up once, records its
baseline memory in ``ready/rank{R}.json``, then runs the pool's jobs (``jobs/{N}.json``) one after
another, from job $WORKBENCH_POOL_NEXT_JOB on:

- a run job: exactly what a cold worker runs for that run folder (``worker.run_job``: the engine,
  a function or a script, with the same status, metrics, events, errors and results), its output
  in the run folder's logs, with the group already up; then ``done/{N}-rank{R}.json`` with the
  memory left after it.  A job that raises ends this process (its collectives may be half way):
  the agent starts a fresh worker and every rank meets again before the next job.
- an exec job (``%%ranks``): the cell's code in this rank's persistent namespace (rank,
  world_size, dist and torch predefined); its output, the value of its last expression and its
  traceback (the cell's own frames; every frame too, for WORKBENCH_TRACEBACK=full) go to the done
  file.  An exception there keeps the process (see Pool.run_cell).

Between jobs the state a job could leave is put back: environment, working folder, sys.argv,
sys.path, modules a script imported from its own folder, the RNGs (torch's default seed, Python's
from the OS, as in a fresh process); then garbage is collected and freed memory given back."""

from __future__ import annotations

import ast
import contextlib
import ctypes
import faulthandler
import gc
import io
import linecache
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

from workbench.engine.env import borrowed_group
from workbench.engine.monitor import PORT_TAKEN_EXIT_CODE
from workbench.engine.tee import switch_output
from workbench.engine.userframes import user_traceback
from workbench.engine.worker import Terminated, _terminate, line_buffered, run_job, show_failure
from workbench.runfolder.failures import port_taken
from workbench.runfolder.layout import PoolDir, RunDir, read_json, write_json_atomic

NEXT_JOB_ENV = "WORKBENCH_POOL_NEXT_JOB"
GENERATION_ENV = "WORKBENCH_POOL_GENERATION"
POLL_S = 0.005
"""How often an idle worker looks for the next job (a file stat): the latency a job waits at most."""
MAX_TEXT = 100_000


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pool = PoolDir(args[0])
    faulthandler.enable()
    line_buffered()  # its stdout and stderr are pipes to its agent (engine.tee): lines go as printed
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    try:
        return serve(pool, int(os.environ["RANK"]))
    except Terminated as exc:
        return 128 + signal.Signals[str(exc)].value
    except Exception as exc:
        if not port_taken(exc):  # a job's exception never gets here: only warming up (the group) does
            raise
        print(f"[workbench] port {os.environ.get('MASTER_PORT')} was taken before the ranks met: "
              "they meet again on a fresh one", file=sys.stderr, flush=True)
        return PORT_TAKEN_EXIT_CODE


def serve(pool: PoolDir, rank: int) -> int:
    """Warm up, then run jobs until stopped; returns only through an exception or a failed job."""
    namespace = warm_up(pool, rank)
    number = int(os.environ.get(NEXT_JOB_ENV, "0"))
    while True:
        job = _next_job(pool, number)
        if pool.job_cancel(number).exists():
            write_json_atomic(pool.done(number, rank), {"outcome": "cancelled", "time": time.time()})
        else:
            write_json_atomic(pool.taken(rank), {"job": number, "kind": job.get("kind"),
                                                 "run_dir": job.get("run_dir"), "time": time.time()})
            record = run_exec(job, namespace, rank) if job.get("kind") == "exec" else run_in_folder(job, rank, number)
            if record.get("exit_code"):
                return int(record["exit_code"])  # the agent records the job's end and starts afresh
            write_json_atomic(pool.done(number, rank), {**record, "rss_mb": settle(), "time": time.time()})
        number += 1


def warm_up(pool: PoolDir, rank: int) -> dict[str, Any]:
    """torch imported, threads set, the default group up for the pool's backend (every rank meets
    here: a barrier), the engine's modules loaded; the baseline memory recorded."""
    import torch
    import torch.distributed as dist

    import workbench.engine.rank  # noqa: F401 - loaded once here, not in each job's time
    import workbench.engine.trainer  # noqa: F401
    from workbench.engine.env import DistEnv, join_process_group, pick_device_and_backend

    meta = pool.read_meta() or {}
    env = DistEnv.from_environ()
    threads = meta.get("threads_per_rank")
    if threads or env.local_world_size > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads or 1))
        torch.set_num_threads(int(threads or os.environ["OMP_NUM_THREADS"]))
    device, backend = pick_device_and_backend(env.local_rank, str(meta.get("backend") or "auto"))
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    join_process_group(backend, env, float(meta.get("timeout_s") or 600))
    dist.barrier()  # all ranks must reach this: the pool is up on every rank
    _one_ddp_step(torch, device)  # autograd's, DDP's and the optimizer's one-time set-up: not in a job's time
    baseline = settle()
    write_json_atomic(pool.ready(rank), {"rank": rank, "generation": int(os.environ.get(GENERATION_ENV, "0")),
                                         "backend": backend, "device": device, "pid": os.getpid(),
                                         "rss_mb": baseline, "time": time.time()})
    return {"rank": env.rank, "world_size": env.world_size, "dist": dist, "torch": torch, "__name__": "__ranks__"}


def _one_ddp_step(torch: Any, device: str) -> None:
    """A throwaway DDP step on a tiny model (collectives: every rank runs it)."""
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(4, 4).to(device))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4, device=device)).sum().backward()
    optimizer.step()
    del model, optimizer


def _next_job(pool: PoolDir, number: int) -> dict[str, Any]:
    """Job `number` once it is queued, unless the pool is restarting its ranks: then never (this
    worker's agent ends it).  A rank's agent marks its worker down for the next generation before it
    says the job that ended it is done, so a job queued after that answer is never taken by a worker
    of the old generation (its peers would not run it)."""
    path = pool.job(number)
    while True:
        job = read_json(path) if path.exists() else None
        if isinstance(job, dict) and not _restarting(pool):
            return job
        time.sleep(POLL_S)


def _restarting(pool: PoolDir) -> bool:
    """Some rank's worker is down for the pool's next generation (engine.pool_agent)."""
    key = pool.generation_key(int(os.environ.get(GENERATION_ENV, "0")) + 1)
    return bool(pool.ranks_down(key, int(os.environ.get("WORLD_SIZE", "1"))))


POOL_ADVICE = "this pool's process group is {held}; run the script in a pool started with dist.backend={asked}"


# --- a run job ---------------------------------------------------------------------------------
def run_in_folder(job: dict[str, Any], rank: int, number: int) -> dict[str, Any]:
    """The cold worker's job for the run folder, with this rank's output in that folder's logs;
    the process state a job may change is put back after it."""
    run_dir = str(job["run_dir"])
    fresh_rngs()
    with restored_process_state(), borrowed_group(POOL_ADVICE), output_to(RunDir(run_dir), number, rank):
        elastic = RunDir(run_dir).elastic_error(rank)  # torch's @record writes there, as under torchrun
        elastic.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ["TORCHELASTIC_ERROR_FILE"] = str(elastic)
        try:
            code = run_job(run_dir, 0)
        except Terminated:
            raise
        except BaseException as exc:  # recorded in the run folder already; the rank's log shows the user's frames
            show_failure(exc, run_dir, 0)
            code = 1
    return {"outcome": "finished" if code == 0 else "failed", "exit_code": code}


def fresh_rngs() -> None:
    """The random generators as a fresh process has them (jobs seed their own from the config): a
    seed of its own on each rank and for each job, as torch gives a new process (torch.seed(): a
    non-deterministic one, on every device's default generator)."""
    import torch

    torch.seed()
    random.seed()
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed()


@contextlib.contextmanager
def restored_process_state() -> Iterator[None]:
    """Environment, working folder, sys.argv, sys.path and the modules a script loaded from outside
    the installed packages: as they were before the job."""
    environ, cwd, argv, path = dict(os.environ), os.getcwd(), list(sys.argv), list(sys.path)
    modules = set(sys.modules)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        sys.argv[:], sys.path[:] = argv, path
        for name in set(sys.modules) - modules:
            if _user_module(sys.modules.get(name)):
                del sys.modules[name]


def _user_module(module: Any) -> bool:
    """A module a job imported from its own files (not from the installed packages or the stdlib)."""
    path = str(getattr(module, "__file__", None) or "")
    return bool(path) and "site-packages" not in path and not path.startswith(sys.base_prefix) and \
        "/workbench/" not in path


@contextlib.contextmanager
def output_to(run: RunDir, job: int, rank: int) -> Iterator[None]:
    """This process's stdout and stderr into the run's log files for pool job `job`, and into its
    interleaved log, through the agent's tee (engine.tee) as a cold worker's."""
    run.logs.mkdir(parents=True, exist_ok=True)
    switch_output({"out": str(run.pool_log(job, rank, "out")), "err": str(run.pool_log(job, rank, "err")),
                   "both": str(run.both_streams(rank))})
    try:
        yield
    finally:
        switch_output({})


def settle() -> float:
    """Collect garbage, give freed heap back to the system (glibc), return the resident set in MB."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb(os.getpid())


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as fh:
        pages = int(fh.read().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


# --- an exec job (%%ranks) ---------------------------------------------------------------------
def run_exec(job: dict[str, Any], namespace: dict[str, Any], rank: int) -> dict[str, Any]:
    """Run the cell's code in the rank's namespace: its output, last value and traceback."""
    out, err = io.StringIO(), io.StringIO()
    result: str | None = None
    error: str | None = None
    error_full: str | None = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            value = exec_cell(str(job.get("source", "")), namespace, f"<rank {rank} cell>")
        result = None if value is None else _clip(repr(value))
    except Terminated:
        raise
    except BaseException as exc:  # noqa: BLE001 - shown to the user, tagged with the rank
        # the cell's frames and what they called, not run_exec's; a cell that does not parse: where, no frames
        error = _clip("".join(traceback.format_exception_only(exc)) if isinstance(exc, SyntaxError)
                      else user_traceback(exc))
        error_full = _clip("".join(traceback.format_exception(exc)))  # for WORKBENCH_TRACEBACK=full
    return {"outcome": "raised" if error else "finished", "stdout": _clip(out.getvalue()),
            "stderr": _clip(err.getvalue()), "result": result, "error": error, "error_full": error_full}


def exec_cell(source: str, namespace: dict[str, Any], filename: str) -> Any:
    """exec the cell; the value of its last line when that is an expression (as IPython shows it)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show lines
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    assert last is None or isinstance(last, ast.Expr)
    exec(compile(tree, filename, "exec"), namespace)  # noqa: S102 - the user's own cell, on the user's ranks
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), filename, "eval"), namespace)  # noqa: S307


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"\n[... {len(text) - MAX_TEXT} characters cut ...]"


if __name__ == "__main__":
    sys.exit(main())
