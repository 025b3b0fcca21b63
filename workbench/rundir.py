"""The one place that knows the layout of a run folder.

    <run>/config.yaml            the config snapshot
    <run>/run.json               launch facts: executor, job id, world size, created
    <run>/metrics/rank{R}.jsonl  one flat record per logged step, per rank
    <run>/events/rank{R}.jsonl   start, epoch_end, eval, checkpoint, early_stop, error, end
    <run>/status/rank{R}.json    heartbeat: state, step, time (replaced atomically)
    <run>/errors/rank{R}.json    the failing rank's exception and traceback
    <run>/logs/                  submitit's per-task stdout/stderr and pickles
    <run>/checkpoints/           step-{N}.pt files written by rank 0
    <run>/summary.json           written at the end of the run
    <run>/plots/                 figures (loss per rank)
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunDir:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def meta(self) -> Path:
        return self.root / "run.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def task_pickle(self) -> Path:
        return self.root / "task.pkl"

    def metrics(self, rank: int) -> Path:
        return self.root / "metrics" / f"rank{rank}.jsonl"

    def events(self, rank: int) -> Path:
        return self.root / "events" / f"rank{rank}.jsonl"

    def status(self, rank: int) -> Path:
        return self.root / "status" / f"rank{rank}.json"

    def error(self, rank: int) -> Path:
        return self.root / "errors" / f"rank{rank}.json"

    def stacks(self, rank: int) -> Path:
        return self.root / "stacks" / f"rank{rank}.txt"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:08d}.pt"

    def rendezvous(self, key: str) -> Path:
        return self.root / "rendezvous" / f"{key}.json"

    def ranks_with(self, kind: str) -> list[int]:
        """Ranks that have a file of `kind` (metrics, events, status, errors)."""
        folder = self.root / kind
        if not folder.is_dir():
            return []
        ranks = [int(p.stem[4:]) for p in folder.iterdir() if p.stem.startswith("rank") and p.stem[4:].isdigit()]
        return sorted(ranks)

    def create(self) -> RunDir:
        """Make the folder tree, private to the user (0700): submitit keeps pickles here."""
        for sub in ("", "metrics", "events", "status", "errors", "logs", "checkpoints", "plots", "stacks", "rendezvous"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        return self


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temp name in the same folder and rename it: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, default=str)
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default
