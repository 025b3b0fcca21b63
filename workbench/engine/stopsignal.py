"""The stop signal (SIGTERM, SIGHUP) this rank's process got, once it got one (worker's handler sets it):
whatever the rank raises after is how it stopped, even where torch wraps the worker's Terminated,
raised in a collective's completion callback, in a RuntimeError of its own ("Got the following error
when running the callback: Terminated: SIGTERM").  A module of its own: the worker sets it and the
monitor reads it, and the worker already imports the monitor."""

from __future__ import annotations

received: int | None = None
