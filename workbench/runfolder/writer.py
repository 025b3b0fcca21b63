"""The rank side of the run folder's JSON-lines files: one flat object per line, each flushed when
written, so a reader (workbench.runfolder.reader) never waits for a buffer."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from workbench.runfolder.private import make_dirs, open_private, open_regular


class JsonlWriter:
    """Append one flat JSON object per line; each line is flushed when written."""

    def __init__(self, path: Path):
        make_dirs(path.parent)
        self.path = path
        self._fh = open_private(path, "a", buffering=1)  # open for the writer's life; line-buffered
        if self._fh.tell() and not _ends_with_newline(path):
            self._fh.write("\n")  # an earlier attempt died mid-line: keep our first record whole
        self._lock = threading.Lock()  # the heartbeat thread writes events too: whole lines only

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=float) + "\n"
        with self._lock:
            if not self._fh.closed:
                try:
                    self._fh.write(line)
                except OSError as exc:  # name the file: a full disk says where
                    raise OSError(exc.errno, exc.strerror, str(self.path)) from exc

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def _ends_with_newline(path: Path) -> bool:
    with open_regular(path) as fh:
        fh.seek(-1, 2)
        return fh.read(1) == b"\n"
