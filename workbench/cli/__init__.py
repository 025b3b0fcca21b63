"""`workbench ...` commands over the same Python API a notebook uses: `parser` (the arguments),
`commands` (one function per command), `printing` (what a terminal shows of a run), `owner` (a
command that starts a run owns it: its stop signals)."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any

from workbench.cli.parser import _parser, split_script_args
from workbench.errors import ConfigError, NotWrittenError, SubmitError, UntrustedFileError

__all__ = ["main", "report_error", "split_script_args", "user_error"]


FAST_EXIT = ("run", "launch", "follow")
"""Commands that, run as a program, leave without the interpreter's teardown once everything is
printed: they imported torch, pandas and matplotlib, whose teardown took seconds after the run had
ended (exit within 2 s of a failure, issue 18)."""


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None
    code = _main(argv)
    if as_program and sys.argv[1:2] and sys.argv[1] in FAST_EXIT:
        _leave(code)
    return code


def _leave(code: int) -> None:
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        own, script_args = split_script_args(argv)
    except ConfigError as exc:
        parser.error(exc.problems[0])
    args = parser.parse_args(own)
    args.script_args = script_args
    with _warnings_as_lines():
        try:
            return int(args.func(args) or 0)
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:  # the reader went away (`workbench config --docs | head`): not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except Exception as exc:  # noqa: BLE001 - every exit path prints a line; see user_error
            return report_error(exc)


def report_error(exc: BaseException) -> int:
    """A user error (a ConfigError: bad config, config file, run folder; an OSError: a path, a full
    disk) prints one line per problem, naming the field or file and the fix, and gives 2.  Anything
    else is a bug in workbench: its traceback, and 1."""
    lines = user_error(exc)
    if lines is None:
        import traceback

        traceback.print_exception(exc)
        print("workbench: this is a bug in workbench (traceback above); please report it", file=sys.stderr)
        return 1
    for line in lines:
        print(f"workbench: {line}", file=sys.stderr)
    return 2


def user_error(exc: BaseException) -> list[str] | None:
    """The lines that tell the user what is wrong and how to fix it; None when `exc` is not theirs."""
    if isinstance(exc, ConfigError):
        return exc.problems
    if isinstance(exc, (SubmitError, UntrustedFileError, NotWrittenError)):  # one line that names the fix
        return [str(exc)]
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        what = exc.strerror or str(exc)
        fix = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space (disk quota)",
               errno.EACCES: "check its permissions", errno.EROFS: "the disk is read-only; use another folder",
               errno.ENOENT: "check the path"}.get(exc.errno or 0, "check the path")
        return [f"{where}{what}; {fix}"]
    return None


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Warnings (a damaged line skipped in a run folder) print as "workbench: warning: ...", once each."""
    import warnings

    shown = warnings.showwarning

    def one_line(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        print(f"workbench: warning: {message}", file=sys.stderr)

    warnings.showwarning = one_line
    try:
        yield
    finally:
        warnings.showwarning = shown

