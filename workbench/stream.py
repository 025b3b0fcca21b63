"""Per-rank JSON-lines records: a writer that flushes each record, and an offset-based tail reader.

The reader keeps a byte offset per file and only parses complete lines, so a record that is being
written (a partial last line) is read on the next poll instead of being lost or half-parsed.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    import pandas as pd


class JsonlWriter:
    """Append one flat JSON object per line; each line is flushed when written."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh = open(path, "a", buffering=1)  # line-buffered: every record reaches the file
        self._lock = threading.Lock()  # the heartbeat thread writes events too: whole lines only

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=float) + "\n"
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line)

    def close(self) -> None:
        with self._lock:
            self._fh.close()


class NullWriter:
    """The writer of a rank that does not write a given stream."""

    def write(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlTail:
    """Incremental reader of one JSONL file by byte offset; tolerates a partial last line."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        return [json.loads(line) for line in chunk[: end + 1].splitlines() if line.strip()]


class MultiTail:
    """Tails for a set of files (e.g. every rank's metrics), discovered as they appear."""

    def __init__(self, folder: Path, pattern: str = "rank*.jsonl"):
        self.folder = Path(folder)
        self.pattern = pattern
        self.tails: dict[Path, JsonlTail] = {}
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        """New records since the last poll (also appended to self.records)."""
        if self.folder.is_dir():
            for path in sorted(self.folder.glob(self.pattern)):
                self.tails.setdefault(path, JsonlTail(path))
        new = [rec for tail in self.tails.values() for rec in tail.read_new()]
        self.records.extend(new)
        return new

    def frame(self, sort_by: Iterable[str] = ("step", "rank")) -> pd.DataFrame:
        self.poll()
        return to_frame(self.records, sort_by)


def to_frame(records: list[dict[str, Any]], sort_by: Iterable[str] = ()) -> pd.DataFrame:
    import pandas as pd

    frame = pd.DataFrame.from_records(records)
    keys = [k for k in sort_by if k in frame.columns]
    if keys and len(frame):
        frame = frame.sort_values(keys, kind="stable").reset_index(drop=True)
    return frame


def read_all(folder: Path, sort_by: Iterable[str] = ("step", "rank")) -> pd.DataFrame:
    """Every complete record of every rank file in `folder` as one DataFrame."""
    return MultiTail(folder).frame(sort_by)
