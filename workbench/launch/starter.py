"""The warm starters of a submitting process: children of it that have imported torch and the local
controller once, from which each later local run's controller is forked.

A run's controller imports torch once for all of its ranks (workbench.engine.forked).  A process that
starts many runs (a notebook kernel, a sweep's driver, a pool's owner, a test session) would still pay
that import, about 3-4 CPU-seconds, for every run; with a starter it pays it once:

- There are two kinds, as there are two kinds of controller: one for the engine's runs (torch and
  torch._dynamo imported) and one for user code, scripts, functions and pools (torch without
  torch._dynamo: forked.ENGINE_PRELOAD says why).  Each is started with the second local run of its
  kind (a script that submits one run pays no import for a starter it would not use), and that run's
  controller and every later one of its kind are forked from it: a run submitted while it is still
  importing waits for it (up to REPLY_S), since a fresh controller would import as long, for nothing.
  So a kernel, a sweep or a test session imports torch twice at most, however many runs it starts at
  once.  `workbench run` and other one-run callers (`stop_with_caller`) start none.
- A forked controller gets what Popen would give a fresh one: its environment, working folder, umask,
  stdin and log, its own session (it outlives the kernel as before), the signals and RNG seeds of a
  fresh process, and the command line a fresh one shows (`python -m workbench.launch.local_controller
  <run>/logs`), which workbench.launch.ours checks before any signal.
- It is used only while it matches: a run whose environment differs from the starter's in a variable
  that bears on what it imported, or one submitted after workbench's files changed on disk, gets a
  fresh controller.  What bears: a variable the starter's imports read from Python (noted as they
  ran), or one torch, its native libraries or the interpreter read as they load (forked.LOAD_TIME_ENV);
  not what each run sets, nor what the starter's own imports set (torch._dynamo sets
  TORCHINDUCTOR_CACHE_DIR).  A forked controller gets the run's whole environment.
  A starter of older code is replaced (and the run forked from the new one); one of another
  environment when a second run in a row has the new one.
- A starter leaves with the submitting process: when the socket to it closes, or within a second of
  its parent's death.  (Not by a parent-death signal: that comes when the *thread* that started the
  starter ends, and a sweep's driver or the form's submit runs in a thread of its own.)  It reaps the
  controllers it forked and tells their exit status on request (a
  controller killed by a signal is written down by its submitter: Run._controller_seen_dying).
- Nothing else reaches it: it listens on one end of a socket pair that only its submitter holds.

Started by ``python -m workbench.launch.starter FD KIND PADDING`` (KIND: engine or user; PADDING
reserves room in its argument area for a forked controller's command line)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from workbench.engine import forked
from workbench.engine.rendezvous import RUN_DIR_ENV
from workbench.proctree import Proc

PADDING = 4096
"""Bytes of argument area the starter reserves for a controller's command line (a run folder's path)."""
PER_RUN = (RUN_DIR_ENV, "PYTEST_CURRENT_TEST")
"""Environment variables that differ from run to run without bearing on what is imported: what each
run's controller gets of its own (with every SUBMITIT_*), and the test pytest is running."""
REPLY_S = 30.0
"""How long the submitting side waits for the starter to be ready, or for its answer, before it starts
a fresh controller."""
_HEADER = struct.Struct("!I")


# --- the submitting side ----------------------------------------------------------------------------
class StartedController(forked.Forked):
    """A controller forked by the starter, handled as the Popen of a fresh one is: its exit status
    comes from the starter that reaps it."""

    def __init__(self, pid: int, starter: Starter):
        super().__init__(pid)
        self.starter = starter
        self.args = ["<controller forked by the starter>"]

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.starter.exit_status(self.pid)
        return self.returncode


class Starter:
    """This process's handle on a starter (one of each kind at a time: `controller`); `engine`: it
    imported torch._dynamo too, for the engine's runs."""

    def __init__(self, env: dict[str, str], engine: bool = True):
        self.env, self.code_stamp, self.engine = _comparable(env), code_stamp(), engine
        ours, theirs = socket.socketpair()
        ours.settimeout(REPLY_S)
        self.sock, self.lock, self.ready = ours, threading.Lock(), False
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "workbench.launch.starter", str(theirs.fileno()), _KINDS[engine],
                 " " * PADDING],
                env=env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)  # not a parent-death signal: see serve
        self.statuses: dict[int, int] = {}
        self.env_after = self.env  # its environment once its imports are done (told when it is ready)
        self.read: set[str] | None = None  # the variables its imports read (told when it is ready)

    def matches(self, env: dict[str, str]) -> bool:
        """Started from this environment, in every variable that bears on what it imported (all of
        them until it is ready), or has it since its own imports set what they set (importing
        torch._dynamo sets TORCHINDUCTOR_CACHE_DIR, as does a kernel that imports it later), and from
        the code on disk now."""
        bearing = _bearing(_comparable(env), self.read)
        return (bearing in (_bearing(self.env, self.read), _bearing(self.env_after, self.read))
                and code_stamp() == self.code_stamp)

    def usable(self, env: dict[str, str], wait_s: float = 0.0) -> bool:
        """Alive, matching `env` and the code on disk, and ready (its imports done), waiting up to
        `wait_s` for a starter still importing: a fresh controller would import as long, and for
        nothing."""
        if self.process.poll() is not None or not self.matches(env):
            return False
        if not self.ready:
            readable, _, _ = select.select([self.sock], [], [], wait_s)
            if not readable:
                return False
            with self.lock:
                try:
                    told = _receive(self.sock)[0]
                except OSError:
                    return False  # it died while importing
            self.ready = bool(told.get("ready"))
            self.env_after = _comparable(told.get("env") or self.env)
            self.read = set(told["read"]) if isinstance(told.get("read"), list) else None
        return self.ready and self.matches(env)

    def fork_controller(self, command: list[str], env: dict[str, str], stdin: int, log: int,
                        ) -> StartedController | None:
        """A controller for `command` (python -m workbench.launch.local_controller FOLDER), or None
        where the starter cannot start it (then start a fresh one)."""
        request = {"op": "start", "folder": command[-1], "command_line": command, "env": env, "cwd": os.getcwd(),
                   "umask": _umask()}
        with self.lock:
            try:
                _send(self.sock, request, [stdin, log])
                reply, _ = _receive(self.sock)
            except OSError:
                return None
        pid = reply.get("pid")
        return StartedController(int(pid), self) if isinstance(pid, int) else None

    def exit_status(self, pid: int) -> int | None:
        """The controller's exit status once it ended (None while it runs; 0 when the starter is gone
        and the controller too: its status was lost with it)."""
        if pid in self.statuses:
            return self.statuses[pid]
        with self.lock:
            try:
                _send(self.sock, {"op": "status", "pid": pid}, [])
                reply, _ = _receive(self.sock)
            except OSError:
                proc = Proc.of(pid)
                reply = {"code": None if proc is not None and proc.alive() else 0}
        code = reply.get("code")
        if isinstance(code, int):
            self.statuses[pid] = code
        return code if isinstance(code, int) else None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()  # the starter leaves when its end closes
        with contextlib.suppress(Exception):
            self.process.wait(5)


_KINDS = {True: "engine", False: "user"}
_starters: dict[bool, Starter | None] = {True: None, False: None}
"""This process's starter of each kind (engine: True), once started."""
_current_lock = threading.Lock()
_local_runs = {True: 0, False: 0}
"""Local runs of each kind this process started (the kind's starter is started with the second)."""
_env_runs: dict[bool, tuple[dict[str, str], int]] = {True: ({}, 0), False: ({}, 0)}
"""Per kind: the environment of the last run, and how many runs in a row had it."""
START_WITH_RUN = 2


def controller(command: list[str], env: dict[str, str], stdin: int, log: int,
               stop_with_caller: bool, engine: bool = True) -> StartedController | None:
    """This run's controller forked from this process's starter of its kind (`engine`: the engine's
    run, else user code), or None: start a fresh one.  A starter that died or imported older code
    than is on disk now is replaced, and this run forked from the new one.  One whose environment
    differs from this run's is kept for the runs that match it, and replaced by one started with the
    new environment at the second run in a row that has it (the submitting process changed its
    environment for good: a cell's `os.environ[...] = ...`).  A run waits for a starter that is still
    importing (REPLY_S at most).  A one-run caller's run (`stop_with_caller`: its controller must die
    with the caller) neither uses nor starts one."""
    _local_runs[engine] += 1
    comparable = _comparable(env)
    last, count = _env_runs[engine]
    _env_runs[engine] = (comparable, count + 1 if comparable == last else 1)
    if stop_with_caller or forked.why_not_fork() == f"{forked.SWITCH_ENV}=0" or not sys.platform.startswith("linux"):
        return None  # a one-run caller's controller dies with the caller: a fresh one, its child
    with _current_lock:
        starter = _starters[engine]
        if starter is not None and (starter.process.poll() is not None or code_stamp() != starter.code_stamp
                                    or (not starter.matches(env) and _env_runs[engine][1] >= START_WITH_RUN)):
            starter.close()  # gone, older code than is on disk, or a second run in another environment: replace it
            _starters[engine] = starter = None
        if starter is None and _local_runs[engine] >= START_WITH_RUN:
            with contextlib.suppress(OSError):
                _starters[engine] = starter = Starter(env, engine)
        if starter is not None and starter.usable(env, wait_s=REPLY_S):
            return starter.fork_controller(command, env, stdin, log)  # None: it could not; a fresh one
        return None


def starters() -> list[Starter]:
    """This process's starters (of either kind) started so far."""
    return [s for s in _starters.values() if s is not None]


def code_stamp() -> float:
    """The newest modification time of workbench's own files: a starter that imported older code
    than what is on disk now is not used."""
    root = Path(__file__).resolve().parent.parent
    return max((p.stat().st_mtime for p in root.rglob("*.py")), default=0.0)


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_RUN and not k.startswith("SUBMITIT_")}


_LOCALE_ENV = ("LANG", "LC_")
"""What the interpreter reads as it starts besides PYTHON*: its locale (the encoding of its streams)."""


def _bearing(env: dict[str, str], read: set[str] | None) -> dict[str, str]:
    """The variables of `env` that bear on what a starter imported: those its imports read from Python
    (`read`; None: every variable), and those torch, its native libraries and the
    interpreter read as they load (forked.LOAD_TIME_ENV, as for a script's forked ranks; the locale).  A forked
    controller gets the run's whole environment; only what was read before the fork could differ."""
    if read is None:
        return env
    return {k: v for k, v in env.items() if k in read or k.upper().startswith(forked.LOAD_TIME_ENV + _LOCALE_ENV)}



class _Reads(os._Environ):
    """os.environ, noting each variable read by name through it (os.environ[...], .get, `in`,
    os.getenv).  A scan of them all (tqdm looks for its TQDM_* settings so) is not a read of each."""

    def __init__(self, real: Any, seen: set[str]):
        self.__dict__.update(vars(real))  # the same variables, and putenv as before
        self.seen = seen

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(str(key))
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return super().__contains__(key)

    def items(self) -> Any:
        return [(self.decodekey(k), self.decodevalue(v)) for k, v in self.__dict__["_data"].items()]


def _preload_noting_reads(engine: bool) -> set[str]:
    """forked.preload(engine), returning the environment variables its imports read from Python."""
    real, seen = os.environ, set[str]()
    os.environ = _Reads(real, seen)  # noqa: B003 - the same variables, read through a noting view
    try:
        forked.preload(engine)
    finally:
        os.environ = real  # noqa: B003 - the view is put back
    return seen


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    data = json.dumps(message).encode()
    socket.send_fds(sock, [_HEADER.pack(len(data)) + data], fds)


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 8)
    if len(head) < _HEADER.size:
        raise OSError("the other end closed")
    (size,) = _HEADER.unpack(head)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("the other end closed")
        data += chunk
    return json.loads(data), list(fds)


# --- the starter itself -----------------------------------------------------------------------------
def serve(sock: socket.socket, engine: bool = True) -> None:
    """Import what every controller and rank of its kind imports (`engine`: torch._dynamo too), say
    so, then fork a controller per request and tell exit statuses, until the submitting side closes
    its end."""
    from workbench.launch import local_controller

    read = _preload_noting_reads(engine)
    children: dict[int, forked.Forked] = {}

    def reap(signum: int, frame: Any) -> None:  # at once: an ended controller is not left a zombie
        for child in list(children.values()):
            child.poll()

    signal.signal(signal.SIGCHLD, reap)
    _send(sock, {"ready": True, "pid": os.getpid(), "env": dict(os.environ), "read": sorted(read)}, [])
    parent = os.getppid()
    while True:
        readable, _, _ = select.select([sock], [], [], 1.0)
        if os.getppid() != parent:
            return  # the submitting process died (its end of the socket may live on in a child of it)
        for child in list(children.values()):
            child.poll()  # reap the ended
        if not readable:
            continue
        try:
            request, fds = _receive(sock)
        except OSError:
            return  # the submitting process closed its end, or died
        try:
            reply = _handle(request, fds, children, local_controller.main, local_controller.__file__, sock)
        finally:
            for fd in fds:
                os.close(fd)
        _send(sock, reply, [])


def _handle(request: dict[str, Any], fds: list[int], children: dict[int, forked.Forked], main: Any,
            main_file: str, sock: socket.socket) -> dict[str, Any]:
    if request.get("op") == "status":
        child = children.get(int(request["pid"]))
        return {"code": child.poll() if child is not None else 0}
    command_line = [str(a) for a in request["command_line"]]
    if len(fds) != 2 or forked.why_not_fork() or not forked.fits(command_line):
        return {"pid": None}
    folder = str(request["folder"])
    child = forked.fork(lambda: main([folder]), env=dict(request["env"]), argv=[main_file, folder], stdin=fds[0],
                        stdout=fds[1], stderr=fds[1], new_session=True, cwd=str(request["cwd"]),
                        umask=int(request["umask"]), command_line=command_line, close=[sock.fileno()])
    children[child.pid] = child
    return {"pid": child.pid}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    with socket.socket(fileno=int(args[0])) as sock:
        serve(sock, engine=args[1] != _KINDS[False])


if __name__ == "__main__":
    main()
