"""One rank's training process, started by its agent (``workbench.engine.agent``):

    python -m workbench.engine.worker RUN_DIR

It finds its rank in the torchrun environment the agent set, the config in RUN_DIR/config.yaml
and the rest of what the run executes (its payload) in RUN_DIR/payload.pkl (a task factory passed as a Python object, a
script or a function), so that unpickling it happens inside the rank and is reported like its
training (a failure there names the rank, the type and the traceback).  SIGTERM
and SIGHUP stop it like Ctrl-C: the rank records that it was interrupted and exits."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import faulthandler
import os
import signal
import sys
from types import FrameType
from typing import NoReturn

from workbench.engine import stopsignal
from workbench.engine.forked import flush_open_files

REQUEUE_EXIT_CODE = 76
"""The worker checkpointed after a preemption or time-limit signal: its agent hands the job back."""
ATTEMPT_ENV = "WORKBENCH_ATTEMPT"


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: stop like Ctrl-C (recorded as interrupted, not as a failure)."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    stopsignal.received = signum  # what the rank raises from now on is how it stopped
    raise Terminated(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.engine.worker")
    parser.add_argument("run_dir")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a crash in C code still prints the Python stacks to the rank's stderr
    # registered first, so it runs last: after the user's atexit handlers, once their threads ended
    atexit.register(flush_open_files)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    attempt = int(os.environ.get(ATTEMPT_ENV, "0"))
    line_buffered()
    try:
        return run_job(args.run_dir, attempt, exit_after_engine=True)
    except Terminated as exc:
        return 128 + signal.Signals[str(exc)].value
    except Exception as exc:  # noqa: BLE001 - every failure is shown once, in the user's frames
        if stopsignal.received is not None:  # the Terminated, wrapped by torch: stopped, not failed
            return 128 + stopsignal.received
        from workbench.engine.monitor import PORT_RETRY_ENV, PORT_TAKEN_EXIT_CODE
        from workbench.runfolder.failures import port_taken

        if os.environ.get(PORT_RETRY_ENV) and port_taken(exc):
            print(f"[workbench] port {os.environ.get('MASTER_PORT')} was taken before the ranks met: "
                  "they meet again on a fresh one", file=sys.stderr, flush=True)
            return PORT_TAKEN_EXIT_CODE
        show_failure(exc, args.run_dir, attempt)
        return 1


def line_buffered() -> None:
    """stdout and stderr line-buffered, as PYTHONUNBUFFERED=1 would have them (a rank's output goes
    to a file, which Python block-buffers): a script's print() without flush reaches the log, and
    the terminal of `workbench launch`, as it is printed.  A user who set PYTHONUNBUFFERED has
    unbuffered streams already."""
    if os.environ.get("PYTHONUNBUFFERED"):
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # replaced by something that cannot
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def show_failure(exc: BaseException, run_dir: str, attempt: int) -> None:
    """Print the exception on the rank's stderr as its error file has it: the user's frames only
    (WORKBENCH_TRACEBACK=full: every frame).  Nothing for a full disk (the command says it in one
    line) nor for a collective broken by a peer that failed first (listed under that cause); an
    exception raised before the rank could record it prints whole, for its agent to read back."""
    import traceback

    from workbench.engine.userframes import user_traceback
    from workbench.runfolder.causes import from_record, user_fix
    from workbench.runfolder.layout import RunDir

    run, rank = RunDir(run_dir), int(os.environ.get("RANK", "-1"))
    recorded = run.read_error(rank)
    if not recorded or recorded.get("attempt") != attempt or os.environ.get("WORKBENCH_TRACEBACK") == "full":
        text = "".join(traceback.format_exception(exc))
    else:
        failure = from_record(rank, recorded)
        peer_failed = any((run.read_error(r) or {}).get("attempt") == attempt for r in run.rank_files("errors")
                          if r != rank)
        quiet = user_fix(failure) is not None or (failure.knock_on and peer_failed)
        text = "" if quiet else user_traceback(exc)
    with contextlib.suppress(Exception):
        sys.stderr.write(text)
        sys.stderr.flush()


def run_job(run_dir: str, attempt: int = 0, exit_after_engine: bool = False) -> int:
    """Run what the run folder holds as this rank: a script, a function, or the engine (a cold
    worker once, a warm pool's worker once per job); the exit status a cold worker returns.
    `exit_after_engine`: a cold worker that ran the engine leaves at once (`exit_now`)."""
    from workbench.engine.script import FnPayload, ScriptPayload, run_fn_rank, run_script_rank

    job = _peek_payload(run_dir)
    rank = int(os.environ["RANK"])
    if isinstance(job, ScriptPayload):
        run_script_rank(job, run_dir, rank, attempt)
        return 0
    if isinstance(job, FnPayload):
        run_fn_rank(job, run_dir, rank, attempt)
        return 0
    from workbench.config.sections import JobConfig
    from workbench.engine.rank import run_rank
    from workbench.runfolder.layout import RunDir

    summary = run_rank(JobConfig.from_yaml(RunDir(run_dir).config), run_dir, None, attempt)
    code = REQUEUE_EXIT_CODE if summary.get("stop_reason") == "preempted" else 0
    if exit_after_engine:
        exit_now(code)
    return code


def exit_now(code: int) -> NoReturn:
    """Leave without the interpreter's and the native libraries' teardown.  The engine has written
    and closed everything it reports (status, metrics, events, checkpoints, mirrors) and destroyed
    its process group; a native thread torn down at exit ("terminate called without an active
    exception", seen once on gloo under load) must not turn a rank that finished into one killed by
    SIGABRT.  Scripts and functions exit normally: their threads, atexit handlers and open files
    are the user's."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _peek_payload(run_dir: str) -> object:
    """What payload.pkl holds (a ScriptPayload, an FnPayload, or a task factory: the engine's payload),
    or None.  A factory that does not unpickle here is unpickled again inside the engine's own
    reporting, which records the error."""
    from workbench.engine.tasks import load_task_factory
    from workbench.runfolder.layout import RunDir

    try:
        return load_task_factory(RunDir(run_dir))
    except Exception:  # noqa: BLE001 - reported by the rank that loads it again (run_rank)
        return None


if __name__ == "__main__":
    sys.exit(main())
