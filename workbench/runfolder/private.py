"""Everything the workbench writes is private to the user: folders 0700, files 0600, whatever the umask.

Run folders hold pickles (code that the ranks load), checkpoints and logs, often on a filesystem
shared with other users, so modes are set explicitly instead of trusting the umask.  Folders the
workbench creates on the way to a run folder (the run root included) are 0700 too; folders that
already exist keep their modes, so a run root a user shared on purpose stays shared.  Processes
the workbench starts (submitit's controller, the ranks) run with umask 077, so what they create
(submitit's pickles and logs) is private as well.

Run roots are often shared (a group's project folder), so what the workbench finds in a folder is not
trusted either.  This module is the one owner of touching files there:

- no write follows a link: a whole file is written beside its final name and renamed over it
  (`replacing`, `write_atomic`: a link in its place is replaced, never written through); a file
  appended to (logs, JSON-lines records, locks) is opened with O_NOFOLLOW and must be a regular file
  (`open_private`): a link, a FIFO or a device there is refused with NotWrittenError;
- a reader opens regular files only (`open_regular`, `read_bounded`): a FIFO or a device in a file's
  place is refused at once (O_NONBLOCK, then fstat), not waited on or read forever;
- a pickle is read only from a folder that is the user's own and private (`why_not_private`,
  `check_trusted`): the folder, every folder down to the file, and the file owned by the user and
  writable by no one else.  launch/ours.py asks the same before it signals a process a folder names.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

from workbench.errors import NotWrittenError, UntrustedFileError

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


def open_private(path: str | os.PathLike[str], mode: str = "a", **kwargs: Any) -> IO[Any]:
    """open() to append ("a", "ab"), overwrite in place ("w", "wb") or update ("r+b"), except that a
    file it creates is 0600 (an existing file keeps its mode) and that it writes only to a regular file
    of that name: a link (O_NOFOLLOW), a FIFO or a device there raises NotWrittenError.  A whole file
    written at once is better written with `replacing`, which replaces such a link instead."""
    flags = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "r": os.O_RDWR}[mode[0]] | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags | os.O_EXCL, FILE_MODE) if flags & os.O_CREAT else -1
            if fd >= 0:
                os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away
        except FileExistsError:
            fd = -1
        if fd < 0:
            fd = os.open(path, flags & ~(os.O_CREAT | os.O_TRUNC))  # truncated once known to be a file
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a link (O_NOFOLLOW); a FIFO no one reads (O_NONBLOCK)
            raise _not_written(path, _lstat(path)) from None
        raise
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise _not_written(path, found)
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], mode: str = "wb", **kwargs: Any) -> Iterator[IO[Any]]:
    """A new private file (0600) beside `path`, renamed over it when the block ends without an error
    (removed when it raises): readers never see half a file, and a link, FIFO or anything else in
    `path`'s place is replaced, never written through.  The parent folder is made (0700) if missing."""
    path = Path(path)
    make_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # O_EXCL: always a new 0600 file
    try:
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
        os.replace(tmp, path)  # onto a link: the link itself is replaced
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def own_folder(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Make the folder `path` inside `root` (0700 where made) for a writer that names its own files
    there (TensorBoard's event files): no folder from `root` down to `path` may be a link (or anything
    but a folder), else NotWrittenError; a link planted there would take the files elsewhere."""
    root, path = Path(root), Path(path)
    inside = path.relative_to(root).parts
    folders = [root.joinpath(*inside[:n]) for n in range(1, len(inside) + 1)]
    for check in (False, True):  # before making anything, and once made
        for folder in folders:
            found = _lstat(folder)
            if found is None and not check:
                break
            if found is None or not stat.S_ISDIR(found.st_mode):
                what = kind_of(found.st_mode) if found is not None else "missing"
                raise NotWrittenError(f"{folder}: {what}, not a folder: the workbench does not write through it; "
                                      "remove it and try again")
        if not check:
            make_dirs(path)
    return path


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to a private temp file in the same folder and rename it over `path`: readers
    never see half a file, and the result is 0600 (`replacing`)."""
    with replacing(path) as fh:
        fh.write(data)


def _lstat(path: str | os.PathLike[str]) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _not_written(path: str | os.PathLike[str], found: os.stat_result | None) -> NotWrittenError:
    what = kind_of(found.st_mode) if found is not None else "not a file"
    return NotWrittenError(f"{path}: {what}, not a regular file: the workbench does not write through it; "
                           "remove it and try again")


def kind_of(mode: int) -> str:
    """What a file of this st_mode is, in words ("a FIFO (named pipe)")."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a file")):
        if test(mode):
            return name
    return "a special file"


class NotRegularFile(OSError):
    """A reader found something other than a regular file in a file's place (a FIFO, a device, a
    folder); its strerror says what, as OSError's handlers print it."""


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a file of a run, pool or sweep folder (or a settings file) to read: a regular file only.
    A FIFO or a device in its place (a link to one included) raises NotRegularFile, an OSError, at
    once: the open does not wait for a writer (O_NONBLOCK) and nothing is read from a device."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        found = os.fstat(fd)
        if stat.S_ISDIR(found.st_mode):  # as open() says it
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(found.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{kind_of(found.st_mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike[str], max_bytes: int, tail: bool = False) -> bytes:
    """At most `max_bytes` of a regular file (open_regular): its first ones, or with `tail` its last.
    A caller that must tell a file too large asks for one byte more than it accepts."""
    with open_regular(path) as fh:
        if tail:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - max_bytes))
        return fh.read(max_bytes)


def why_not_private(folder: str | os.PathLike[str], path: str | os.PathLike[str]) -> str:
    """"" when `folder`, every folder from it down to `path`, and `path` (a regular file, not a link)
    are the current user's and writable by no one else; else why not, as a phrase naming the first
    that is not ("results/rank0.pkl is owned by uid 12345, not by you (root (uid 0))")."""
    root = Path(os.path.realpath(folder))
    path = Path(path)
    try:
        inside = Path(os.path.realpath(path.parent)).relative_to(root)
    except ValueError:
        return f"{path} is not inside the folder"
    paths = [root, *(root.joinpath(*inside.parts[:n]) for n in range(1, len(inside.parts) + 1)),
             root / inside / path.name]
    for each in paths:
        try:
            found = os.lstat(each)
        except OSError as exc:
            return f"{shown_in(root, each)} cannot be read ({exc.strerror})"
        if each == paths[-1] and not stat.S_ISREG(found.st_mode):
            return f"{shown_in(root, each)} is not a regular file"
        if found.st_uid != os.geteuid():
            return (f"{shown_in(root, each)} is owned by {user_name(found.st_uid)}, "
                    f"not by you ({user_name(os.geteuid())})")
        if found.st_mode & 0o022:
            who = "others" if found.st_mode & 0o002 else "its group"
            return f"{shown_in(root, each)} is writable by {who} (mode {stat.S_IMODE(found.st_mode):04o})"
    return ""


def check_trusted(folder: str | os.PathLike[str], path: str | os.PathLike[str], trust: bool = False) -> None:
    """Before unpickling `path` (a pickle runs code as whoever reads it) from the run, pool or sweep
    `folder`: UntrustedFileError, one line naming the file and why, unless the folder is the user's
    own and private (why_not_private) or `trust` says to read it anyway."""
    why = "" if trust else why_not_private(folder, path)
    if why:
        raise UntrustedFileError(f"{path}: not unpickled: {why}, and a pickle runs code as you when read; if you "
                                 "trust whoever can write there, read it anyway with trust=True (--trust in a command)")


def shown_in(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> str:
    """`path` relative to the folder `root` ("the folder" for the folder itself), else as given."""
    path = Path(path)
    try:
        relative = (Path(os.path.realpath(path.parent)) / path.name).relative_to(os.path.realpath(root))
    except ValueError:
        return str(path)
    return str(relative) if relative.parts else "the folder"


def user_name(uid: int | None) -> str:
    """"alice (uid 1001)"; "uid 12345" for a uid without a name."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})" if uid is not None else "another user"
    except KeyError:
        return f"uid {uid}"


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """umask 077 for what is created (and started) inside: processes started here inherit it."""
    old = os.umask(UMASK)
    try:
        yield
    finally:
        os.umask(old)
