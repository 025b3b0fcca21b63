"""Warm ranks: `workbench.Pool(cfg)` starts the ranks once (torch imported, process group up) and
runs jobs in them one after another, with the same run folders and Run handles as cold submissions.

The pool is one submitit job (local, or one SLURM allocation) whose per-rank callable is a pool
agent (workbench.engine.pool_agent) owning a warm worker (workbench.engine.warm).  Its folder
(workbench.runfolder.layout.PoolDir, <run_root>/pools/<name>/) is the channel: a job is a file naming its
prepared run folder (made by the one submit pipeline, workbench.launch.submit._start), or a cell
of code (%%ranks, `run_cell`).

Jobs queue: a submit while a job runs returns at once and its job starts when the one before it
ends (its Run reads pending until then)."""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config.sections import JobConfig
from workbench.engine.pool_agent import DEFAULT_IDLE_TIMEOUT_S, PoolEntry
from workbench.errors import ConfigError, SubmitError
from workbench.launch.executors import make_executor
from workbench.launch.ours import say_not_signalled, signallable
from workbench.launch.pooljob import PoolJob, pool_alive
from workbench.launch.submit import Launches, check_before_submit
from workbench.proctree import Proc, end, wait_gone
from workbench.runfolder.layout import PoolDir, RunDir, pool_dir, pools_under, read_json, safe_name, write_json_atomic
from workbench.runfolder.private import private_umask

CLOSE_GRACE_S = 15.0
"""close(): the agents end their workers and exit by themselves within this; then the rest is killed."""
EXEC_PEER_GRACE_S = 5.0
"""run_cell: after one rank raised, the others get this long to answer; then the ranks are restarted."""

_last: list[weakref.ref[Pool]] = []


class Pool(Launches):
    """`world_size` warm ranks for cfg (local, or one SLURM allocation of dist.nodes x
    dist.procs_per_node held for launch.time_limit).  Jobs must match its world size and backend;
    everything else may change between them.  `idle_timeout_s` without a job ends the ranks (and
    releases the allocation).  Close it (`close()`, or `with workbench.Pool(cfg) as pool:`);
    a pool made in a kernel is closed when the kernel exits, and a kernel restart ends it."""

    cfg: JobConfig

    def __init__(self, cfg: JobConfig, name: str | None = None, *, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 stop_with_caller: bool = False):
        check_before_submit(cfg)
        if not idle_timeout_s > 0:
            raise ConfigError([f"idle_timeout_s: {idle_timeout_s!r} must be a positive number of seconds"])
        self.cfg = cfg
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}"
        self.name = name or f"{safe_name(cfg.launch.name or 'pool')}-{stamp}"
        self.dir = pool_dir(cfg.launch.run_root, self.name)
        if self.dir.meta.exists() and pool_alive(self.dir) and not (self.dir.read_meta() or {}).get("closed"):
            raise SubmitError(f"pool {self.name} is running already ({self.dir.root}): use it, or close it "
                              f"(workbench pools --close {self.name})")
        self.dir.create()
        self.job = self._start(cfg, idle_timeout_s, stop_with_caller)
        self._finalizer = weakref.finalize(self, _close_folder, self.dir, self.job)
        _last.append(weakref.ref(self))

    def _start(self, cfg: JobConfig, idle_timeout_s: float, stop_with_caller: bool) -> Any:
        d = cfg.dist
        self.dir.update_meta(name=self.name, executor=cfg.launch.executor, world_size=cfg.world_size, nodes=d.nodes,
                             procs_per_node=d.procs_per_node, backend=d.backend, timeout_s=d.timeout_s,
                             threads_per_rank=d.threads_per_rank, idle_timeout_s=idle_timeout_s,
                             created=time.time(), user=_user(), submit_host=_host())
        with private_umask():
            executor, contract = make_executor(cfg.replace(launch__name=f"pool-{self.name}"), self.dir,
                                               stop_with_caller)
            job = executor.submit(PoolEntry(str(self.dir.root), contract))
        controller = getattr(job, "_process", None)
        found = Proc.of(controller.pid, group=True) if controller is not None else None
        self.dir.record_job(job.job_id, **({"controller": found.to_dict()} if found else {}))
        return job

    def __repr__(self) -> str:
        return f"Pool({self.name!r}, {self.cfg.world_size} ranks, {'open' if self.alive() else 'closed'})"

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- jobs: submit, submit_fn and submit_script come from Launches, in the warm ranks (cfg: the
    # pool's config when a job gives none); a script's own init_process_group() and
    # destroy_process_group() find the pool's group up and leave it up.
    def check(self, cfg: JobConfig) -> None:
        """A job must fit the ranks: same world size and backend (ConfigError naming the field)."""
        problems = []
        if cfg.world_size != self.cfg.world_size:
            problems.append(f"dist: this job asks {cfg.dist.nodes} x {cfg.dist.procs_per_node} = {cfg.world_size} "
                            f"ranks, the pool {self.name} has {self.cfg.world_size}; set dist.nodes and "
                            "dist.procs_per_node as the pool's, or start another pool")
        if not _same_backend(cfg.dist.backend, self.cfg.dist.backend, self._resolved_backend()):
            runs = self.cfg.dist.backend + (f" ({self._resolved_backend()})" if self.cfg.dist.backend == "auto" else "")
            problems.append(f"dist.backend: this job asks {cfg.dist.backend}, the pool {self.name} runs {runs}; "
                            f"set dist.backend={self.cfg.dist.backend}, or start another pool")
        if problems:
            raise ConfigError(problems)

    def hand_over(self, cfg: JobConfig, run: RunDir, stop_with_caller: bool) -> PoolJob:
        number = self._queue({"kind": "run", "run_dir": str(run.root)},
                             lambda n: run.record_job(f"pool-{n}", pool={"dir": str(self.dir.root), "job": n,
                                                                         "name": self.name}))
        return PoolJob(self.dir, number, self.cfg.world_size)

    def _queue(self, job: dict[str, Any], before: Callable[[int], None] | None = None) -> int:
        with self.dir.locked("submit"):  # the idle timeout takes the same lock before it closes
            meta = self.dir.read_meta() or {}
            if meta.get("closed") or not pool_alive(self.dir):
                why = meta.get("closed_by") or "its job ended"
                raise SubmitError(f"pool {self.name} is closed ({why}); start a new one: workbench.Pool(cfg)")
            number = max(self.dir.job_numbers(), default=-1) + 1
            if before is not None:
                before(number)
            write_json_atomic(self.dir.job(number), {**job, "time": time.time()})
        return number

    # --- code on every rank (%%ranks) ------------------------------------------------------------
    def run_cell(self, source: str, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Run `source` on every rank in the rank's own namespace (kept from cell to cell; rank,
        world_size, dist and torch predefined).  Returns per rank: outcome ("finished", "raised",
        or how the agent ended it), stdout, stderr, result (the repr of the last expression) and
        error (the traceback).  When a rank raised and another has not answered within
        EXEC_PEER_GRACE_S (it may wait in a collective the raising rank never reached), or on
        timeout or Ctrl-C, the ranks are restarted: their namespaces start empty again."""
        number = self._queue({"kind": "exec", "source": source})
        job = PoolJob(self.dir, number, self.cfg.world_size)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        raised_at: float | None = None
        try:
            while not job.done():
                outcomes = job.outcomes()
                if raised_at is None and any(o.get("outcome") == "raised" for o in outcomes):
                    raised_at = time.monotonic()
                late = raised_at is not None and time.monotonic() - raised_at > EXEC_PEER_GRACE_S
                if late or (deadline is not None and time.monotonic() > deadline):
                    job.cancel()
                    job.wait(CLOSE_GRACE_S)
                    break
                time.sleep(0.02)
        except KeyboardInterrupt:
            job.cancel()
            job.wait(CLOSE_GRACE_S)
            raise
        return job.outcomes()

    # --- state and end ---------------------------------------------------------------------------
    def alive(self) -> bool:
        return not (self.dir.read_meta() or {}).get("closed") and pool_alive(self.dir)

    def wait_ready(self, timeout_s: float = 300.0) -> Pool:
        """Block until every rank's warm worker is up (torch imported, process group made)."""
        deadline = time.monotonic() + timeout_s
        while not all(self.dir.ready(r).exists() for r in range(self.cfg.world_size)):
            if not self.alive():
                raise RuntimeError(f"pool {self.name} ended before its ranks were up: "
                                   f"{(self.dir.read_meta() or {}).get('closed_by') or 'see ' + str(self.dir.logs)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"pool {self.name}: ranks not up within {timeout_s} s (see {self.dir.logs})")
            time.sleep(0.05)
        return self

    def _resolved_backend(self) -> str | None:
        """The backend rank 0's warm worker chose for "auto" (None before it is up)."""
        return (read_json(self.dir.ready(0)) or {}).get("backend")

    def info(self) -> dict[str, Any]:
        return pool_info(self.dir)

    def close(self) -> None:
        """End the ranks and the pool's job (local controller, or the SLURM allocation); returns
        once no process of the pool is left.  A job still running is cancelled."""
        self._finalizer()


def _close_folder(pool: PoolDir, job: Any) -> None:
    """Close the pool in `pool`: mark it closed (the agents end their workers and return), then end
    whatever is still there after CLOSE_GRACE_S."""
    def mark(meta: dict[str, Any]) -> None:
        meta.setdefault("closed", time.time())
        meta.setdefault("closed_by", "Pool.close()")

    pool.update_meta(mark)
    meta = pool.read_meta() or {}
    _cancel_unfinished(pool, meta)
    everyone, refused = signallable(pool, ("controller", "agent", "worker"))  # only what is provably ours
    say_not_signalled(pool.root, refused)
    if meta.get("executor") == "slurm":
        deadline = time.monotonic() + CLOSE_GRACE_S
        while pool_alive(pool) and time.monotonic() < deadline:
            time.sleep(0.2)
        if job is not None and pool_alive(pool):
            job.cancel()  # scancel
    else:
        left = wait_gone(everyone, CLOSE_GRACE_S)
        end(left, 2.0)
    if job is not None and hasattr(job, "done"):
        with contextlib.suppress(Exception):  # the scheduler may not answer; the processes are gone
            job.done()  # reap our own child


def _cancel_unfinished(pool: PoolDir, meta: dict[str, Any]) -> None:
    """The run jobs not every rank is done with (running or queued) are cancelled by the close: read
    as cancelled, not failed.  Only a run folder that names this pool and job as its own is marked."""
    world = int(meta.get("world_size") or 0)
    for number in pool.job_numbers():
        if world and all(pool.done(number, rank).exists() for rank in range(world)):
            continue
        job = read_json(pool.job(number)) or {}
        if job.get("kind") != "run" or not job.get("run_dir"):
            continue
        run = RunDir(str(job["run_dir"]))
        own = (run.read_meta() or {}).get("pool") or {}
        if isinstance(own, dict) and own.get("dir") == str(pool.root) and own.get("job") == number:
            with contextlib.suppress(OSError):
                run.mark_cancelled(f"{meta.get('closed_by') or 'Pool.close()'}: the pool closed while it ran")


def close_pool(folder: str | Path) -> None:
    """Close the pool in `folder` from any process (the CLI)."""
    _close_folder(PoolDir(Path(folder)), None)


def last_pool() -> Pool | None:
    """The last Pool made in this process that is still open (%%ranks without a name)."""
    for ref in reversed(_last):
        pool = ref()
        if pool is not None and pool.alive():
            return pool
    return None


def pool_info(folder: PoolDir) -> dict[str, Any]:
    """One row for the pools listing: name, where, world size, state, idle since, jobs run."""
    meta = folder.read_meta() or {}
    done = folder.done_numbers()
    last = max([read_json(folder.done(n, 0), {}).get("time") or 0 for n in done[-1:]] + [meta.get("created") or 0])
    alive = not meta.get("closed") and pool_alive(folder)
    return {"name": meta.get("name", folder.root.name), "executor": meta.get("executor"),
            "job_id": meta.get("job_id"), "world_size": meta.get("world_size"), "backend": meta.get("backend"),
            "state": "open" if alive else "closed", "jobs": len(folder.job_numbers()), "idle_since": last,
            "closed_by": meta.get("closed_by"), "folder": str(folder.root)}


def pools(run_root: str | Path | None = None, live_only: bool = True) -> list[dict[str, Any]]:
    """The pools under run_root (open ones only, unless live_only=False)."""
    rows = [pool_info(p) for p in pools_under(run_root or JobConfig().launch.run_root)]
    return [r for r in rows if r["state"] == "open" or not live_only]


def _same_backend(job: str, pool: str, resolved: str | None) -> bool:
    if job == pool:
        return True
    return resolved is not None and {job, pool} <= {"auto", resolved}


def _user() -> str:
    import getpass

    return getpass.getuser()


def _host() -> str:
    import socket

    return socket.gethostname()
