"""Reading per-rank JSON-lines records (the writer is workbench.runfolder.writer): an offset-based tail reader.

The reader keeps a byte offset per file and only parses complete lines, so a record that is being
written (a partial last line) is read on the next poll instead of being lost or half-parsed.  What
a line must hold to be a record, and what happens to one that does not, is workbench.runfolder.records.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.runfolder.layout import RANK_JSONL, rank_of
from workbench.runfolder.private import open_regular
from workbench.runfolder.records import ANY_OBJECT, MAX_LINE_BYTES, METRIC, Schema, parse_line, warn_damaged

if TYPE_CHECKING:
    import pandas as pd

    from workbench.runfolder.fold import Batch, RankRows


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
        self._line = 0
        self.skipped = 0
        """Damaged lines skipped so far."""
        self._in_long_line = False  # inside a line already over MAX_LINE_BYTES: skip to its end

    @property
    def line(self) -> int:
        """Complete lines consumed so far (the next line's number is line + 1)."""
        return self._line

    def read_new(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        self._read(lambda block, rest_of_long, damaged: records.extend(self._parse(block, rest_of_long, damaged)))
        return records

    def _read(self, take: Callable[[bytes, bool, list[tuple[int, str]]], None]) -> None:
        """Hand every block of complete lines appended since the last poll to `take`, in order."""
        damaged: list[tuple[int, str]] = []
        try:
            with open_regular(self.path) as fh:  # a FIFO or a device in its place: unreadable, said once
                while self._read_chunk(fh, take, damaged):
                    pass
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:  # a folder in its place, no permission: nothing to read (said once)
            warn_damaged(self.path, [(0, f"unreadable: {exc.strerror}")], once_key=(str(self.path), exc.errno))
            return
        finally:
            self.skipped += len(damaged)
        warn_damaged(self.path, damaged)

    def _read_chunk(self, fh: Any, take: Callable[[bytes, bool, list[tuple[int, str]]], None],
                    damaged: list[tuple[int, str]]) -> bool:
        """Hand the complete lines of the next chunk to `take`; returns whether to read on."""
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
        rest_of_long, self._in_long_line = self._in_long_line, False  # its end: already reported
        take(chunk if end + 1 == len(chunk) else chunk[:end + 1], rest_of_long, damaged)
        self.offset += end + 1
        return len(chunk) == self.CHUNK_BYTES

    def _parse(self, block: bytes, rest_of_long: bool, damaged: list[tuple[int, str]]) -> list[dict[str, Any]]:
        """The records of a block of complete lines, line by line (records.parse_line)."""
        records = []
        lines = block.split(b"\n")[:-1]
        if rest_of_long:
            lines[0] = b""
        for line in lines:
            self._line += 1
            if line.strip(b" \t\r"):  # blank lines are no damage; a run of NULs is
                record, why = parse_line(line, self.schema, self.MAX_LINE_BYTES)
                if record is None:
                    damaged.append((self._line, why))
                else:
                    records.append(record)
        return records


class MetricTail(JsonlTail):
    """A rank's metrics file read as columns (workbench.runfolder.fold.Batch): a block of clean lines
    through the columnar reader (workbench.runfolder.fastjson), a block it cannot vouch for in pieces
    of SUB_BLOCK_BYTES, and a piece it cannot vouch for line by line, as JsonlTail reads every line.
    Lines are counted only where a line's number is needed (a damaged line is named)."""

    CHUNK_BYTES = 16 << 20
    SUB_BLOCK_BYTES = 256 << 10
    COLUMNAR_MIN_BYTES = 128 << 10
    """A smaller block (a live poll's few records) is read line by line: a columnar call costs ~1 ms
    however little it reads, the line rule a few microseconds a line."""

    def __init__(self, path: Path):
        super().__init__(path, METRIC)
        self._counted_to = 0  # self._line counts the lines before this offset

    @property
    def line(self) -> int:
        self._count_lines(self.offset)
        return self._line

    def read_batches(self) -> list[Batch]:
        """What was appended since the last poll, as batches in the order written."""
        from workbench.runfolder.fastjson import read_block

        batches: list[Batch] = []

        def take(block: bytes, rest_of_long: bool, damaged: list[tuple[int, str]]) -> None:
            columnar = not rest_of_long and len(block) >= self.COLUMNAR_MIN_BYTES
            batch = read_block(block, self.MAX_LINE_BYTES) if columnar else None
            if batch is not None:
                batches.append(batch)
            else:
                self._take_in_pieces(block, rest_of_long, damaged, batches)

        self._read(take)
        return batches

    def _take_in_pieces(self, block: bytes, rest_of_long: bool, damaged: list[tuple[int, str]],
                        batches: list[Batch]) -> None:
        from workbench.runfolder.fastjson import read_block
        from workbench.runfolder.fold import from_records

        start = 0
        while start < len(block):
            end = block.find(b"\n", min(start + self.SUB_BLOCK_BYTES, len(block)) - 1) + 1
            piece = block[start:end]
            first = rest_of_long and not start
            columnar = not first and self.COLUMNAR_MIN_BYTES <= len(piece) < len(block)
            batch = read_block(piece, self.MAX_LINE_BYTES) if columnar else None
            if batch is None:
                self._count_lines(self.offset + start)
                records = self._parse(piece, first, damaged)
                self._counted_to = self.offset + end
                batch = from_records(records) if records else None
            if batch is not None:
                batches.append(batch)
            start = end

    def peek(self, limit: int) -> bytes | None:
        """The complete lines of a file never read yet, if it holds at most `limit` bytes, without
        moving the offset (read_cold reads them with other files'); None otherwise."""
        if self.offset:
            return None
        try:
            with open_regular(self.path) as fh:  # a FIFO or a device: None at once, the poll says so
                data = fh.read(limit + 1)
        except OSError:
            return None
        end = data.rfind(b"\n")
        return data[:end + 1] if end >= 0 and len(data) <= limit else None

    def pending(self) -> int:
        """Bytes appended since the last poll (0 when the file is gone)."""
        try:
            return max(0, os.stat(self.path).st_size - self.offset)
        except OSError:
            return 0

    def _count_lines(self, upto: int) -> None:
        """Count the lines between the last counted offset and `upto` (read back from the file)."""
        if upto <= self._counted_to:
            return
        try:
            with open_regular(self.path) as fh:
                fh.seek(self._counted_to)
                left = upto - self._counted_to
                while left > 0 and (data := fh.read(min(left, self.CHUNK_BYTES))):
                    self._line += data.count(b"\n")
                    left -= len(data)
        except OSError:
            pass
        self._counted_to = upto


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
    """rank -> that rank's rows (workbench.runfolder.fold.RankRows: one per step, the fold of its
    records) as a DataFrame, built only when asked for (and kept until the rank's next records): a
    poll of 64 ranks makes no DataFrame, and the status reads only the columns it needs (`column`)."""

    def __init__(self) -> None:
        self._frames: dict[int, pd.DataFrame] = {}
        self.rows: dict[int, RankRows] = {}

    def __getitem__(self, rank: int) -> pd.DataFrame:
        frame = self._frames.get(rank)
        if frame is None:
            import pandas as pd

            frame = self._frames[rank] = pd.DataFrame(self.rows[rank].columns(), copy=False)
        return frame

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.rows))

    def __len__(self) -> int:
        return len(self.rows)

    def column(self, rank: int, name: str) -> Any:
        """One column of a rank's rows as a numpy array (a view, no copy); None if the rank has no
        such column."""
        rows = self.rows.get(rank)
        return None if rows is None else rows.column(name)

    def add(self, rank: int, batch: Batch) -> None:
        """Fold a rank's new records (in the order written) into its rows."""
        from workbench.runfolder.fold import RankRows

        self.rows.setdefault(rank, RankRows()).add(batch)
        self._frames.pop(rank, None)

    def thinned(self, rank: int, max_points: int | None) -> dict[str, Any]:
        """A rank's columns (at most max_points evenly spaced rows, always with the last) as numpy arrays."""
        rows = self.rows[rank]
        keep = thin_slice(rows.n, max_points)
        return {name: values[keep] for name, values in rows.columns().items()}


class RankFrames:
    """One growing table per rank of a folder of rank{R}.jsonl metrics files (records cleaned by
    workbench.runfolder.records.METRIC, folded by workbench.runfolder.fold: one row per step, the
    records of a step merged, a later attempt replacing the steps it trained again); a poll reads
    only what was appended."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.tails: dict[int, MetricTail] = {}
        self.frames = FrameMap()
        self.records = 0
        """Records read so far (every rank; several records of one step count each)."""
        self.version = 0
        """Bumped whenever new records arrive."""
        self.skipped = 0
        """Damaged lines skipped, every rank (each was named in a DamagedFileWarning)."""
        self._lock = threading.Lock()

    def poll(self) -> int:
        """Read what every rank appended since the last poll; returns how many records that was."""
        with self._lock:  # a dashboard thread and notebook cells may poll together
            return self._poll()

    def _poll(self) -> int:
        self._find_tails()
        new = 0
        for rank, batches in self._read_tails(sorted(self.tails.items())):
            for batch in batches:
                self.frames.add(rank, batch)
                new += len(batch)
        self.skipped = sum(tail.skipped for tail in self.tails.values())
        if new:
            self.records += new
            self.version += 1
        return new

    def _find_tails(self) -> None:
        if self.folder.is_dir():
            for path in self.folder.glob(RANK_JSONL):
                rank = rank_of(path)
                if rank is not None and rank not in self.tails:
                    self.tails[rank] = MetricTail(path)

    def _took(self, rank: int, read: int, batch: Batch) -> None:
        """A rank's first `read` bytes, read elsewhere (read_cold) as `batch`: as if a poll read them."""
        tail = self.tails[rank]
        if tail.offset:
            return
        tail.offset = read
        self.frames.add(rank, batch)
        if len(batch):
            self.records += len(batch)
            self.version += 1

    @staticmethod
    def _read_tails(tails: list[tuple[int, MetricTail]]) -> Iterator[tuple[int, list[Batch]]]:
        """Each rank's new batches, in rank order.  When several ranks have a columnar block waiting (a
        cold read of a run), two threads read them: one reads a file's bytes and checks them while the
        other is in polars' parser; both let go of the GIL there."""
        big = [rank for rank, tail in tails if tail.pending() >= MetricTail.COLUMNAR_MIN_BYTES]
        if len(big) < 2 or (os.cpu_count() or 1) < 2:
            yield from ((rank, tail.read_batches()) for rank, tail in tails)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2, thread_name_prefix="workbench-read") as pool:
            yield from zip((rank for rank, _ in tails), pool.map(lambda item: item[1].read_batches(), tails))

    def columns(self, names: Iterable[str]) -> dict[int, dict[str, Any]]:
        """rank -> {name: numpy array} for the named columns each rank has (no DataFrame is made)."""
        return self.versioned(names)[1]

    def versioned(self, names: Iterable[str]) -> tuple[int, dict[int, dict[str, Any]]]:
        """(version, columns(names)) read together: the version of exactly those columns, which a
        poll from another thread between two separate reads would have made newer than the data."""
        with self._lock:
            out = {}
            for rank in self.frames:
                found = {name: self.frames.column(rank, name) for name in names}
                out[rank] = {name: values for name, values in found.items() if values is not None}
            return self.version, out

    def frame(self, max_points: int | None = None) -> pd.DataFrame:
        """Every rank's rows (at most max_points per rank, evenly spaced), sorted by step then rank."""
        import pandas as pd

        return pd.DataFrame(self.merged(max_points), copy=False)

    def merged(self, max_points: int | None = None) -> dict[str, Any]:
        """frame()'s columns as numpy arrays, no DataFrame (a run's row in workbench.runs() reads a
        few of them: building the frame was a tenth of a first listing)."""
        with self._lock:
            parts = [self.frames.thinned(rank, max_points) for rank in self.frames]
        return merged_columns(parts)


COLD_GROUP_BYTES = 4 << 20
"""Most bytes read_cold hands the columnar reader in one call."""


def read_cold(runs: Iterable[RankFrames]) -> None:
    """The first read of many runs' small metrics files (each under MetricTail.COLUMNAR_MIN_BYTES,
    which a poll reads line by line), in columnar calls of up to COLD_GROUP_BYTES: a call costs about
    1 ms however little it reads, the line rule ~15 us a line, so listing hundreds of small runs for
    the first time (workbench.runs()) spent most of its time here.  Only what the columnar reader
    vouches for is taken (fastjson.read_blocks, all or nothing per call); every file left, and
    everything appended later, is read by the runs' own polls, with the line rule's warnings."""
    waiting: list[tuple[RankFrames, int, bytes]] = []
    for frames in runs:
        with frames._lock:
            frames._find_tails()
            for rank, tail in sorted(frames.tails.items()):
                block = tail.peek(MetricTail.COLUMNAR_MIN_BYTES - 1)
                if block:
                    waiting.append((frames, rank, block))
    group: list[tuple[RankFrames, int, bytes]] = []
    size = 0
    for i, item in enumerate(waiting):
        group.append(item)
        size += len(item[2])
        if size >= COLD_GROUP_BYTES or i == len(waiting) - 1:
            _read_group(group)
            group, size = [], 0


def _read_group(group: list[tuple[RankFrames, int, bytes]]) -> None:
    """One columnar call for the group; refused, each half on its own (a file the columnar reader
    will not vouch for, e.g. one with a text field, costs its own group, not the listing), down to
    groups of a few files, which their polls read."""
    from workbench.runfolder.fastjson import read_blocks

    batches = read_blocks([block for _, _, block in group])
    if batches is None:
        if len(group) > 4:
            _read_group(group[:len(group) // 2])
            _read_group(group[len(group) // 2:])
        return
    for (frames, rank, block), batch in zip(group, batches):
        with frames._lock:
            frames._took(rank, len(block), batch)


PARALLEL_CELLS = 1 << 22
"""A table of more cells than this is interleaved by two threads (a column each): the strided copies
and the first touch of the new columns' pages are most of a large cold read's time after the parse."""


def merged_columns(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several ranks' columns (in rank order) as one table sorted by step, then rank; a rank lacking
    a column has it missing there."""
    import numpy as np

    from workbench.runfolder.fold import Batch, concat

    parts = [part for part in parts if len(part.get("step", ()))]
    if not parts:
        return {}
    if _same_steps(parts):  # the usual run: every rank logged the same steps; interleave, no sort
        k = len(parts)

        def interleave(column: tuple[str, Any]) -> tuple[str, Any]:
            name, dtype = column
            values = np.empty(k * len(parts[0]["step"]), dtype=dtype)
            for i, part in enumerate(parts):
                values[i::k] = part[name] if name in part else _missing_cell(dtype)
            return name, values

        columns = list(_common_dtypes(parts).items())
        if k * len(parts[0]["step"]) * len(columns) < PARALLEL_CELLS or (os.cpu_count() or 1) < 2:
            return dict(map(interleave, columns))
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2, thread_name_prefix="workbench-merge") as pool:  # numpy copies without the GIL
            return dict(pool.map(interleave, columns))
    table = concat([Batch(part, dict.fromkeys(part)) for part in parts]).values
    order = np.lexsort((table["rank"], table["step"]))
    return {name: values[order] for name, values in table.items()}


def _same_steps(parts: list[dict[str, Any]]) -> bool:
    """Every part has the same steps, and one rank each, in increasing order."""
    import numpy as np

    steps, ranks = parts[0]["step"], [part["rank"] for part in parts]
    if not all(len(p["step"]) == len(steps) and np.array_equal(p["step"], steps) for p in parts[1:]):
        return False
    firsts = [r[0] for r in ranks]
    return all(r.dtype.kind == "i" for r in ranks) and all(a < b for a, b in zip(firsts, firsts[1:])) and all(
        (r == r[0]).all() for r in ranks)


def _common_dtypes(parts: list[dict[str, Any]]) -> dict[str, Any]:
    from workbench.runfolder.fold import common_dtype

    names = dict.fromkeys(name for part in parts for name in part)
    return {name: common_dtype([part.get(name) for part in parts]) for name in names}


def _missing_cell(dtype: Any) -> Any:
    return None if dtype.kind == "O" else float("nan")


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
