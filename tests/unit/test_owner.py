"""A terminal command's stop signals (workbench.cli.owner): raised at the command's safe points, never in
the middle of what the main thread was doing (an import, above all)."""

from __future__ import annotations

import importlib
import os
import signal
import sys

import pytest

from workbench.cli.owner import Interrupted, check_stop, stop_signals_interrupt

pytestmark = [pytest.mark.timeout(30)]


def test_a_stop_signal_during_an_import_lets_the_import_finish_then_is_raised(tmp_path, monkeypatch):
    """A module whose import receives SIGTERM half way is still imported whole; the signal is raised
    by check_stop afterwards.  (Raised from the handler, it left a half-made module that the cancel
    path then failed to import from.)"""
    (tmp_path / "slow_module_for_owner_test.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(Interrupted) as stopped, stop_signals_interrupt():
        module = importlib.import_module("slow_module_for_owner_test")  # written just above
        assert module.VALUE == 42
        check_stop()
    assert stopped.value.signum == signal.SIGTERM
    assert sys.modules["slow_module_for_owner_test"].VALUE == 42
    check_stop()  # handled once: nothing left pending


def test_a_signal_that_comes_as_the_block_ends_is_not_lost():
    before = signal.getsignal(signal.SIGINT)  # Python's default, or what an earlier test in this process left
    with pytest.raises(Interrupted) as stopped, stop_signals_interrupt():
        os.kill(os.getpid(), signal.SIGINT)
    assert stopped.value.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is before  # put back as it was


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # `nohup workbench run ...`
    try:
        with stop_signals_interrupt():
            os.kill(os.getpid(), signal.SIGHUP)
            check_stop()
    finally:
        signal.signal(signal.SIGHUP, previous)
