"""Ranks started warm: forked from a process that has imported torch, instead of a fresh ``python``
that imports it again.

A cold rank's start is mostly imports: `import torch` and the torch._dynamo that DDP's constructor
imports, about 4 of the 5 CPU-seconds each rank's processes spend before the first step here.  The
local controller imports them once (`preload`), forks each rank's agent, and each agent forks its
worker: N ranks pay for one import and share its memory pages.  That holds for an engine run, a
script and a function alike (a fresh script worker imports torch before the script runs anyway).

The child gets what a fresh process would have: its own session where asked, a parent-death
signal, stdin/stdout/stderr on the given descriptors, the given environment and sys.argv, the
signal handlers of a fresh interpreter, fresh RNG seeds (torch's and numpy's; Python's `random`
reseeds itself at a fork), an empty atexit list.  It leaves as the interpreter would (`_leave`):
its threads joined, its atexit handlers run, every file it left open flushed, then os._exit.  The
caller returns only once the child has taken its session and descriptors, as Popen returns only
after the exec.

Where forking is not safe the caller starts a fresh process as before (`why_not_fork` says why): a
Python thread running besides the caller's (a fork copies only the calling thread, not the locks
the others hold), CUDA initialised here or its driver loaded (a forked child could not use it), not
Linux, or WORKBENCH_FORK=0.  User code is forked only from a process that has not imported
torch._dynamo (ENGINE_PRELOAD): a run of it starts its own controller, not one from the starter.  A
script given environment variables that torch or the interpreter reads when it loads (`why_fresh`:
TORCH*, OMP_*, LD_*, PYTHON*, ...) gets a fresh worker, which loads with them."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import importlib
import io
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import IO, Any

from workbench.proctree import parent_death_signal

SWITCH_ENV = "WORKBENCH_FORK"
"""Set to 0 to start every agent and worker as a fresh process."""
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.distributed.fsdp", "workbench.engine.worker",
           "workbench.engine.rank")
"""What every rank imports in any case."""
ENGINE_PRELOAD = ("torch._dynamo",)
"""What an engine rank imports besides (DDP's constructor asks torch._dynamo for its mode).  Not for
user code: a child forked after torch._dynamo was imported, whose code frees a DDP model's gloo group
(a script's globals going away), can deadlock there: the group's destructor joins its work thread
holding the GIL, and that thread waits for the GIL to free the work (seen in 3 of 7 bare forks of
such a script, and never with torch._dynamo imported after the fork)."""
LOAD_TIME_ENV = ("TORCH", "PYTORCH", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_", "PYTHON", "MALLOC_")
"""Prefixes of environment variables read when torch, its native libraries or the interpreter load: a
script run that sets one for its ranks gets fresh workers, which load with it (OMP_NUM_THREADS
alone is told to a loaded torch too, by dist.threads_per_rank's rule)."""
_WRITABLE = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
"""What holds written data until flushed: a text file flushes into its buffered binary file."""
_FRESH_IGNORED = (signal.SIGPIPE, signal.SIGXFSZ)
"""Signals a fresh CPython ignores (it sets SIG_IGN for them at start-up)."""


def preload(engine: bool = True) -> None:
    """Import what every rank imports (`engine`: and what an engine rank imports besides), once, in
    the process that forks the ranks; then keep the garbage collector off those objects (gc.freeze),
    so that the children's collections do not write to, and so copy, the pages they share."""
    for name in PRELOAD + (ENGINE_PRELOAD if engine else ()):
        importlib.import_module(name)
    gc.collect()
    gc.freeze()


def warm() -> bool:
    """This process has torch imported (it was preloaded, or forked from one that was)."""
    return "torch" in sys.modules


def why_fresh(engine: bool, env_names: Sequence[str] = ()) -> str:
    """Why a worker forked from this process would not behave as a fresh one ("" when it would):
    for user code (not `engine`), torch._dynamo imported here (ENGINE_PRELOAD says why), or an
    extra environment variable (a script's `env=`) that torch reads as it loads."""
    if not engine and "torch._dynamo" in sys.modules:
        return "torch._dynamo was imported before the fork"
    late = sorted(name for name in env_names if name.upper().startswith(LOAD_TIME_ENV) and name != "OMP_NUM_THREADS")
    return f"{', '.join(late[:3])} set for the ranks: read as torch loads" if late else ""


def engine_run(run: Any) -> bool:
    """The run (a RunDir) trains with workbench's engine (a task), not a script or function of the
    user's, and is not a warm pool."""
    from workbench.config.sections import JobConfig
    from workbench.config.tasknames import runs_own_code
    from workbench.runfolder.layout import PoolDir

    if PoolDir(run.root).meta.exists():
        return False  # a warm pool runs user code too (scripts, functions, %%ranks cells)
    try:
        return not runs_own_code(JobConfig.from_yaml(run.config).task.name)
    except (OSError, ValueError):
        return False


def why_not_fork() -> str:
    """Why a child cannot be forked from this process now ("" when it can)."""
    if os.environ.get(SWITCH_ENV, "1").strip() == "0":
        return f"{SWITCH_ENV}=0"
    if not sys.platform.startswith("linux"):
        return "forking after importing torch is safe on Linux only"  # macOS: the Objective-C runtime
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        return f"threads running ({', '.join(others[:3])})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in this process"
    if _driver_loaded():
        return "the CUDA driver is loaded in this process"  # something called CUDA: its children could not
    return ""


def _driver_loaded() -> bool:
    """libcuda is mapped into this process: the CUDA runtime was called (it loads the driver lazily, at
    its first call), and a forked child's CUDA calls would fail."""
    try:
        with open("/proc/self/maps") as fh:
            return any("libcuda.so" in line for line in fh)
    except OSError:
        return False


class Forked:
    """A forked child, handled as a subprocess.Popen is (pid, poll, wait, send_signal, returncode,
    stdout/stderr as the pipes' read ends where asked for)."""

    def __init__(self, pid: int, stdout: IO[bytes] | None = None, stderr: IO[bytes] | None = None):
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None
        self.args = [f"<forked {pid}>"]

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 255
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                import subprocess

                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork(target: Callable[[], int | None], *, env: dict[str, str], argv: Sequence[str], stdin: int | None = None,
         stdout: int | None = None, stderr: int | None = None, new_session: bool = False,
         death_signal: int | None = None, unbuffered: bool = False, cwd: str | None = None,
         umask: int | None = None, command_line: Sequence[str] | None = None, close: Sequence[int] = ()) -> Forked:
    """Run `target()` in a forked child as described above; its return value is the exit status.
    `stdin`/`stdout`/`stderr`: descriptors for the child's 0/1/2 (None: this process's);
    `unbuffered`: its sys.stdout and sys.stderr unbuffered, as under ``python -u``; `cwd`, `umask`:
    its working folder (also sys.path[0] where that was this one's, as ``python -m`` has it) and
    umask; `command_line`: what /proc/PID/cmdline (ps, workbench.launch.ours) shows for it, which
    must fit in this process's (see `fits`); `close`: descriptors of this process the child must not hold."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(ready_r)
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        _child(target, env, argv, (stdin, stdout, stderr), new_session, death_signal, unbuffered, ready_w,
               cwd, umask, command_line)
    os.close(ready_w)
    with open(ready_r, "rb") as ready:
        ready.read(1)  # set up (or died trying: the pipe closes either way)
    return Forked(pid)


def fork_piped(target: Callable[[], int | None], *, env: dict[str, str], argv: Sequence[str],
               command_line: Sequence[str] | None = None) -> Forked:
    """`fork` as a rank's agent starts its worker (Popen with stdout and stderr piped, a session of
    its own, killed by the kernel if this process dies): the pipes' read ends are the returned
    child's stdout and stderr, and the child holds neither."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        child = fork(target, env=env, argv=argv, stdout=out_w, stderr=err_w, new_session=True,
                     death_signal=signal.SIGKILL, command_line=command_line, close=[out_r, err_r])
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    child.stdout = open(out_r, "rb", buffering=0)  # noqa: SIM115 - closed by the reader (engine.tee)
    child.stderr = open(err_r, "rb", buffering=0)  # noqa: SIM115
    return child


def _child(target: Callable[[], int | None], env: dict[str, str], argv: Sequence[str],
           fds: tuple[int | None, int | None, int | None], new_session: bool, death_signal: int | None,
           unbuffered: bool, ready_w: int, cwd: str | None, umask: int | None,
           command_line: Sequence[str] | None) -> None:
    code = 1
    try:
        parent = os.getppid()
        if command_line is not None:
            _show_as(command_line)
        if umask is not None:
            os.umask(umask)
        if cwd is not None:
            if sys.path and sys.path[0] == os.getcwd():
                sys.path[0] = cwd
            os.chdir(cwd)
        if new_session:
            os.setsid()
        if death_signal is not None:
            parent_death_signal(death_signal)()
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)
        _fresh_signals()
        for fd, target_fd in zip(fds, (0, 1, 2), strict=True):
            if fd is not None and fd != target_fd:
                os.dup2(fd, target_fd)
        for fd in {fd for fd in fds if fd is not None and fd > 2}:
            os.close(fd)
        if unbuffered:
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "wb", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "wb", closefd=False), write_through=True,
                                          errors="backslashreplace")
        os.environ.clear()
        os.environ.update(env)
        sys.argv = list(argv)
        atexit._clear()  # the parent's handlers are the parent's
        gc.freeze()  # and so are its objects: flush_open_files must not write a parent's buffers again
        _fresh_rngs()
        os.write(ready_w, b"1")
        os.close(ready_w)
        code = _exit_code(target)
    except BaseException:  # noqa: BLE001 - a child never returns into its parent's code
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        _leave()
        if code == -signal.SIGINT:  # as CPython leaves after an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


def _leave() -> None:
    """What CPython's exit does before the process ends, in its order: wait for the threads that are
    not daemons (a script's writer thread finishes its work), run the atexit handlers, flush every
    file still open (the teardown closes them: a script's log written without flush or close keeps
    its last lines: `flush_open_files`, before the collection), collect the garbage (its
    finalizers run), flush the standard streams."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        logging.shutdown()  # what the interpreter's exit would flush (its atexit handler was the parent's)
    flush_open_files()
    with contextlib.suppress(BaseException):
        gc.collect()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(BaseException):
            stream.flush()  # type: ignore[union-attr]


def flush_open_files() -> None:
    """Flush every file this process wrote and left open, reachable or not, as `python script.py`'s
    teardown would.  A script run through runpy (a rank's worker) has its globals in a reference
    cycle (its functions hold them), which the exit collects in no set order: a buffered file's raw
    file can be closed first and its data lost (bpo-17852).  A forked child's inherited objects are
    frozen (the parent's files, whose pending data the parent writes) and not listed."""
    with contextlib.suppress(BaseException):
        for obj in gc.get_objects():
            if issubclass(type(obj), _WRITABLE):  # type(), not isinstance: a proxy's __class__ may raise
                with contextlib.suppress(BaseException):
                    if not obj.closed:
                        obj.flush()


def _argument_area() -> tuple[int, int]:
    """Where this process's arguments lie in its memory (/proc/self/stat fields 48 and 49)."""
    with open("/proc/self/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[45]), int(fields[46])  # fields 48, 49 counted from pid (1) and comm (2)


def fits(command_line: Sequence[str]) -> bool:
    """`command_line` can be shown as a child's (no longer than this process's own arguments)."""
    start, end = _argument_area()
    return len(_encoded(command_line)) <= end - start


def _encoded(command_line: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(arg) + b"\0" for arg in command_line)


def _show_as(command_line: Sequence[str]) -> None:
    """Overwrite this process's arguments in place (as setproctitle does, without moving them), the
    rest of their area zeroed: /proc/PID/cmdline then reads `command_line`."""
    import ctypes

    start, end = _argument_area()
    data = _encoded(command_line)
    if len(data) > end - start:
        raise ValueError(f"command line of {len(data)} bytes does not fit in {end - start}")
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def _exit_code(target: Callable[[], int | None]) -> int:
    """What `python -c 'sys.exit(target())'` would exit with (-SIGINT: a KeyboardInterrupt, after
    which the child kills itself with SIGINT once its atexit handlers ran, as CPython does)."""
    try:
        result = target()
    except SystemExit as exc:
        result = exc.code  # type: ignore[assignment]
    except KeyboardInterrupt:
        traceback.print_exc()
        return -signal.SIGINT
    if result is None:
        return 0
    if isinstance(result, int):
        return result & 0xFF
    print(result, file=sys.stderr)
    return 1


def _fresh_signals() -> None:
    """Every signal handled as a fresh interpreter handles it, nothing blocked, no faulthandler."""
    with contextlib.suppress(Exception):
        faulthandler.disable()
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(Exception):
            faulthandler.unregister(sig)
        with contextlib.suppress(OSError, ValueError):
            if sig == signal.SIGINT:
                signal.signal(sig, signal.default_int_handler)
            elif sig in _FRESH_IGNORED:
                signal.signal(sig, signal.SIG_IGN)
            else:
                signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _fresh_rngs() -> None:
    """torch's and numpy's default generators seeded anew, as a fresh process seeds them."""
    torch: Any = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    numpy_random: Any = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
