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

