"""What the ranks print, as it is printed: each rank's stdout and stderr (the per-rank log files the
scheduler writes in the run folder), read line by line from where the last read stopped."""

from __future__ import annotations

import re
from pathlib import Path

from workbench.runfolder.layout import RunDir
from workbench.runfolder.private import open_regular

LAUNCHER_LINE = re.compile(r"^submitit (INFO|DEBUG) \(")
"""submitit's own bookkeeping lines ("Starting with JobEnvironment", "Loading pickle"): not the user's."""
LAUNCHER_AFTER_TEXT = re.compile(r"submitit (INFO|DEBUG) \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\) - ")
"""The same, glued to a rank's last output that ended without a newline ("tail" + "submitit INFO
(2026-11-28 08:18:02,808) - Job completed successfully"): its timestamp too, so user text naming
submitit is not cut."""
ALL_RANKS_UP_TO = 8


def shown_streams(world_size: int, spec: str | None = None) -> dict[int, tuple[str, ...]]:
    """rank -> the streams ("out", "err") to show.  `spec` is "all", "none" or ranks such as "0,3"
    (torchrun's --local-ranks-filter); by default every rank up to 8 ranks, beyond that rank 0's
    output and every rank's errors."""
    both = ("out", "err")
    if spec is None:
        if world_size <= ALL_RANKS_UP_TO:
            return {r: both for r in range(world_size)}
        return {r: both if r == 0 else ("err",) for r in range(world_size)}
    if spec == "all":
        return {r: both for r in range(world_size)}
    if spec == "none":
        return {}
    from workbench.errors import ConfigError

    try:
        ranks = {int(part) for part in spec.split(",") if part.strip()}
    except ValueError:
        ranks = {-1}
    if not ranks or not all(0 <= r < world_size for r in ranks):
        raise ConfigError([f"--ranks: expected all, none or rank numbers below {world_size} separated by commas, "
                           f"got {spec!r}"])
    return {r: both for r in sorted(ranks)}


class RankOutput:
    """New complete lines of the chosen ranks' stdout and stderr, launcher lines left out."""

    def __init__(self, run: RunDir, streams: dict[int, tuple[str, ...]]):
        self.run, self.streams = run, streams
        self.offsets: dict[Path, int] = {}

    def poll(self) -> list[tuple[int, str, str]]:
        """(rank, "out" or "err", line) for every line completed since the last poll."""
        found = []
        for rank, kinds in self.streams.items():
            for kind in kinds:
                for path in self.run.log_files(rank, kind):
                    found += [(rank, kind, line) for line in self._new_lines(path)]
        return found

    def _new_lines(self, path: Path) -> list[str]:
        start = self.offsets.get(path, 0)
        try:
            with open_regular(path) as fh:  # a FIFO or a device there: nothing to show
                fh.seek(start)
                chunk = fh.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offsets[path] = start + end + 1
        lines = chunk[:end].decode("utf-8", errors="replace").split("\n")
        shown = []
        for line in lines:
            if LAUNCHER_LINE.match(line):
                continue
            glued = LAUNCHER_AFTER_TEXT.search(line)  # the user's partial line, then submitit's: kept, dropped
            shown.append(line[:glued.start()] if glued else line)
        return shown
