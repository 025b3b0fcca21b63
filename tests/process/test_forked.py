"""workbench.engine.forked, in fresh interpreters (a pytest worker has threads of its own, and is not
forked): a forked child has what a fresh process has (its environment, argv, session, output files,
the signal handlers and RNG seeds of a fresh interpreter, its own atexit handlers and exit status),
dies with its parent when asked, and a process with a thread running, the CUDA driver loaded or
WORKBENCH_FORK=0 says why it does not fork."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support import REPO
from workbench.proctree import Proc

pytestmark = pytest.mark.timeout(60)

CHILD = r'''
import atexit, json, os, signal, sys, torch
from workbench.engine import forked

out = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *a: None)  # the parent's handlers are not the child's
atexit.register(lambda: print("parent atexit ran"))

def body():
    atexit.register(lambda: print("child atexit ran"))
    facts = {"env": os.environ.get("ONLY_IN_CHILD"), "parent_only": os.environ.get("ONLY_IN_PARENT"),
             "argv": sys.argv, "sid": os.getsid(0) == os.getpid(), "seed": torch.initial_seed(),
             "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
             "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler}
    print(json.dumps(facts))
    mode = os.environ["MODE"]
    if mode == "raise":
        raise ValueError("boom in the child")
    if mode == "exit":
        sys.exit(3)
    if mode == "interrupt":
        raise KeyboardInterrupt
    return 0

os.environ["ONLY_IN_PARENT"] = "1"
results = {}
for mode in ("return", "raise", "exit", "interrupt"):
    path = os.path.join(out, mode + ".log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    child = forked.fork(body, env={"ONLY_IN_CHILD": mode, "MODE": mode}, argv=["prog", mode], stdout=fd,
                        stderr=fd, new_session=True)
    os.close(fd)
    results[mode] = child.wait(30)
print(json.dumps({"codes": results, "parent_seed": torch.initial_seed()}))
'''


def test_a_forked_child_has_what_a_fresh_process_has_and_exits_as_one(tmp_path):
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr
    summary = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert summary["codes"] == {"return": 0, "raise": 1, "exit": 3, "interrupt": -signal.SIGINT}
    assert done.stdout.count("parent atexit ran") == 1  # the parent's own exit, not its children's
    seeds = {summary["parent_seed"]}
    for mode in ("return", "raise", "exit", "interrupt"):
        text = (tmp_path / f"{mode}.log").read_text()
        facts = json.loads(text.splitlines()[0])
        assert facts == {"env": mode, "parent_only": None, "argv": ["prog", mode], "sid": True,
                         "seed": facts["seed"], "sigterm": True, "sigint": True}, text
        seeds.add(facts["seed"])
        assert "parent atexit ran" not in text
        assert "child atexit ran" in text, text
    assert len(seeds) == 5  # torch seeded anew in every child, as in a fresh process
    assert "ValueError: boom in the child" in (tmp_path / "raise.log").read_text()
    assert "KeyboardInterrupt" in (tmp_path / "interrupt.log").read_text()


ORPHAN = r'''
import os, signal, sys, time
from workbench.engine import forked

child = forked.fork(lambda: time.sleep(120), env=dict(os.environ), argv=["sleeper"], new_session=True,
                    death_signal=signal.SIGKILL)
print(child.pid, flush=True)
time.sleep(120)
'''


def test_a_forked_child_with_a_death_signal_dies_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert parent.stdout is not None
        child = Proc.of(int(parent.stdout.readline()))
        assert child is not None and child.alive()
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while child.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not child.alive()
    finally:
        parent.kill()
        parent.wait(10)


def test_a_process_says_why_it_does_not_fork():
    code = textwrap.dedent("""
        import os, threading, time
        from workbench.engine import forked
        print(repr(forked.why_not_fork()))
        threading.Thread(target=time.sleep, args=(5,), name="busy", daemon=True).start()
        print(repr(forked.why_not_fork()))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO,
                          env={**os.environ, "WORKBENCH_FORK": "1"})
    assert done.stdout.splitlines() == ["''", "'threads running (busy)'"], done.stderr
    done = subprocess.run([sys.executable, "-c", "from workbench.engine import forked; print(forked.why_not_fork())"],
                          capture_output=True, text=True, timeout=30, cwd=REPO, env={**os.environ, "WORKBENCH_FORK": "0"})
    assert done.stdout.strip() == "WORKBENCH_FORK=0", done.stderr


def test_a_process_with_the_cuda_driver_mapped_does_not_fork(tmp_path):
    """What the CUDA runtime leaves once called (libcuda mapped into the process), shown by mapping a
    file of that name: such a process's forked children could not use CUDA."""
    driver = tmp_path / "libcuda.so.1"
    driver.write_bytes(b"\0" * 4096)
    code = textwrap.dedent(f"""
        import mmap
        from workbench.engine import forked
        before = forked.why_not_fork()
        with open({str(driver)!r}, "rb") as fh:
            mapped = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
        print(repr(before), repr(forked.why_not_fork()))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO,
                          env={**os.environ, "WORKBENCH_FORK": "1"})
    assert done.stdout.strip() == "'' 'the CUDA driver is loaded in this process'", done.stderr



ENDING = r'''
import atexit, os, sys, threading, time

def body():
    import ending_user_module  # a user's module that opened a log at import and never closes it
    ending_user_module.log.write("from the module, never flushed\n")
    kept = open(os.path.join(sys.argv[1], "main.log"), "w")  # noqa: SIM115 - left open, as scripts do
    kept.write("from the body, never flushed\n")
    sys.modules["__main__"].kept_alive = kept  # reachable at exit: only the teardown's flush saves it

    def late():
        time.sleep(0.5)
        with open(os.path.join(sys.argv[1], "thread.log"), "w") as fh:
            fh.write("the thread finished\n")
        print("thread done", flush=True)

    threading.Thread(target=late).start()  # not a daemon: the interpreter waits for it
    atexit.register(lambda: print("atexit after the thread:",
                                  os.path.exists(os.path.join(sys.argv[1], "thread.log")), flush=True))
    print("body done, unflushed")
    return 0

if __name__ == "__main__":
    if os.environ.get("HOW") == "forked":
        from workbench.engine import forked
        import torch  # noqa: F401 - a warm parent
        child = forked.fork(body, env=dict(os.environ), argv=sys.argv, stdout=1, stderr=2)
        sys.exit(child.wait(30))
    sys.exit(body())
'''


@pytest.mark.parametrize("how", ["fresh", "forked"])
def test_a_forked_child_leaves_as_the_interpreter_does_threads_joined_atexit_run_open_files_flushed(tmp_path, how):
    """A fresh `python` run of the same body is what a forked child's ending must equal: it waits
    for a thread that is not a daemon, then runs atexit, and what files left open hold is written."""
    out = tmp_path / how
    out.mkdir()
    (tmp_path / "ending_user_module.py").write_text(
        f"log = open({str(out / 'module.log')!r}, 'w')  # noqa: SIM115\n")
    (tmp_path / "ending.py").write_text(ENDING)
    done = subprocess.run([sys.executable, str(tmp_path / "ending.py"), str(out)], capture_output=True, text=True,
                          timeout=50, cwd=REPO, env={**os.environ, "HOW": how, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["body done, unflushed", "thread done", "atexit after the thread: True"]
    assert (out / "thread.log").read_text() == "the thread finished\n"
    assert (out / "main.log").read_text() == "from the body, never flushed\n"
    assert (out / "module.log").read_text() == "from the module, never flushed\n"


def test_user_code_is_not_forked_from_a_process_that_imported_torch_dynamo():
    """A child forked after torch._dynamo was imported, whose code frees a DDP model's gloo group,
    can deadlock on the GIL there (forked.ENGINE_PRELOAD): an engine rank may be forked from such a
    process, a script's or function's may not; a script's variable torch reads as it loads starts it
    fresh too."""
    code = textwrap.dedent("""
        import sys
        from workbench.engine import forked
        forked.preload(engine=False)
        print(repr(forked.why_fresh(False)), repr(forked.why_fresh(True)), "torch._dynamo" in sys.modules)
        print(repr(forked.why_fresh(False, ["TORCH_LOGS", "MY_SETTING"])), repr(forked.why_fresh(False, ["OMP_NUM_THREADS"])))
        forked.preload(engine=True)
        print(repr(forked.why_fresh(False)), repr(forked.why_fresh(True)))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.stdout.splitlines() == [
        "'' '' False",
        "'TORCH_LOGS set for the ranks: read as torch loads' ''",
        "'torch._dynamo was imported before the fork' ''"], done.stderr
