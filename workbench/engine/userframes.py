"""A rank's traceback as the user wants to read it: their own frames, not the workbench's.

An error raised in the user's task factory, model, loss or script travels up through the
workbench's entry, rank and trainer frames (and submitit's, and runpy's): a dozen lines of
framework before the one that matters.  `user_traceback` keeps the frames from the first one in
the user's own code inwards (library frames called from there, such as torch's, stay), and drops
the workbench's, submitit's and runpy's.  An error the workbench raised about the user's input
(a factory that returned the wrong thing, a dataset smaller than one batch) has no user frame:
what remains is its one line.  The error file keeps the full traceback too; ``WORKBENCH_TRACEBACK=full``
shows it wherever a failure is shown.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

HIDDEN_NOTE = "(workbench's own frames are hidden; set WORKBENCH_TRACEBACK=full to see every frame)\n"


def _folder(module_file: str | None, up: int = 0) -> str:
    return str(Path(module_file).resolve().parents[up]) + os.sep if module_file else "\0"


def _framework_folders() -> tuple[str, ...]:
    """Code that is never the user's: workbench itself, submitit, runpy."""
    submitit = sys.modules.get("submitit")
    return (_folder(__file__, up=1), _folder(getattr(submitit, "__file__", None)))


def _library_folders() -> tuple[str, ...]:
    """Code the user calls into, shown only below the user's first frame (torch)."""
    torch = sys.modules.get("torch")
    return (_folder(getattr(torch, "__file__", None)),)


def user_traceback(exc: BaseException) -> str:
    """The traceback of `exc` (and of the exceptions chained to it) with only the user's frames."""
    te = traceback.TracebackException.from_exception(exc)
    framework, library = _framework_folders(), _library_folders()
    hidden = False
    seen: set[int] = set()
    todo = [te]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        kept = _user_frames(current.stack, framework, library)
        hidden = hidden or len(kept) < len(current.stack)
        current.stack = traceback.StackSummary.from_list(kept)
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        todo += list(getattr(current, "exceptions", None) or [])
    return "".join(te.format()) + (HIDDEN_NOTE if hidden else "")


def user_stack(stack: traceback.StackSummary) -> traceback.StackSummary:
    """A stack (a hung thread's, say) with the user's frames and what they called, as user_traceback keeps."""
    return traceback.StackSummary.from_list(_user_frames(stack, _framework_folders(), _library_folders()))


def _user_frames(stack: traceback.StackSummary, framework: tuple[str, ...],
                 library: tuple[str, ...]) -> list[traceback.FrameSummary]:
    def inside(frame: traceback.FrameSummary, folders: tuple[str, ...]) -> bool:
        if frame.filename == "<frozen runpy>":  # runpy as Python 3.11+ freezes it
            return True
        name = os.path.realpath(frame.filename)
        return name.startswith(folders) or name == os.path.realpath(runpy.__file__)

    first = next((i for i, f in enumerate(stack) if not inside(f, framework + library)), len(stack))
    return [f for f in stack[first:] if not inside(f, framework)]
