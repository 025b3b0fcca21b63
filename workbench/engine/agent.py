"""The agent: the process submitit starts for each rank.  It runs the rank in a child process (the
worker, ``python -m workbench.engine.worker``) and owns that child's whole life, as torchrun's agent
does:

- the worker runs in a process group of its own and gets SIGKILL from the kernel if the agent dies;
  the agent itself gets SIGTERM if whatever started it (the local controller, slurmstepd) dies;
- whatever ends an attempt (the worker finished, raised, was killed, hung; a peer failed; SIGTERM,
  SIGINT or SIGHUP to the agent), the agent ends the worker's group: SIGTERM, SIGKILL after
  proctree.KILL_AFTER_S;
- a worker that died without writing its error file gets one from its agent: the signal that killed
  it, or the last traceback on its stderr, or a full disk;
- after a failure, with ``launch.max_restarts`` left, every rank's agent starts its worker again
  (from the run's latest checkpoint), together: each marks its worker down, rank 0 moves the
  failed attempt's error files to errors/failure-N/ and publishes a fresh meeting port, the others
  wait for it (engine.supervisor: watching the peers, the regroup barrier, naming the failure).
  The worker sees TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_ERROR_FILE (read back here when the
  worker wrote no error file of its own), TORCHELASTIC_SIGNALS_TO_HANDLE and
  TORCH_NCCL_ASYNC_ERROR_HANDLING as under torchrun;
- the worker's stdout and stderr pass through the agent (engine.tee): into the rank's log files
  as before, and interleaved, line by line as written, into logs/rank{R}.log;
- an agent stopped because its parent (the local controller, slurmstepd) died writes that down
  (errors/controller.json) unless someone did: a run whose controller was killed says so.
A failed rank's agent exits with status 1 and no traceback of its own: the worker's error file
and its stderr say what failed."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from workbench.engine import forked
from workbench.engine.env import DistEnv
from workbench.engine.forked import Forked
from workbench.engine.hang import is_users
from workbench.engine.monitor import (
    PEER_FAILED_EXIT_CODE,
    PORT_RETRY_ENV,
    PORT_TAKEN_EXIT_CODE,
)
from workbench.engine.preempt import SIGNAL as PREEMPT_SIGNAL
from workbench.engine.rendezvous import RankContract, attempt, torchrun_env
from workbench.engine.supervisor import LOST, POLL_S, Supervisor
from workbench.engine.tee import Tee
from workbench.engine.worker import ATTEMPT_ENV, REQUEUE_EXIT_CODE
from workbench.proctree import KILL_AFTER_S, Proc, end, leave_quickly, parent_death_signal, signal_name
from workbench.runfolder import events
from workbench.runfolder.failures import (
    elastic_error,
    error_record,
    last_traceback,
    native_crash,
    reserve_error_space,
    write_controller_failure,
    write_error,
)
from workbench.runfolder.layout import RunDir, read_json, write_json_atomic
from workbench.runfolder.rankstate import killed_message, node_name
from workbench.runfolder.writer import JsonlWriter

STDERR_TAIL_BYTES = 32_000
PORT_RETRIES = 3
"""How often the ranks meet again on a fresh port when the chosen one was taken before they met."""
PORT_TAKEN = "port taken"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_agent(run_dir: str, contract: RankContract, worker_args: list[str], max_restarts: int) -> dict[str, Any]:
    """The body of a submitit task: be the agent of this rank until the run ends."""
    import submitit

    run = RunDir(run_dir)
    env = contract.export(run)
    job_key = run.start_key(str(submitit.JobEnvironment().job_id), attempt())
    agent = RankAgent(run, env, worker_args, max_restarts, job_key)
    outcome = agent.serve()
    leave_quickly()  # the worker is gone and every record written: Run.wait() waits for this process's exit
    if outcome == "requeue" and env.rank == 0:
        agent.hand_over_preemption()  # submitit: checkpoint(), requeue, exit
    if outcome == "failed":
        sys.exit(1)  # what failed is in the error files and the worker's stderr: no traceback of ours
    if outcome == "stopped":
        sys.exit(128 + agent.stop_signal)
    return {"rank": env.rank, "outcome": outcome}


class RankAgent:
    def __init__(self, run: RunDir, env: DistEnv, worker_args: list[str], max_restarts: int, job_key: str):
        self.run, self.env, self.worker_args, self.max_restarts = run, env, list(worker_args), max_restarts
        self.job_key, self.requeue = job_key, attempt()
        self.rank = env.rank
        self.worker: subprocess.Popen[bytes] | Forked | None = None
        self.proc: Proc | None = None
        self.stop_signal = 0
        self._preempt_handler: Callable[..., Any] | int | None = None
        self._stderr_from = 0
        self._alive_at = time.time()
        self._kill_after_s = KILL_AFTER_S
        self.supervisor = Supervisor(self.rank, env.world_size, lambda: bool(self.stop_signal))
        self.port_retry = 1
        """The next meeting on a fresh port, should the chosen one be taken before the ranks meet."""
        self.parent = os.getppid()
        """Whoever started this agent (the local controller, slurmstepd): its death stops the rank."""
        self.tee: Tee | None = None

    # --- the loop --------------------------------------------------------------------------------
    def serve(self) -> str:
        """Run attempts until one finishes, is stopped or requeued, or the restarts are spent."""
        parent_death_signal(signal.SIGTERM)()  # whoever started us ended: stop our worker too
        self._install_signals()
        outcome = "failed"
        for restart in range(self.max_restarts + 1):
            if restart and not self._regroup(restart):
                break
            outcome = self._attempt(restart)
            while outcome == PORT_TAKEN and self.port_retry <= PORT_RETRIES and self._meet_again(restart):
                outcome = self._attempt(restart)
            if outcome != "failed" or self.stop_signal:
                break
        return "stopped" if self.stop_signal else outcome

    def _attempt(self, restart: int) -> str:
        if self.stop_signal:
            return "stopped"
        number = self.requeue * (self.max_restarts + 1) + restart
        reserve_error_space(self.run, self.rank)
        self._stderr_from = _stderr_size()
        self.run.elastic_error(self.rank).unlink(missing_ok=True)  # an earlier attempt's
        self.worker = worker = self._start_worker(self._worker_env(restart, number))
        self.tee = Tee(worker, self.run.both_streams(self.rank))
        self.proc = Proc.of(worker.pid, group=True) or Proc(worker.pid, 0, worker.pid)
        self._record_procs(number)
        self._kill_after_s = KILL_AFTER_S
        outcome = self._watch(worker, number)
        end([self.proc], self._kill_after_s)
        worker.poll()  # reap it
        self.tee.close()
        return outcome

    def _start_worker(self, env: dict[str, str]) -> subprocess.Popen[bytes] | Forked:
        """The worker: forked from this agent when it is warm (forked from a local controller that
        imported torch: workbench.engine.forked), else a fresh process.  Either way in a session of
        its own, killed by the kernel if this agent dies."""
        args = [os.path.abspath(self.run.root), *self.worker_args]
        script_env = (self.run.read_meta() or {}).get("env")  # a script's env= (names: submit_script)
        names = [n for n in script_env if isinstance(n, str)] if isinstance(script_env, list) else []
        if forked.warm() and not forked.why_not_fork() and not forked.why_fresh(forked.engine_run(self.run), names):
            from workbench.engine import worker as worker_module

            return forked.fork_piped(lambda: worker_module.main(args), env=env, argv=[worker_module.__file__, *args])
        return subprocess.Popen(
            # the folder whole: its command line names it wherever the worker goes (workbench.launch.ours)
            [sys.executable, "-m", "workbench.engine.worker", *args], env=env, start_new_session=True,
            preexec_fn=parent_death_signal(signal.SIGKILL), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def _worker_env(self, restart: int, number: int) -> dict[str, str]:
        elastic = self.run.elastic_error(self.rank)
        elastic.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return {**os.environ, "MASTER_PORT": str(self.env.master_port), ATTEMPT_ENV: str(number),
                "TORCHELASTIC_RESTART_COUNT": str(restart), "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
                **torchrun_env(elastic),
                **({PORT_RETRY_ENV: "1"} if self.port_retry <= PORT_RETRIES else {})}

    def _watch(self, worker: subprocess.Popen[bytes] | Forked, number: int) -> str:
        self.supervisor.watch_anew()
        while True:
            code = worker.poll()
            if code is not None:
                if self.tee is not None:
                    self.tee.drain()  # its last words reach the log before they are read back
                return self._ended(code, number)
            self._alive_at = time.time()  # a death is dated here: before any peer's error about it
            if self.stop_signal:
                self.note_parent_gone()
                return "stopped"
            if self.rank and self.run.down_mark(self._port_key(number), 0).exists():  # rank 0 could not listen
                self._kill_after_s = 0.5  # waiting for a port that was never opened: nothing to save
                return PORT_TAKEN
            if self._peers_ended_it(number):
                return "failed"
            time.sleep(POLL_S)

    def _peers_ended_it(self, number: int) -> bool:
        """This rank was reported lost, or a peer failed and the worker did not stop by itself:
        the attempt is over (end() ends the worker)."""
        verdict = self.supervisor.verdict(self.run, number)
        if verdict == LOST:
            self._kill_after_s = 0.0  # silent past dist.lost_after_s, or hung: no use asking it
            self._let_peers_stop()
        return verdict is not None

    def _let_peers_stop(self, grace_s: float = 1.0) -> None:
        """Before this rank's lost or hung worker is killed, give the peers waiting for it a moment
        to see why and stop in their own words ("waiting for rank N"), not in a reset connection's."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(
                (self.run.read_status(r) or {}).get("state") == "running"
                for r in range(self.env.world_size) if r != self.rank):
            time.sleep(POLL_S)

    def _ended(self, code: int, number: int) -> str:
        if code == 0:
            return "finished"
        if code == REQUEUE_EXIT_CODE:
            return "requeue"
        if code == PORT_TAKEN_EXIT_CODE and not self.stop_signal:
            return PORT_TAKEN
        if self.stop_signal:
            return "stopped"
        if code != PEER_FAILED_EXIT_CODE:
            self._ensure_error(code, number)
        return "failed"

    # --- a worker that died without a word -------------------------------------------------------
    def _ensure_error(self, code: int, number: int) -> None:
        """Write the rank's error file from what is known: the killing signal, the last traceback
        on its stderr, a full disk."""
        error = read_json(self.run.error(self.rank))
        if isinstance(error, dict) and error.get("attempt") == number:
            return  # the worker said it itself
        stderr = self._stderr_text()
        found = elastic_error(self.run.elastic_error(self.rank)) or last_traceback(stderr)
        where = ""
        if code < 0:
            kind, message, text = "Lost", killed_message(self.rank, signal_name(code)), stderr
            what, where = native_crash(stderr, is_users)
            if what or where:  # a crash in native code, with its own words and the user's line
                message = (f"rank {self.rank}'s process was killed by {signal_name(code)} in native code"
                           + (f" at {where}" if where else "") + (f": {what}" if what else ""))
        elif found is not None:
            kind, message, text = found
        else:
            kind, message, text = "Exited", f"rank {self.rank}'s process exited with status {code}", stderr
        if _disk_full(self.run.root):
            message += f"; disk full: no space left on the filesystem of {self.run.root}"
        status = read_json(self.run.status(self.rank)) or {}
        record = {**error_record(self.rank, kind, message, text, number, node_name(), status.get("step"),
                                 exit_code=code, reported_by="agent", **({"where": where} if where else {})),
                  "time": self._alive_at}
        with contextlib.suppress(OSError):
            write_error(self.run, self.rank, record)
            self._event(events.ERROR, number, type=kind, message=message)

    def _stderr_text(self) -> str:
        """What the worker wrote to stderr in this attempt (its end)."""
        return _stderr_tail(self._stderr_from)

    def note_parent_gone(self) -> None:
        """Stopped because whoever started this agent died (the kernel's parent-death signal): write
        it down as the run's cause, unless another rank's agent (or the submitter) did."""
        if os.getppid() == self.parent:
            return  # a stop asked for (a cancel): not a death
        meta = self.run.read_meta() or {}
        who = "the local controller" if meta.get("executor") == "local" else "the job step's launcher"
        message = (f"{who} (pid {self.parent}) died while the ranks ran (killed, or it crashed): every rank "
                   f"stopped; noticed by rank {self.rank}'s agent")
        with contextlib.suppress(OSError):
            write_controller_failure(self.run, message, str(meta.get("job_id") or ""), f"rank {self.rank}'s agent",
                                     self.requeue, host=node_name(), parent_pid=self.parent)

    # --- restarting together ---------------------------------------------------------------------
    def _port_key(self, number: int) -> str:
        restart = number - self.requeue * (self.max_restarts + 1)
        return self.run.port_retry_key(self.run.restart_key(self.job_key, restart), self.port_retry)

    def _meet_again(self, restart: int) -> bool:
        """Rank 0 could not listen on the meeting port (taken by another process before the ranks
        met): every rank's worker is down, all meet on a fresh port, the same attempt starts again."""
        number = self.requeue * (self.max_restarts + 1) + restart
        self._write_status("restarting", number)
        old = self.env.master_port
        met = self.supervisor.regroup(self.run, self._port_key(number), self.env.master_addr, lead=dict)
        self.port_retry += 1
        if met is None:
            return False
        self.env = dataclasses.replace(self.env, master_port=int(met["port"]))
        if self.rank == 0:
            self._event(events.WARNING, number, message=f"port {old} was taken before the ranks met: they met "
                                                        f"again on port {self.env.master_port}")
        return True

    def _regroup(self, restart: int) -> bool:
        """Wait until every rank's worker is down, then meet at a fresh port; False if stopped."""
        number = self.requeue * (self.max_restarts + 1) + restart
        self._write_status("restarting", number)
        met = self.supervisor.regroup(self.run, self.run.restart_key(self.job_key, restart), self.env.master_addr,
                                      lead=lambda: self._record_restart(restart, number))
        if met is None:
            return False
        self.env = dataclasses.replace(self.env, master_port=int(met["port"]))
        return True

    def _record_restart(self, restart: int, number: int) -> dict[str, Any]:
        """Rank 0, every worker down: the failed attempt's errors go to errors/failure-N/, the
        restart event names them (the first is the cause)."""
        failed = self.supervisor.failures(self.run)
        self.run.archive_errors()
        self._event(events.RESTART, number, restart=restart, max_restarts=self.max_restarts,
                    failures=[{k: e.get(k) for k in ("rank", "type", "message", "step", "time")} for e in failed])
        return {}

    # --- signals ---------------------------------------------------------------------------------
    def _install_signals(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._stop)
        self._preempt_handler = signal.signal(PREEMPT_SIGNAL, self._forward_preemption)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_signal = self.stop_signal or signum

    def _forward_preemption(self, signum: int, frame: FrameType | None) -> None:
        if self.worker is not None and self.worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.worker.send_signal(signum)

    def hand_over_preemption(self) -> None:
        """Give the preemption to submitit's own handler (checkpoint(), requeue the job, exit)."""
        handler = self._preempt_handler
        if callable(handler):
            signal.signal(PREEMPT_SIGNAL, handler)
            handler(PREEMPT_SIGNAL, None)

    # --- records ---------------------------------------------------------------------------------
    def _record_procs(self, number: int) -> None:
        me = Proc.of(os.getpid())
        write_json_atomic(self.run.procs(self.rank), {
            "rank": self.rank, "host": node_name(), "attempt": number, "time": time.time(),
            "agent": me.to_dict() if me else None, "worker": self.proc.to_dict() if self.proc else None,
            "forked": isinstance(self.worker, Forked)})

    def _write_status(self, state: str, number: int) -> None:
        record = {**(read_json(self.run.status(self.rank)) or {}), "rank": self.rank, "state": state,
                  "time": time.time(), "attempt": number, "host": node_name()}
        with contextlib.suppress(OSError):
            write_json_atomic(self.run.status(self.rank), record)

    def _event(self, kind: str, number: int, **fields: Any) -> None:
        with contextlib.suppress(OSError):
            writer = JsonlWriter(self.run.events(self.rank))
            writer.write({"event": kind, "rank": self.rank, "time": time.time(), "attempt": number, **fields})
            writer.close()


def _stderr_size() -> int:
    try:
        return os.fstat(2).st_size
    except OSError:
        return 0


def _stderr_tail(start: int) -> str:
    """What was written to this process's stderr file (the rank's log) since `start`, its end."""
    try:
        path = os.readlink("/proc/self/fd/2")
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(start, size - STDERR_TAIL_BYTES))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _disk_full(path: os.PathLike[str]) -> bool:
    try:
        found = os.statvfs(path)
    except OSError:
        return False
    return found.f_bavail * found.f_frsize < 64 * 1024
