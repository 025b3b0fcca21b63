"""A warm pool's rank (workbench.Pool): the callable submitit runs per rank, and its agent.

The agent is a RankAgent whose worker is a warm one (``python -m workbench.engine.warm``): it
owns the worker's whole life as for a cold run (its own process group, killed with the agent; the
agent stops when whatever started it ends) and watches the job the worker runs like a cold
attempt: a rank that raised, a peer that failed, a neighbour's "lost" report, a cancel
(``jobs/{N}.cancel``).  Whatever ends a job other than finishing it ends the worker: the agent
writes the job's done file for its rank (and the rank's error file, as for a cold run, if the
worker died without one), then every rank starts a fresh worker and they meet at a fresh port
(generation g+1): a rank whose collective state is unknown is never used again.

A job's output and failure are a cold run's: the worker's stdout and stderr pass through this
agent's tee (engine.tee), routed into the job's run-folder logs and its logs/rank{R}.log while the
job runs; the job sees TORCHELASTIC_ERROR_FILE in its own run folder (read back here when it died
without an error of its own) and torchrun's other variables.  A meeting port taken before the
ranks met ends the generation without counting as a failed start: they meet again on a fresh one.

Any agent that starts a new generation marks its worker down for the meeting ``gen{g}``
(engine.supervisor's regroup barrier, as after a cold run's failure); the others see it and
follow.  Rank 0 then notes every job before the next one as done for every rank and publishes
the port and the next job number.  The pool ends when pool.json says closed (Pool.close,
or rank 0's agent after ``idle_timeout_s`` without a job)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from typing import Any

from workbench.engine import forked
from workbench.engine.agent import PORT_RETRIES, STDERR_TAIL_BYTES, RankAgent, _stderr_tail
from workbench.engine.monitor import PEER_FAILED_EXIT_CODE, PORT_TAKEN_EXIT_CODE
from workbench.engine.rendezvous import RankContract, torchrun_env
from workbench.engine.supervisor import POLL_S
from workbench.engine.tee import TEE_MARK_ENV, Tee, new_mark
from workbench.engine.warm import GENERATION_ENV, NEXT_JOB_ENV
from workbench.proctree import Proc, end, parent_death_signal
from workbench.runfolder.layout import PoolDir, RunDir, read_json, write_json_atomic
from workbench.runfolder.private import UMASK, read_bounded

DEFAULT_IDLE_TIMEOUT_S = 1800.0
MAX_FAILED_STARTS = 3
"""A rank whose warm worker dies this many times in a row before it is up closes the pool."""


class PoolEntry:
    """One rank of a pool: its agent, and through it a warm worker, until the pool closes."""

    def __init__(self, pool_dir: str, contract: RankContract):
        self.pool_dir, self.contract = pool_dir, contract

    def __call__(self) -> dict[str, Any]:
        import submitit

        os.umask(UMASK)
        pool = PoolDir(self.pool_dir)
        env = self.contract.export(pool)
        agent = PoolAgent(pool, env, str(submitit.JobEnvironment().job_id))
        return {"rank": env.rank, "outcome": agent.serve()}


class PoolAgent(RankAgent):
    def __init__(self, pool: PoolDir, env: Any, job_key: str):
        super().__init__(pool, env, [], 0, job_key)
        self.pool = pool
        self.generation, self.next_job = 0, 0
        self._failed_starts = 0
        self.job: dict[str, Any] | None = None
        """The job the worker runs now (taken/rank{R}.json), with its number."""
        meta = pool.read_meta() or {}
        self.idle_timeout_s = float(meta.get("idle_timeout_s") or DEFAULT_IDLE_TIMEOUT_S)

    def serve(self) -> str:
        parent_death_signal(signal.SIGTERM)()  # whoever started us ended: stop our worker too
        self._install_signals()
        while True:
            outcome = self._generation()
            if outcome in ("stopped", "closed"):
                return outcome
            self.generation += 1
            if not self._regroup_pool():
                return "stopped"

    def _generation(self) -> str:
        """One warm worker, through as many jobs as it serves."""
        self.job, self.run = None, self.pool
        mark = new_mark()
        env = {**os.environ, "MASTER_PORT": str(self.env.master_port), NEXT_JOB_ENV: str(self.next_job),
               GENERATION_ENV: str(self.generation), TEE_MARK_ENV: mark,
               **torchrun_env(self.pool.elastic_error(self.rank))}  # a job sets its own error file
        self.worker = worker = self._start_warm_worker(env)
        self.tee = Tee(worker, None, mark)  # each job's output into its run folder's logs, as a cold rank's
        self.proc = Proc.of(worker.pid, group=True) or Proc(worker.pid, 0, worker.pid)
        self._record_procs(self.generation)
        self._kill_after_s = 5.0
        outcome = self._watch_jobs(worker)
        end([self.proc], self._kill_after_s)
        worker.poll()
        self.tee.close()
        if outcome not in ("stopped", "closed"):  # down for the next generation before the job is said done:
            key = self.pool.generation_key(self.generation + 1)  # no worker of this one takes a later job
            self.pool.mark_down(key, self.rank)
        self._job_over(outcome)
        return outcome

    def _start_warm_worker(self, env: dict[str, str]) -> subprocess.Popen[bytes] | forked.Forked:
        """The warm worker: forked from this agent when it is warm (its controller imported torch,
        not torch._dynamo: a pool runs user code), else a fresh process; either way in a session of
        its own, killed by the kernel if this agent dies."""
        command = [sys.executable, "-m", "workbench.engine.warm", os.path.abspath(self.pool.root)]
        if forked.warm() and not forked.why_not_fork() and not forked.why_fresh(engine=False):
            from workbench.engine import warm

            return forked.fork_piped(lambda: warm.main(command[3:]), env=env, argv=[warm.__file__, *command[3:]],
                                     command_line=command if forked.fits(command) else None)
        return subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=parent_death_signal(signal.SIGKILL))

    def _watch_jobs(self, worker: subprocess.Popen[bytes] | forked.Forked) -> str:
        self.supervisor.watch_anew()
        while True:
            code = worker.poll()
            if code is not None:
                if self.tee is not None:
                    self.tee.drain()  # its last words reach the job's logs before they are read back
                return self._worker_ended(code)
            self._alive_at = time.time()
            if self.stop_signal:
                return "stopped"
            if (self.pool.read_meta() or {}).get("closed"):
                return "closed"
            if self.supervisor.regrouping(self.pool, self.pool.generation_key(self.generation + 1)):
                return "regroup"
            if self._follow_job() is None:
                self.supervisor.watch_anew()
                if self.rank == 0 and self._close_if_idle():
                    return "closed"
            elif self.pool.job_cancel(self.job["job"]).exists():  # type: ignore[index]
                return "cancelled"
            elif self.job.get("run_dir") and self._peers_ended_it(0):  # type: ignore[union-attr]
                return "failed"
            time.sleep(POLL_S)

    def _follow_job(self) -> dict[str, Any] | None:
        """The job the worker is in now (None between jobs); the run folder watched follows it."""
        taken = read_json(self.pool.taken(self.rank))
        number = taken.get("job") if isinstance(taken, dict) else None
        if not isinstance(number, int) or number < self.next_job or self.pool.done(number, self.rank).exists():
            self.job, self.run = None, self.pool
            return None
        self.job = taken
        self.run = RunDir(taken["run_dir"]) if taken.get("run_dir") else self.pool
        return self.job

    def _worker_ended(self, code: int) -> str:
        ready = read_json(self.pool.ready(self.rank)) or {}
        if code == PORT_TAKEN_EXIT_CODE and self.port_retry <= PORT_RETRIES:
            self._port_taken()  # not the worker's fault: the ranks meet again at a fresh port
        elif ready.get("generation") != self.generation:  # it died warming up: not a job's fault
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                self.pool.update_meta(closed=time.time(), closed_by=f"rank {self.rank}'s warm worker failed to start "
                                      f"{MAX_FAILED_STARTS} times (exit status {code}; see {self.pool.logs})")
                return "closed"
        else:
            self._failed_starts = 0
        self._follow_job()
        if self.job is not None and self.job.get("run_dir") and code != PEER_FAILED_EXIT_CODE \
                and code not in (128 + signal.SIGTERM, 128 + signal.SIGHUP) and not self.stop_signal:
            self._ensure_error(code, 0)
        return "failed"

    def _port_taken(self) -> None:
        """Rank 0 could not listen on the meeting port (another process took it before the ranks
        met): the new generation meets at a fresh one (engine.supervisor's regroup); say so."""
        self.port_retry += 1
        message = (f"port {self.env.master_port} was taken before the ranks met: they met again on a fresh "
                   f"port (generation {self.generation + 1})")
        self.pool.update_meta(lambda meta: meta.setdefault("warnings", []).append(message))

    def _job_over(self, outcome: str) -> None:
        """The job the worker was in ended with it: its done file for this rank."""
        if self.job is None:
            return
        number = int(self.job["job"])
        if not self.pool.done(number, self.rank).exists():
            write_json_atomic(self.pool.done(number, self.rank), {
                "outcome": outcome, "by": "agent", "time": time.time(),
                "error": None if outcome != "regroup" else "another rank's worker ended: this one was restarted"})
        self.next_job = max(self.next_job, number + 1)
        self.job, self.run = None, self.pool

    def _stderr_text(self) -> str:
        """A pool worker's stderr during a job is in the run folder's log (warm.output_to)."""
        if self.job is not None and self.job.get("run_dir"):
            path = RunDir(self.job["run_dir"]).pool_log(int(self.job["job"]), self.rank, "err")
            try:
                return read_bounded(path, STDERR_TAIL_BYTES, tail=True).decode(errors="replace")
            except OSError:
                return ""
        return _stderr_tail(self._stderr_from)

    # --- idle and closed -------------------------------------------------------------------------
    def _close_if_idle(self) -> bool:
        """Rank 0: no job for idle_timeout_s and none waiting: mark the pool closed (under the lock
        Pool.submit holds, so a job is either queued before or refused after)."""
        if (read_json(self.pool.ready(self.rank)) or {}).get("generation") != self.generation:
            return False  # still warming up: idle from when it is up
        last = max([self._mtime(self.pool.job(n)) for n in self.pool.job_numbers()[-1:]] +
                   [self._mtime(self.pool.done(n, self.rank)) for n in self.pool.job_numbers()[-1:]] +
                   [self._mtime(self.pool.ready(self.rank))])
        if time.time() - last < self.idle_timeout_s:
            return False
        with self.pool.locked("submit"):
            numbers = self.pool.job_numbers()
            waiting = numbers and not self.pool.done(numbers[-1], self.rank).exists()
            if waiting:
                return False
            self.pool.update_meta(closed=time.time(), closed_by=f"idle for {self.idle_timeout_s:.0f} s")
        return True

    @staticmethod
    def _mtime(path: Any) -> float:
        try:
            return float(path.stat().st_mtime)
        except OSError:
            return 0.0

    # --- a new generation ------------------------------------------------------------------------
    def _regroup_pool(self) -> bool:
        """Every rank's worker is down: meet at a fresh port, agree on the next job."""
        met = self.supervisor.regroup(self.pool, self.pool.generation_key(self.generation), self.env.master_addr,
                                      lead=lambda: {"next_job": self._close_jobs_before()})
        if met is None:
            return False
        self.env = dataclasses.replace(self.env, master_port=int(met["port"]))
        self.next_job = int(met["next_job"])
        return True

    def _close_jobs_before(self) -> int:
        """The job after every one some rank is done with; each of those is done for every rank."""
        done = self.pool.done_numbers()
        nxt = max([self.next_job, *(n + 1 for n in done)])
        for number in (n for n in self.pool.job_numbers() if n < nxt):
            for rank in range(self.env.world_size):
                if not self.pool.done(number, rank).exists():
                    write_json_atomic(self.pool.done(number, rank), {
                        "outcome": "failed", "by": "agent", "time": time.time(),
                        "error": "the pool restarted its ranks before this rank ran the job"})
        return nxt
