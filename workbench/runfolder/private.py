"""Everything the workbench writes is private to the user: folders 0700, files 0600, whatever the umask.

Run folders hold pickles (code that the ranks load), checkpoints and logs, often on a filesystem
shared with other users, so modes are set explicitly instead of trusting the umask.  Folders the
workbench creates on the way to a run folder (the run root included) are 0700 too; folders that
already exist keep their modes, so a run root a user shared on purpose stays shared.  Processes
the workbench starts (submitit's controller, the ranks) run with umask 077, so what they create
(submitit's pickles and logs) is private as well.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

DIR_MODE = 0o700
FILE_MODE = 0o600
UMASK = 0o077


def make_dirs(path: str | os.PathLike[str]) -> Path:
    """Create `path` and any missing parents, each 0700; existing folders are left as they are."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another rank made it a moment ago
            folder.mkdir(mode=DIR_MODE)
            os.chmod(folder, DIR_MODE)
    if not path.is_dir():
        raise NotADirectoryError(20, "Not a directory", str(path))
    return path


def open_private(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> IO[Any]:
    """open(), except that a file it creates is 0600 (an existing file keeps its mode)."""
    flags = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND}[mode[0]]
    try:
        fd = os.open(path, flags | os.O_EXCL, FILE_MODE)
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away
    except FileExistsError:
        fd = os.open(path, flags & ~os.O_CREAT)
    return os.fdopen(fd, mode, **kwargs)


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to a private temp file in the same folder and rename it over `path`: readers
    never see half a file, and the result is 0600."""
    path = Path(path)
    make_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp: always 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """umask 077 for what is created (and started) inside: processes started here inherit it."""
    old = os.umask(UMASK)
    try:
        yield
    finally:
        os.umask(old)
