"""Checkpoints: written by rank 0 to a temp name then renamed, so a crash never leaves half a file.

A checkpoint holds model, optimizer, scheduler and scaler state, the step and epoch position, the
RNG states of every rank (gathered to rank 0), and the config, so a resumed run continues exactly.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from workbench.runfolder import events
from workbench.runfolder.failures import disk_full_cause, disk_full_error
from workbench.runfolder.layout import RunDir
from workbench.runfolder.private import make_dirs, open_private

if TYPE_CHECKING:
    from workbench.engine.monitor import RankMonitor


class CheckpointWriter:
    """Rank 0's writer: step-N.pt, atomically, keeping the newest `keep`; records a checkpoint event.
    The monitor's `saving` lock is held while writing, so a stopping rank never cuts a write short."""

    def __init__(self, run: RunDir, keep: int, monitor: RankMonitor):
        self.run, self.keep, self.monitor = run, keep, monitor
        remove_dead_temps(run)  # a writer killed mid-write left its temp file; no other writer runs now

    def write(self, step: int, epoch: int, make_state: Callable[[], dict[str, Any]]) -> None:
        with self.monitor.saving:
            path = save_checkpoint(self.run, step, make_state(), self.keep)
        self.monitor.event(events.CHECKPOINT, path=str(path), epoch=epoch)


class NoCheckpointWriter:
    """Every other rank's: nothing to write (rank 0 holds the same replicated state)."""

    def write(self, step: int, epoch: int, make_state: Callable[[], dict[str, Any]]) -> None:
        return None


def checkpoint_writer(is_main: bool, run: RunDir, keep: int,
                      monitor: RankMonitor) -> CheckpointWriter | NoCheckpointWriter:
    """The rank's role, decided once: rank 0 writes checkpoints, the others do nothing."""
    return CheckpointWriter(run, keep, monitor) if is_main else NoCheckpointWriter()


def gather_rng_states(world_size: int) -> list[Any]:
    """Every rank's RNG states, on every rank (all_gather_object: a collective every rank must reach)."""
    states: list[Any] = [None] * world_size
    dist.all_gather_object(states, rng_state())
    return states


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np

        name, keys, pos, has_gauss, gauss = np.random.get_state()  # plain values: loads with weights_only
        state["numpy"] = (str(name), torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss),
                          float(gauss))
    except ImportError:
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def save_checkpoint(run: RunDir, step: int, state: dict[str, Any], keep: int) -> Path:
    """Atomically write step-N.pt and drop all but the `keep` newest checkpoints."""
    path = run.checkpoint(step)
    make_dirs(path.parent)
    tmp = run.checkpoint_temp(step, os.getpid())
    try:
        with open_private(tmp, "wb") as fh:  # 0600: a checkpoint is a pickle
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())  # on disk before the rename makes it the latest
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)  # never leave half a checkpoint behind (a full disk, a signal)
        full = disk_full_cause(exc)
        if full is not None:
            raise disk_full_error(path, full) from exc
        raise
    for old in list_checkpoints(run)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def remove_dead_temps(run: RunDir) -> list[Path]:
    """Remove the temp files (.step-N.pt.tmp-PID) that writers killed mid-write left behind (a full
    checkpoint's size each); called when a run starts or resumes, when no other writer is at work
    (one live job per run folder).  They are never loaded: list_checkpoints does not see them."""
    found = run.checkpoint_temps()
    mine = f".tmp-{os.getpid()}"
    removed = [p for p in found if not p.name.endswith(mine)]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def list_checkpoints(run: RunDir) -> list[Path]:
    """Finished checkpoints, oldest first (temp files are never listed)."""
    return run.checkpoint_files()


class NoReadableCheckpoint(RuntimeError):
    """The run has checkpoints and none of them loads: resuming would silently start over."""


def load_latest(run: RunDir, on_skip: Callable[[Path, BaseException], None] | None = None,
                ) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; an unreadable one (a node crashed under it) is skipped and
    reported to `on_skip`.  None when there are none; NoReadableCheckpoint when none of them loads."""
    found = list_checkpoints(run)
    reasons = []
    for path in reversed(found):
        try:
            return path, load_checkpoint(path)
        except Exception as exc:  # noqa: BLE001 - truncated or corrupt: fall back to the one before
            print(f"[workbench] skipping unreadable checkpoint {path}: {exc}", flush=True)
            reasons.append(f"{path.name}: {type(exc).__name__}: {str(exc)[:200]}")
            if on_skip is not None:
                on_skip(path, exc)
    if found:
        raise NoReadableCheckpoint(
            f"none of the run's checkpoints in {run.checkpoints} can be read ({'; '.join(reasons)}); "
            "resubmit with from_scratch=True (workbench run --from-scratch) to start over, keeping them aside")
    return None


def load_checkpoint(path: Path) -> dict[str, Any]:
    # weights_only: a checkpoint holds tensors and plain values only, so one from someone else's run
    # folder cannot run code when it is loaded (torch refuses anything else).
    return torch.load(path, map_location="cpu", weights_only=True)
