"""Reading per-rank JSON-lines records (the writer is workbench.runfolder.writer): an offset-based tail reader.

The reader keeps a byte offset per file and only parses complete lines, so a record that is being
written (a partial last line) is read on the next poll instead of being lost or half-parsed.  What
a line must hold to be a record, and what happens to one that does not, is workbench.runfolder.records.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.runfolder.layout import RANK_JSONL, rank_of
from workbench.runfolder.records import ANY_OBJECT, MAX_LINE_BYTES, METRIC, Schema, parse_line, warn_damaged

if TYPE_CHECKING:
    import pandas as pd


class JsonlTail:
    """Incremental reader of one JSONL file by byte offset; cannot be broken by what the file holds.

    Each poll reads what was appended since the last one, in chunks of at most `CHUNK_BYTES`: every
    complete line is parsed and cleaned by `schema` (workbench.runfolder.records; None: any JSON object),
    a damaged line is skipped, counted in `skipped` and named in one DamagedFileWarning per poll.
    The offset moves only past complete lines, so a line being written (a partial last line) is
    read whole on a later poll, and each record is returned exactly once whatever the poll schedule.
    A line growing past records.MAX_LINE_BYTES without an end is skipped as it streams in."""

    CHUNK_BYTES = 4 << 20
    """Bytes read at a time; more than MAX_LINE_BYTES, so a chunk without a line end is a long line."""
    MAX_LINE_BYTES = MAX_LINE_BYTES

    def __init__(self, path: Path, schema: Schema | None = None):
        self.path = Path(path)
        self.schema = schema or ANY_OBJECT
        self.offset = 0
        self.line = 0
        """Complete lines consumed so far (the next line's number is line + 1)."""
        self.skipped = 0
        """Damaged lines skipped so far."""
        self._in_long_line = False  # inside a line already over MAX_LINE_BYTES: skip to its end

    def read_new(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        damaged: list[tuple[int, str]] = []
        try:
            with open(self.path, "rb") as fh:
                while self._read_chunk(fh, records, damaged):
                    pass
        except (FileNotFoundError, NotADirectoryError):
            return records
        except OSError as exc:  # a folder in its place, no permission: nothing to read (said once)
            warn_damaged(self.path, [(0, f"unreadable: {exc.strerror}")], once_key=(str(self.path), exc.errno))
            return records
        self.skipped += len(damaged)
        warn_damaged(self.path, damaged)
        return records

    def _read_chunk(self, fh: Any, records: list[dict[str, Any]], damaged: list[tuple[int, str]]) -> bool:
        """Handle the complete lines of the next chunk; returns whether to read on."""
        fh.seek(self.offset)
        chunk = fh.read(self.CHUNK_BYTES)
        end = chunk.rfind(b"\n")
        if end < 0:  # no complete line: wait for its end, unless it is already too long to be a record
            if len(chunk) > self.MAX_LINE_BYTES and not self._in_long_line:
                self._in_long_line = True
                damaged.append((self.line + 1, f"a line of more than {self.MAX_LINE_BYTES} bytes"))
            if not self._in_long_line:
                return False
            self.offset += len(chunk)
            return len(chunk) == self.CHUNK_BYTES
        lines = chunk[:end].split(b"\n")
        if self._in_long_line:  # the end of the long line: already reported
            lines[0] = b""
            self._in_long_line = False
        for line in lines:
            self.line += 1
            if line.strip(b" \t\r"):  # blank lines are no damage; a run of NULs is
                record, why = parse_line(line, self.schema, self.MAX_LINE_BYTES)
                if record is None:
                    damaged.append((self.line, why))
                else:
                    records.append(record)
        self.offset += end + 1
        return len(chunk) == self.CHUNK_BYTES


class MultiTail:
    """Tails for a set of files (e.g. every rank's metrics), discovered as they appear."""

    def __init__(self, folder: Path, pattern: str = RANK_JSONL, schema: Schema | None = None):
        self.folder = Path(folder)
        self.pattern = pattern
        self.schema = schema
        self.tails: dict[Path, JsonlTail] = {}
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # a dashboard thread and notebook cells may poll together

    def poll(self) -> list[dict[str, Any]]:
        """New records since the last poll (also appended to self.records)."""
        with self._lock:
            if self.folder.is_dir():
                for path in sorted(self.folder.glob(self.pattern)):
                    self.tails.setdefault(path, JsonlTail(path, self.schema))
            new = [rec for tail in self.tails.values() for rec in tail.read_new()]
            self.records.extend(new)
            return new

    def frame(self, sort_by: Iterable[str] = ("step", "rank")) -> pd.DataFrame:
        self.poll()
        return to_frame(self.records, sort_by)


class FrameMap(Mapping[int, "pd.DataFrame"]):
    """rank -> that rank's rows as a DataFrame, built only when asked for (and kept until the rank's
    next records): a poll of 64 ranks appends to numpy columns and makes no DataFrame, and the status
    reads only the columns it needs (`column`)."""

    def __init__(self) -> None:
        self._frames: dict[int, pd.DataFrame] = {}
        self._stores: dict[int, Columns | None] = {}

    def __getitem__(self, rank: int) -> pd.DataFrame:
        frame = self._frames.get(rank)
        if frame is None:
            store = self._stores.get(rank)
            if store is None:
                raise KeyError(rank)
            frame = self._frames[rank] = store.frame()
        return frame

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._stores))

    def __len__(self) -> int:
        return len(self._stores)

    def column(self, rank: int, name: str) -> Any:
        """One column of a rank's rows as a numpy array (a view, no copy, where the rank is stored
        as columns); None if the rank has no such column."""
        store = self._stores.get(rank)
        if store is not None:
            return store.arrays[name][:store.n] if name in store.arrays else None
        frame = self._frames.get(rank)
        return frame[name].to_numpy() if frame is not None and name in frame else None

    def add(self, rank: int, records: list[dict[str, Any]]) -> None:
        """Append a rank's new records: in place where they fit its columns, else the general way."""
        import pandas as pd

        store = self._stores.get(rank)
        if store is not None and store.append(records):
            self._frames.pop(rank, None)
            return
        frame = _extend(self[rank] if rank in self._stores else None, pd.DataFrame.from_records(records))
        self._frames[rank], self._stores[rank] = frame, Columns.of(frame)

    def thinned(self, rank: int, max_points: int | None) -> dict[str, Any] | None:
        """A rank's columns (at most max_points evenly spaced rows, always with the last) as numpy
        arrays, or None where the rank is not stored as columns."""
        store = self._stores.get(rank)
        if store is None:
            return None
        rows = thin_slice(store.n, max_points)
        return {c: a[rows] for c, a in store.arrays.items()}


class RankFrames:
    """One growing DataFrame per rank of a folder of rank{R}.jsonl metrics files (records cleaned by
    workbench.runfolder.records.METRIC); a poll reads only what was appended.  When a requeued attempt trains
    steps again, the newest attempt's rows win."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.tails: dict[int, JsonlTail] = {}
        self.frames = FrameMap()
        self.records = 0
        self.version = 0
        """Bumped whenever new records arrive."""
        self.skipped = 0
        """Damaged lines skipped, every rank (each was named in a DamagedFileWarning)."""
        self._lock = threading.Lock()

    def poll(self) -> list[dict[str, Any]]:
        """Read what every rank appended since the last poll; returns the new records."""
        with self._lock:  # a dashboard thread and notebook cells may poll together
            return self._poll()

    def _poll(self) -> list[dict[str, Any]]:
        if self.folder.is_dir():
            for path in self.folder.glob(RANK_JSONL):
                rank = rank_of(path)
                if rank is not None:
                    self.tails.setdefault(rank, JsonlTail(path, METRIC))
        new: list[dict[str, Any]] = []
        for rank, tail in sorted(self.tails.items()):
            records = tail.read_new()
            if records:
                self.frames.add(rank, records)
                new.extend(records)
        self.skipped = sum(tail.skipped for tail in self.tails.values())
        if new:
            self.records += len(new)
            self.version += 1
        return new

    def columns(self, names: Iterable[str]) -> dict[int, dict[str, Any]]:
        """rank -> {name: numpy array} for the named columns each rank has (no DataFrame is made)."""
        with self._lock:
            out = {}
            for rank in self.frames:
                found = {name: self.frames.column(rank, name) for name in names}
                out[rank] = {name: values for name, values in found.items() if values is not None}
            return out

    def frame(self, max_points: int | None = None) -> pd.DataFrame:
        """Every rank's rows (at most max_points per rank, evenly spaced), sorted by step then rank."""
        import numpy as np
        import pandas as pd

        with self._lock:
            ranks = list(self.frames)
            found = [self.frames.thinned(rank, max_points) for rank in ranks]
            parts = [p for p in found if p is not None]
            if parts and len(parts) == len(found) and all(p.keys() == parts[0].keys() for p in parts):
                columns = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
                order = np.lexsort((columns["rank"], columns["step"]))  # every metrics record has both
                return pd.DataFrame({c: v[order] for c, v in columns.items()})
            frames = [self.frames[rank] for rank in ranks]
        parts_df = [thin(f, max_points) if max_points else f for f in frames]
        if not parts_df:
            return pd.DataFrame()
        frame = pd.concat(parts_df, ignore_index=True)
        return frame.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


class Columns:
    """One rank's rows as growable numpy columns (capacity doubles), so appending a poll's few records
    costs what they cost, not a copy of the rank's whole history (pandas' concat copies it); `frame()`
    is a DataFrame over them without a copy.  Only for numeric columns and records that arrive in
    step order with the same fields; anything else (a requeue's repeated steps, a new field, text)
    goes the general way (`_extend`)."""

    def __init__(self, frame: pd.DataFrame):
        self.n = len(frame)
        self.arrays = {str(c): _grown(frame[c].to_numpy(), max(1024, 2 * self.n)) for c in frame.columns}

    @classmethod
    def of(cls, frame: pd.DataFrame) -> Columns | None:
        numeric = all(getattr(t, "kind", "O") in "biuf" for t in frame.dtypes)
        return cls(frame) if numeric and "step" in frame and len(frame) else None

    def append(self, records: list[dict[str, Any]]) -> bool:
        """Add `records` in place; False (nothing changed) if they do not fit the fast way."""
        import numpy as np

        names = self.arrays.keys()
        if any(record.keys() != names for record in records):
            return False
        columns = {c: np.array([record[c] for record in records]) for c in names}
        if any(columns[c].dtype.kind != a.dtype.kind for c, a in self.arrays.items()):
            return False  # e.g. a float where the column holds whole numbers
        steps = columns["step"]
        if not (steps[0] > self.arrays["step"][self.n - 1] and (len(steps) < 2 or (steps[1:] > steps[:-1]).all())):
            return False
        end = self.n + len(records)
        if end > len(self.arrays["step"]):
            self.arrays = {c: _grown(a[:self.n], 2 * end) for c, a in self.arrays.items()}
        for c, a in self.arrays.items():
            a[self.n:end] = columns[c]
        self.n = end
        return True

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({c: a[:self.n] for c, a in self.arrays.items()}, copy=False)


def _grown(values: Any, capacity: int) -> Any:
    import numpy as np

    out = np.empty(capacity, dtype=values.dtype)
    out[:len(values)] = values
    return out


def _extend(old: pd.DataFrame | None, new: pd.DataFrame) -> pd.DataFrame:
    """Append a rank's new rows; where steps repeat (a resumed run), the newest attempt wins."""
    import pandas as pd

    if old is None or len(old) == 0:
        old = None
    frame = new if old is None else pd.concat([old, new], ignore_index=True)
    if "step" not in new or not len(new):
        return frame.reset_index(drop=True)
    steps = new["step"]
    after = old is None or steps.iloc[0] > old["step"].iloc[-1]
    in_order = steps.is_monotonic_increasing and steps.is_unique and after
    if not in_order:
        if "attempt" in frame:
            frame = frame.sort_values("attempt", kind="stable")
        frame = frame.drop_duplicates("step", keep="last").sort_values("step", kind="stable")
    return frame.reset_index(drop=True)


def to_frame(records: list[dict[str, Any]], sort_by: Iterable[str] = ()) -> pd.DataFrame:
    import pandas as pd

    frame = pd.DataFrame.from_records(records)
    keys = [k for k in sort_by if k in frame.columns]
    if keys and len(frame):
        frame = frame.sort_values(keys, kind="stable").reset_index(drop=True)
    return frame


def thin_slice(n: int, max_points: int | None) -> slice:
    """The rows of n to keep: at most max_points evenly spaced, always with the last (all when
    max_points is None or 0)."""
    if not max_points or n <= max_points:
        return slice(0, n)
    stride = -(-n // max_points)
    return slice((n - 1) % stride, n, stride)


def thin(frame: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most max_points evenly spaced rows of one rank's frame, always with the last."""
    return frame.iloc[thin_slice(len(frame), max_points)]  # a slice (no copy) that ends on the last row
