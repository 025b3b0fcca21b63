"""The columnar fast path for metrics files: a block of complete JSONL lines read in one call by
polars, accepted only where it provably gives what the line rule (workbench.runfolder.records) gives.

A block is taken whole when it is plain: ASCII, no NUL, no backslash (so no escapes), no line longer
than the line limit, and polars reads it to whole-number and number columns only (no text, flags,
lists or objects), with `rank` and `step` whole numbers on every row, `rank` in range, `time` finite,
every key a clean name and no number beyond 64 bits.  Two counts close the gaps a columnar reader
leaves: the block's double quotes must be exactly two per cell read (so no key was dropped,
repeated or null, and no value was a string), and the sentinels put in place of ``NaN`` and
``Infinity`` (which Python's json reads and polars does not) must come back as many times as they
went in.  Anything else returns None, and the caller reads that block line by line: the damaged-line
rules are the line rule's, whatever the block holds.

Without polars every block goes line by line (correct, slower).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from workbench.runfolder.fold import Batch
from workbench.runfolder.records import MAX_LINE_BYTES, METRIC, clean_text, whole_fields

if TYPE_CHECKING:
    import polars as pl

SENTINELS = {b"NaN": b"1.2345678901234567e-301", b"Infinity": b"7.654321098765432e-302"}
"""Non-JSON words Python's json reads as numbers -> a number text of ours put in their place (then put
back): NaN is what the engine logs for a time it did not measure."""
_INT64 = float(1 << 63)
_RANK_END = 1 << 31


def read_block(block: bytes, max_line_bytes: int = MAX_LINE_BYTES) -> Batch | None:
    """The records of `block` (complete lines, ending with a newline) as a Batch, or None when the
    block must be read line by line."""
    found = read_blocks([block], max_line_bytes)
    return None if found is None else found[0]


def read_blocks(blocks: list[bytes], max_line_bytes: int = MAX_LINE_BYTES) -> list[Batch] | None:
    """Several blocks (of complete lines each, e.g. the metrics files of many small runs) read in one
    columnar call, which costs about 1 ms however little it reads: each block's Batch, with the
    columns that block has, or None when the joined blocks must be read otherwise.  The checks are
    read_block's over the joined bytes; the rows of each block are told apart by its line count (the
    frame has one row per line, or nothing is taken)."""
    if not blocks or not all(block.endswith(b"\n") for block in blocks):
        return None
    block = blocks[0] if len(blocks) == 1 else b"".join(blocks)
    if not _have_polars() or not _plain(block, max_line_bytes):
        return None
    replaced_block, replaced = _replace_words(block)
    if replaced_block is None:
        return None
    quotes = int(np.count_nonzero(np.frombuffer(replaced_block, np.uint8) == 34))
    for infer in (100, None):  # a key that first appears after the 100th line: infer from every line
        frame = _read(replaced_block, infer)
        if frame is None:
            return None
        cells = sum(frame.height - s.null_count() for s in frame.iter_columns())
        if 2 * cells == quotes:
            return _batches(frame, [b.count(b"\n") for b in blocks] if len(blocks) > 1 else [frame.height],
                            replaced, [_first_keys(b) for b in blocks] if len(blocks) > 1 else None)
    return None


def _first_keys(block: bytes) -> list[str]:
    """The keys of a block's first line, in the order written (its columns come in that order, as the
    line rule and a columnar read of the block alone give them)."""
    import json

    try:
        first = json.loads(block[:block.find(b"\n")])
    except ValueError:
        return []
    return list(first) if isinstance(first, dict) else []


def _batches(frame: pl.DataFrame, rows: list[int], replaced: dict[bytes, int],
             orders: list[list[str]] | None) -> list[Batch] | None:
    """Each block's rows of `frame` as a Batch (`rows`: lines per block), if every one is as the
    line rule would have it and the sentinels come back as often as they went in.  The frame is
    turned into numpy columns once; a block's Batch is slices of them (a polars call per block cost
    more than the block's parse)."""
    if sum(rows) != frame.height:
        return None  # a line the reader skipped or split: the rows cannot be told apart
    found = dict.fromkeys(SENTINELS, 0)
    whole = _columns(frame, found if replaced else None)
    if whole is None or {word: n for word, n in found.items() if n} != replaced:
        return None
    values, present, exact = whole
    if len(rows) == 1:
        return [Batch(values, present)] if _identity_ok(values, present) else None
    out = []
    start = 0
    for i, n in enumerate(rows):
        end = start + n
        part_values: dict[str, np.ndarray] = {}
        part_present: dict[str, np.ndarray | None] = {}
        first = [c for c in (orders[i] if orders else []) if c in values]
        for name in dict.fromkeys([*first, *values]):
            mask = present[name]
            held = None if mask is None else mask[start:end]
            if held is not None and not held.any():
                continue  # a column this block does not have (a null cell is no cell here: the quotes said so)
            if held is not None and held.all():
                held = None
            part_values[name] = (exact.get(name, values[name]) if held is None else values[name])[start:end]
            part_present[name] = held
        if not _identity_ok(part_values, part_present):
            return None
        out.append(Batch(part_values, part_present))
        start = end
    return out


def _have_polars() -> bool:
    try:
        import polars  # noqa: F401
    except ImportError:
        return False
    return True


def _plain(block: bytes, max_line_bytes: int) -> bool:
    """ASCII, no NUL, no escape, and a newline in every half line-limit: no line over the limit."""
    if not block.isascii() or b"\0" in block or b"\\" in block:
        return False
    half = max(1, max_line_bytes // 2)
    return all(block.find(b"\n", start, start + half) >= 0 for start in range(0, len(block), half))


def _replace_words(block: bytes) -> tuple[bytes | None, dict[bytes, int]]:
    """`block` with NaN and Infinity replaced by SENTINELS, and how many of each; None if a
    sentinel's text is already there (it could not be told apart)."""
    replaced = {}
    for word, text in SENTINELS.items():
        if word[:1] in block and word in block:  # one byte first: a memchr, nearly free when absent
            if text in block:
                return None, {}
            longer = block.replace(word, text)
            replaced[word] = (len(longer) - len(block)) // (len(text) - len(word))  # no second pass to count
            block = longer
    return block, replaced


def _read(block: bytes, infer: int | None) -> pl.DataFrame | None:
    import polars
    from polars.exceptions import PanicException

    try:
        return polars.read_ndjson(block, infer_schema_length=infer)  # the bytes themselves: no BytesIO copy
    except (Exception, PanicException):  # noqa: BLE001 - not valid JSON lines, or typed beyond us: line by line
        return None


def _columns(frame: pl.DataFrame, found: dict[bytes, int] | None) -> tuple[
        dict[str, np.ndarray], dict[str, np.ndarray | None], dict[str, np.ndarray]] | None:
    """The frame's columns as numpy (values, present, and for a whole-number column with gaps its
    values as int64, gaps 0, for rows without gaps), if every column is as the line rule would have
    it; the sentinels met are put back and counted in `found` (None: no NaN or Infinity was swapped
    out, so a sentinel's number is the writer's own)."""
    import polars

    if "rank" not in frame.columns or "step" not in frame.columns:
        return None
    whole = whole_fields(METRIC)
    values: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray | None] = {}
    exact: dict[str, np.ndarray] = {}
    for series in frame.iter_columns():
        name = series.name
        if series.dtype not in (polars.Int64, polars.Float64) or not _clean_name(name):
            return None
        if name in whole and series.dtype != polars.Int64:
            return None
        nulls = series.null_count()
        array = series.to_numpy()
        if series.dtype == polars.Float64:
            if (np.abs(array) >= _INT64).any():
                return None  # e.g. 2**64 written as a whole number: the line rule drops it, polars made a float
            if found is not None:
                array = _restore(array, found)
        elif nulls:
            exact[name] = series.fill_null(0).to_numpy()
        values[name] = array
        present[name] = series.is_not_null().to_numpy() if nulls else None
    return values, present, exact


def _restore(array: np.ndarray, found: dict[bytes, int]) -> np.ndarray:
    """Sentinels back to NaN and +-inf, counted."""
    nan, inf = (float(SENTINELS[w]) for w in (b"NaN", b"Infinity"))
    for word, value, target in ((b"NaN", nan, math.nan), (b"Infinity", inf, math.inf)):
        hits = (array == value) | (array == -value) if word == b"Infinity" else array == value
        count = int(np.count_nonzero(hits))
        if count:
            found[word] += count
            array = array.copy() if not array.flags.writeable else array
            array[hits] = np.copysign(target, array[hits]) if word == b"Infinity" else target
    return array


def _clean_name(name: str) -> bool:
    return clean_text(name) == name


def _identity_ok(values: dict[str, np.ndarray], present: dict[str, np.ndarray | None]) -> bool:
    """rank and step on every row, rank in range, time finite where given."""
    if "rank" not in values or "step" not in values or present["rank"] is not None or present["step"] is not None:
        return False
    ranks = values["rank"]
    if len(ranks) and (ranks.min() < 0 or ranks.max() >= _RANK_END):
        return False
    times = values.get("time")
    if times is not None:
        mask = present["time"]
        given = times if mask is None else times[mask]
        if not np.isfinite(given.astype(np.float64)).all():
            return False
    return True
