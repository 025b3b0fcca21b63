"""Every error a user of the workbench can meet, in one place (all exported from ``workbench``).

A ``ConfigError`` is bad input (a config field, a config file, a run folder): its message is one line
per problem naming the field or file and the fix, and every command prints it as ``workbench: ...``
and exits with status 2.  The others say what happened to a run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.launch.run import RankFailure


class ConfigError(ValueError):
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
    """A path given as a run folder is not one (missing, or without a readable run.json).  A
    ConfigError whose message is one line naming the folder and the fix; also a FileNotFoundError."""

    def __init__(self, message: str):
        ConfigError.__init__(self, [message])


class SubmitError(RuntimeError):
    """The run cannot start as asked (its folder is in use, its checkpoints cannot be read); the
    message says what to do."""


class RunFailed(RuntimeError):
    """The run failed; `failure` names the rank and carries its traceback."""

    def __init__(self, failure: RankFailure | None, run_dir: Path):
        self.failure = failure
        what = str(failure) if failure else "the job ended without a result"
        super().__init__(f"run {run_dir} failed: {what}")


class DamagedFileWarning(UserWarning):
    """Bytes in a run folder that are not a valid record were skipped (the message names file and line).
    Silence with ``warnings.filterwarnings("ignore", category=DamagedFileWarning)``."""
