"""The controller of a local run: one process per run, in a session of its own, so that the notebook
kernel or shell that submitted the run may go away (a kernel restart kills the kernel's whole
process group) while the run trains on.  ``Run.load(folder)`` follows it again.

It is submitit's local controller (start one task per rank, the time limit and the warning signal
before it, requeue), with workbench's teardown: SIGTERM, SIGINT or SIGHUP, however often sent, ask
every rank's agent to stop (each ends its worker); after STOP_GRACE_S whatever is left is killed,
the agents and the workers' process groups recorded in the run folder.  A stop is noted in run.json
so the run is reported as cancelled.  Started by ``python -m workbench.launch.local_controller``."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from submitit.core import _submit as submit_module
from submitit.core import utils as submitit_utils
from submitit.core.submission import process_job
from submitit.local import local as submitit_local

from workbench.engine import forked
from workbench.engine.rendezvous import REQUEUES_ENV, RUN_DIR_ENV
from workbench.launch.ours import say_not_signalled, signallable
from workbench.proctree import KILL_AFTER_S, Proc, end, leave_quickly, signal_name
from workbench.runfolder.failures import error_record, write_error
from workbench.runfolder.layout import RunDir, read_json

STOP_GRACE_S = KILL_AFTER_S + 5.0
"""Agents asked to stop get this long to end their workers before everything left is killed."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Controller(submitit_local.Controller):
    def __init__(self, folder: Path):
        super().__init__(folder)
        self.rundir = RunDir(os.environ[RUN_DIR_ENV])
        self.stop_signal = 0
        self.generation = 0
        self.ended: set[int] = set()
        """Ranks whose agent's end is noted (in this generation)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._request_stop)

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_signal = self.stop_signal or signum

    def start_tasks(self) -> None:
        os.environ[REQUEUES_ENV] = str(self.generation)  # a requeued generation is a new attempt
        self.generation += 1
        self.ended = set()
        if self.stop_signal:
            return
        folder = self.task_folder()
        if folder is None or forked.why_not_fork():
            super().start_tasks()
            return
        # submitit's start_tasks, each task forked from this process instead of a fresh python
        # (workbench.engine.forked): its log files, environment and `python -u -m submitit.core._submit`
        self.folder.mkdir(exist_ok=True)
        paths = [submitit_utils.JobPaths(self.folder, self.pid, k) for k in range(self.ntasks)]
        self.stdouts = [p.stdout.open("a") for p in paths]
        self.stderrs = self.stdouts if self.stderr_to_stdout else [p.stderr.open("a") for p in paths]
        for k in range(self.ntasks):
            env = {**os.environ, "SUBMITIT_LOCAL_LOCALID": str(k), "SUBMITIT_LOCAL_GLOBALID": str(k),
                   "SUBMITIT_LOCAL_JOB_ID": self.pid}
            self.tasks.append(forked.fork(  # type: ignore[arg-type]
                lambda: process_job(folder), env=env, argv=[submit_module.__file__, folder],
                stdout=self.stdouts[k].fileno(), stderr=self.stderrs[k].fileno(), unbuffered=True))

    def task_folder(self) -> str | None:
        """The folder of submitit's task command, when that is the plain `python -u -m
        submitit.core._submit FOLDER` that a fork can stand for; else None."""
        command = self.command
        if len(command) == 5 and command[1:4] == ["-u", "-m", "submitit.core._submit"]:
            return command[4]
        return None

    def wait(self, freq: int = 24) -> list[int | None]:
        """Until every task ended, a stop was asked for, or the time limit passed (the warning
        signal goes out signal_delay_s before it)."""
        started = time.monotonic()
        warned = False
        while True:
            codes = [t.poll() for t in self.tasks]
            self._note_ended(codes)
            if all(c is not None for c in codes) and (self.tasks or not self.stop_signal):
                return codes
            if self.stop_signal:  # (also one that came before any task started: while torch was imported)
                name = signal.Signals(self.stop_signal).name
                self.rundir.mark_cancelled(f"{name} to the local controller (pid {os.getpid()})")
                print(f"[workbench controller] {name}: stopping every rank", flush=True)
                return codes
            elapsed = time.monotonic() - started
            if not warned and elapsed >= self.timeout_s - self.signal_delay_s:
                self._forward_signal(submitit_local.LocalJobEnvironment._usr_sig())
                warned = True
            if elapsed >= self.timeout_s:
                return codes
            time.sleep(1.0 / freq)

    def _note_ended(self, codes: list[int | None]) -> None:
        """Say in controller.log how each rank's agent ended; an agent killed by a signal (its
        worker goes with it, and no one else is left to say so) gets the rank's error file, unless
        the rank has one for its attempt already (whoever sees a death first writes it down)."""
        for rank, code in enumerate(codes):
            if code is None or rank in self.ended:
                continue
            self.ended.add(rank)
            how = f"was killed by {signal_name(code)}" if code < 0 else f"exited with status {code}"
            print(f"[workbench controller] rank {rank}'s agent (pid {self.tasks[rank].pid}) {how}", flush=True)
            if code < 0 and not self.stop_signal:
                self._agent_killed(rank, self.tasks[rank].pid, signal_name(code))

    def _agent_killed(self, rank: int, pid: int, how: str) -> None:
        attempt = (read_json(self.rundir.procs(rank)) or {}).get("attempt", 0)
        error = self.rundir.read_error(rank)
        if error is not None and error.get("attempt") == attempt:
            return
        message = (f"rank {rank}'s agent (pid {pid}) was killed by {how}, and its worker with it "
                   "(killed by hand, by the scheduler, or out of memory)")
        status = self.rundir.read_status(rank) or {}
        record = error_record(rank, "Lost", message, "", attempt if isinstance(attempt, int) else 0,
                              str(status.get("host") or ""), status.get("step"), reported_by="controller")
        with contextlib.suppress(OSError):
            write_error(self.rundir, rank, record)

    def kill_tasks(self) -> None:
        """Ask the agents to stop, then kill what is left: agents, and the workers' groups."""
        agents = [p for p in (Proc.of(t.pid) for t in self.tasks if t.poll() is None) if p is not None]
        end(agents, STOP_GRACE_S)  # our own children
        workers, refused = signallable(self.rundir, ("worker",))  # named in the folder: checked first
        end(workers, 1.0)
        say_not_signalled(self.rundir.root, refused)
        for task in self.tasks:
            task.poll()
        super().kill_tasks()  # closes the log files (nothing is left to signal)


def main(argv: list[str] | None = None) -> Any:
    args = sys.argv[1:] if argv is None else argv
    controller = Controller(Path(args[0]))
    if not forked.why_not_fork():
        try:
            forked.preload(forked.engine_run(controller.rundir))  # once for every rank: each forked from here
        except Exception as exc:  # noqa: BLE001 - each rank then imports it itself, and reports what fails
            print(f"[workbench controller] not preloading torch ({type(exc).__name__}: {exc}): every rank "
                  "starts a fresh process", flush=True)
    controller.run()
    leave_quickly()  # every agent has ended: Run.wait() waits for this process's exit


if __name__ == "__main__":
    main()
