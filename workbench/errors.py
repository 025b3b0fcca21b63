"""Every error a user of the workbench can meet, in one place (all exported from ``workbench``).

A ``ConfigError`` is bad input (a config field, a config file, a run folder, an argument of the public
API): its message is one line per problem naming the field or file and the fix, and every command prints
it as ``workbench: ...`` and exits with status 2.  The others say what happened to a run.

In IPython and Jupyter these errors show as their message alone, as the CLI prints them, not under the
workbench's and submitit's frames (IPython's ``_render_traceback_`` hook); the full traceback is one call
away, ``workbench.show_traceback()``.  Any other exception (a bug in the workbench) keeps its traceback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.runfolder.causes import RankFailure

FULL_TRACEBACK_HINT = "(the full traceback: workbench.show_traceback())"


class UserFacing(Exception):
    """An error whose message is all a user needs: IPython shows it without the traceback."""

    def _render_traceback_(self) -> list[str]:
        """What IPython and Jupyter show for this exception (see the module's docstring)."""
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}", FULL_TRACEBACK_HINT]


def show_traceback(exc: BaseException | None = None) -> None:
    """Print the full traceback of `exc`, by default the last error a notebook cell or the IPython prompt
    showed (one a workbench error showed as one line included)."""
    import traceback

    exc = exc or getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None:
        print("no error to show: an error raised in a cell or at the prompt is kept for this", file=sys.stderr)
        return
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)


class ConfigError(UserFacing, ValueError):
    """Bad input from the user: a config with one or more problems, or a config file or run folder
    that cannot be used.  `problems` lists each as one line naming the field (or file) and the fix;
    with one problem, that line is the message.  The CLI prints them and exits with status 2."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        if len(self.problems) == 1:
            super().__init__(self.problems[0])
            return
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problems in the job config:\n{lines}")

    def fields(self) -> list[str]:
        """The field paths named by the problems (the text before the first colon)."""
        return problem_fields(self.problems)


def problem_fields(problems: list[str]) -> list[str]:
    """The field path each "section.field: what; fix" message names."""
    return [p.split(":", 1)[0] for p in problems]


class ConfigFileError(ConfigError, FileNotFoundError):
    """A config file that cannot be read as one (missing, a folder, binary, empty, too large): a
    ConfigError whose message is one line naming the file and the fix.  Also a FileNotFoundError,
    so code that caught a missing config file still catches it."""

    def __init__(self, message: str):
        ConfigError.__init__(self, [message])


class RunFolderError(ConfigError, FileNotFoundError):
    """A path given as a run folder is not one (missing, or without a readable run.json), or a sweep
    folder whose files cannot be read back (sweep.json, study.journal, payload.pkl damaged).  A
    ConfigError whose message is one line naming the folder or file and the fix; also a FileNotFoundError."""

    def __init__(self, message: str):
        ConfigError.__init__(self, [message])


class ArgumentError(ConfigError):
    """A bad argument to a function of the public API (a plot option, compare's metrics, an export
    format): a ConfigError (so also a ValueError) whose message is one line naming the argument and the fix."""

    def __init__(self, message: str):
        ConfigError.__init__(self, [message])


class SubmitError(UserFacing, RuntimeError):
    """The run cannot start as asked (its folder is in use, its checkpoints cannot be read); the
    message says what to do."""


class RunFailed(UserFacing, RuntimeError):
    """The run failed; `failure` names the rank and carries its traceback."""

    def __init__(self, failure: RankFailure | None, run_dir: Path):
        self.failure = failure
        what = str(failure) if failure else "the job ended without a result"
        super().__init__(f"run {run_dir} failed: {what}")

    def _render_traceback_(self) -> list[str]:
        """The cause, what followed it, and where the failing rank's own traceback is."""
        lines = super()._render_traceback_()[:1]
        if self.failure is not None:
            lines += [f"  {line}" for line in self.failure.consequence_lines()]
            if self.failure.traceback:
                lines.append(f"(rank {self.failure.rank}'s traceback: run.exception().traceback; the full traceback "
                             "of this call: workbench.show_traceback())")
                return lines
        return [*lines, FULL_TRACEBACK_HINT]


class DamagedFileWarning(UserWarning):
    """Bytes in a run folder that are not a valid record were skipped (the message names file and line).
    Silence with ``warnings.filterwarnings("ignore", category=DamagedFileWarning)``."""


class ResizeWarning(UserWarning):
    """A run resumed at another world size: what changes (grad_accum_steps kept the effective batch,
    or lr and warmup follow the scaling rule), said at submit, before it starts."""


class NotSignalledWarning(UserWarning):
    """A process a run or pool folder names was left alone: the folder or its record is not the
    user's own and private, or the process is not the workbench process the record names
    (workbench.launch.ours).  The message names the folder, the pid and why, in one line."""


class UntrustedFileError(UserFacing, PermissionError):
    """A pickle in a run, pool or sweep folder that is not the user's own and private (owned by another
    user, or writable by others or the group): unpickling it would run whatever code was planted there
    as the user.  The message names the file, whose it is or who can write it, and the switch that
    reads it anyway (``trust=True``; ``--trust`` on the command line)."""


class NotWrittenError(UserFacing, OSError):
    """Something else than a regular file where the workbench appends to or writes a file in place (a
    symbolic link, a FIFO, a device): nothing is written through it.  One line naming the file."""
