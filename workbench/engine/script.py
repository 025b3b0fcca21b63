"""Script mode, inside a rank: run an existing torchrun-style script with the run folder's reporting.

The script runs in each rank's process (runpy), with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set as torchrun would, so its own ``init_process_group()`` works unchanged.  One line
streams its metrics into the run's per-rank files:

    import workbench
    workbench.log(step=step, loss=loss.item(), lr=lr)
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from workbench.config.sections import DistConfig
from workbench.engine.env import serve_store_on_loopback
from workbench.engine.monitor import RankMonitor
from workbench.engine.rendezvous import RUN_DIR_ENV
from workbench.runfolder import events
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.private import write_atomic

_writer: Any = None
_monitor: Any = None  # this rank's RankMonitor when running under run_script_rank


def log(step: int, **metrics: Any) -> None:
    """Append one record (rank, step, time, your metrics) to this rank's metrics file.

    Does nothing when the script was not started by workbench (no WORKBENCH_RUN_DIR)."""
    global _writer
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return
    rank = int(os.environ.get("RANK", "0"))
    if _writer is None or _writer.path != RunDir(run_dir).metrics(rank):
        from workbench.runfolder.writer import JsonlWriter

        _writer = JsonlWriter(RunDir(run_dir).metrics(rank))
    values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
    # a restarted attempt says so: the steps it logs again replace the earlier attempt's (runfolder.fold)
    attempt = {"attempt": _monitor.attempt} if _monitor is not None and _monitor.attempt else {}
    _writer.write({"rank": rank, "step": int(step), "time": time.time(), **values, **attempt})
    if _monitor is not None:
        _monitor.step = int(step)  # the heartbeat thread reports it


@dataclass(frozen=True)
class ScriptPayload:
    """What to run on every rank, as torchrun would: `python script.py ARGS` or `python -m module ARGS`."""

    target: str
    """The script's absolute path, or a module name when `module` is true."""
    args: tuple[str, ...] = ()
    module: bool = False
    threads_per_rank: int | None = None
    """dist.threads_per_rank; empty: OMP_NUM_THREADS if the user set it, else 1 when ranks share a node."""
    stall_after_s: float | None = None
    """dist.stall_after_s (empty: from the job's pace); dist.on_hang says what a hung rank does."""
    cwd: str = ""
    """The ranks' working folder (empty: wherever the scheduler starts them)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the ranks."""
    lost_after_s: float = DistConfig.lost_after_s
    on_hang: str = "fail"

    @property
    def label(self) -> str:
        return f"-m {self.target}" if self.module else self.target


def run_script_rank(job: ScriptPayload, run_dir: str, rank: int, attempt: int = 0) -> int:
    """Run the job's script or module as this rank, as torchrun would; errors land in the run folder."""
    os.environ.update(job.env)
    if job.cwd:
        os.chdir(job.cwd)
    saved_argv, saved_path = sys.argv, list(sys.path)
    try:
        with user_code(run_dir, rank, attempt, job, args=list(job.args)):
            serve_store_on_loopback()  # the script's own init_process_group() meets there
            _run_main(job)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


FN_ADVICE = "the process group workbench brought up is {held}; submit the function with dist.backend={asked}"


@dataclass(frozen=True)
class FnPayload:
    """A function to call on every rank, with the process group up: workbench.submit_fn."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    backend: str = "auto"
    timeout_s: float = 600.0
    threads_per_rank: int | None = None
    stall_after_s: float | None = None
    lost_after_s: float = DistConfig.lost_after_s
    on_hang: str = "fail"

    @property
    def label(self) -> str:
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))}"


def run_fn_rank(job: FnPayload, run_dir: str, rank: int, attempt: int = 0) -> Any:
    """Call job.fn(*args, **kwargs) as this rank, inside the default process group (initialised for
    the configured backend, destroyed afterwards); its return value goes to results/rank{R}.pkl."""
    import cloudpickle
    import torch
    import torch.distributed as dist

    from workbench.engine.env import DistEnv, borrowed_group, join_process_group, pick_device_and_backend

    env = DistEnv.from_environ()
    owned = False
    try:
        with user_code(run_dir, rank, attempt, job):
            device, backend = pick_device_and_backend(env.local_rank, job.backend)
            if device.startswith("cuda"):
                torch.cuda.set_device(device)
            owned = join_process_group(backend, env, job.timeout_s)
            with borrowed_group(FN_ADVICE):  # the function's own init_process_group(), as under torchrun
                result = job.fn(*job.args, **job.kwargs)
            write_atomic(RunDir(run_dir).result(rank), cloudpickle.dumps(result))
    finally:  # after the failure is recorded: tearing the group down makes the peers fail too
        if owned and dist.is_initialized():
            dist.destroy_process_group()
    return result


@contextlib.contextmanager
def user_code(run_dir: str, rank: int, attempt: int, job: ScriptPayload | FnPayload,
              **start: Any) -> Iterator[RankMonitor]:
    """What surrounds user code in a rank (a script, a module, a function): threads as torchrun
    sets them, the monitor (heartbeat, stall and output watch, set_epoch check), workbench.log's
    run folder, the start and end events, the failure if it raises, and rank 0's summary."""
    global _monitor
    run = RunDir(run_dir)
    label = job.label
    _set_threads(job.threads_per_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    monitor = _monitor = RankMonitor(run, rank, int(os.environ["WORLD_SIZE"]), attempt,
                                     stall_after_s=job.stall_after_s, lost_after_s=job.lost_after_s,
                                     on_hang=job.on_hang).start()
    streams = sys.stdout, sys.stderr
    count_output(monitor)
    unwatch = watch_set_epoch(monitor)
    os.environ[RUN_DIR_ENV] = run_dir
    try:
        monitor.set_state("running")
        monitor.event(events.START, script=label, **start)
        with monitor.reporting():
            yield monitor
        if (run.read_meta() or {}).get("cancelled"):  # its own SIGTERM handler ended it (a checkpoint, exit 0)
            monitor.event(events.INTERRUPTED, reason="cancelled: the user code returned after the stop signal")
            monitor.close("interrupted")
            return
        monitor.event(events.END, stop_reason="returned")
        monitor.close("finished")
        if rank == 0:
            write_json_atomic(run.summary, {"status": "finished", "script": label, "steps": monitor.step or None,
                                            "output_lines": monitor.output_seen})
    finally:  # a warm pool's worker runs the next job in this process: leave nothing of this one
        sys.stdout, sys.stderr = streams
        unwatch()
        _monitor = None
        _close_writer()


def _close_writer() -> None:
    global _writer
    if _writer is not None:
        with contextlib.suppress(OSError):
            _writer.close()
        _writer = None


def _set_threads(threads: int | None, local_world_size: int) -> None:
    """torchrun's rule: OMP_NUM_THREADS=1 when several ranks share a node and the user set nothing;
    dist.threads_per_rank wins over both."""
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    elif "OMP_NUM_THREADS" not in os.environ and local_world_size > 1:
        os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules and "OMP_NUM_THREADS" in os.environ:  # already imported: tell it too
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _run_main(job: ScriptPayload) -> None:
    """Run as __main__ like `python script.py` (its folder first on sys.path) or `python -m module`
    (the working folder first); sys.exit(0) is a normal end, another status a failure."""
    try:
        if job.module:
            sys.argv = [job.target, *job.args]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(job.target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [job.target, *job.args]
            sys.path.insert(0, os.path.dirname(job.target))
            runpy.run_path(job.target, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"{job.label} exited with status {exc.code}") from None


class _CountingStream:
    """stdout/stderr as they were, counting the lines written: output is a sign of life."""

    def __init__(self, stream: Any, monitor: RankMonitor):
        self._stream, self._monitor = stream, monitor

    def write(self, text: str) -> int:
        self._monitor.output_seen += text.count("\n")
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def count_output(monitor: RankMonitor) -> None:
    sys.stdout = _CountingStream(sys.stdout, monitor)
    sys.stderr = _CountingStream(sys.stderr, monitor)


def watch_set_epoch(monitor: RankMonitor) -> Callable[[], None]:
    """Report a shuffling DistributedSampler whose order really repeats: two complete passes with
    the same epoch (and seed), i.e. a script that forgot sampler.set_epoch(epoch).  Peeking at a
    batch (an unfinished pass), or iterating again after set_epoch, is not reported."""
    from torch.utils.data import DistributedSampler

    original = DistributedSampler.__iter__
    finished: dict[int, tuple[int, int]] = {}  # sampler -> (epoch, seed) of its last complete pass
    warned: set[int] = set()

    def __iter__(self: DistributedSampler) -> Iterator[int]:
        key, order = id(self), (self.epoch, self.seed)
        yield from original(self)
        if self.shuffle and finished.get(key) == order and key not in warned:
            warned.add(key)
            monitor.event(events.WARNING, check="set_epoch", epoch=self.epoch,
                          message="DistributedSampler gave the same order twice (epoch "
                                  f"{self.epoch}): call sampler.set_epoch(epoch) at the start of every "
                                  "epoch, or each epoch repeats the same order")
        finished[key] = order

    DistributedSampler.__iter__ = __iter__  # type: ignore[method-assign,assignment]

    def unwatch() -> None:
        DistributedSampler.__iter__ = original  # type: ignore[method-assign]

    return unwatch
