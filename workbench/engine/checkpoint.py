"""Checkpoints, written to a temp name then renamed, so a crash never leaves half of one.

A checkpoint holds model, optimizer, scheduler and scaler state, the step and epoch position (a
global sample count, so a run can continue at another world size), the RNG states of every rank
and the config, so a resumed run continues exactly.  Two kinds, by dist.strategy:

    ddp    step-N.pt: rank 0 writes the whole state (every rank holds the same).
    fsdp2  step-N/: a torch.distributed.checkpoint (DCP) folder, every rank writing its own shards
           (no gather on rank 0), plus trainer.pt for the rest; rank 0 renames the folder when
           all shards are written.

Either kind resumes either strategy at any world size (DCP reshards; a .pt is sharded on load).
Loading never runs code from the files: torch.load with weights_only, DCP's values included.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from workbench.runfolder import events
from workbench.runfolder.failures import disk_full_cause, disk_full_error
from workbench.runfolder.layout import SHARDED_TRAINER_STATE as TRAINER_STATE
from workbench.runfolder.layout import RunDir
from workbench.runfolder.private import make_dirs, open_private

SHARDED_KEYS = ("model", "optimizer")

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


class ShardedCheckpointWriter:
    """Every rank's writer under fsdp2: its shards into step-N/ (DCP, a collective), then rank 0
    adds trainer.pt, renames the folder into place and drops all but the newest `keep`."""

    def __init__(self, run: RunDir, keep: int, monitor: RankMonitor, is_main: bool):
        self.run, self.keep, self.monitor, self.is_main = run, keep, monitor, is_main
        if is_main:
            remove_dead_temps(run)

    def write(self, step: int, epoch: int, make_state: Callable[[], dict[str, Any]]) -> None:
        with self.monitor.saving:
            path = save_sharded_checkpoint(self.run, step, make_state(), self.keep, self.is_main)
        if self.is_main:
            self.monitor.event(events.CHECKPOINT, path=str(path), epoch=epoch)


def checkpoint_writer(is_main: bool, run: RunDir, keep: int, monitor: RankMonitor,
                      sharded: bool = False) -> CheckpointWriter | NoCheckpointWriter | ShardedCheckpointWriter:
    """The rank's role, decided once: under ddp rank 0 writes checkpoints and the others do nothing;
    under fsdp2 every rank writes its shards."""
    if sharded:
        return ShardedCheckpointWriter(run, keep, monitor, is_main)
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
    _prune(run, keep)
    return path


def save_sharded_checkpoint(run: RunDir, step: int, state: dict[str, Any], keep: int, is_main: bool) -> Path:
    """Collective: every rank writes its shards of model and optimizer to the temp folder; rank 0
    then writes the rest (trainer.pt), renames the folder to step-N/ and prunes old checkpoints."""
    import torch.distributed.checkpoint as dcp

    path, tmp = run.sharded_checkpoint(step), run.sharded_checkpoint_temp(step)
    make_dirs(tmp)
    shards = {key: state.pop(key) for key in SHARDED_KEYS}
    try:
        dcp.save(shards, storage_writer=dcp.FileSystemWriter(tmp))  # fsyncs each file; rank 0 writes .metadata last
        if not is_main:
            return path
        with open_private(tmp / TRAINER_STATE, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():  # the same step written again (a resumed run ending where it started)
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException as exc:
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full_cause(exc) or _disk_full_on_a_rank(exc)
        if full is not None:
            raise disk_full_error(path, full) from exc
        raise
    _prune(run, keep)
    return path


def _disk_full_on_a_rank(exc: BaseException) -> OSError | None:
    """DCP gathers every rank's failure into one CheckpointException: a full disk on any of them."""
    for failure in getattr(exc, "failures", {}).values():
        found = disk_full_cause(failure[0] if isinstance(failure, tuple) else failure)
        if found is not None:
            return found
    return None


def _prune(run: RunDir, keep: int) -> None:
    for old in list_checkpoints(run)[:-keep]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def remove_dead_temps(run: RunDir) -> list[Path]:
    """Remove the temp files (.step-N.pt.tmp-PID) and folders (.step-N.partial) that writers killed
    mid-write left behind (a full checkpoint's size each); called when a run starts or resumes, when
    no other writer is at work (one live job per run folder).  They are never loaded:
    list_checkpoints does not see them."""
    found = run.checkpoint_temps()
    mine = f".tmp-{os.getpid()}"
    removed = [p for p in found if not p.name.endswith(mine)]
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return removed


def list_checkpoints(run: RunDir) -> list[Path]:
    """Finished checkpoints, oldest first (temp files are never listed)."""
    return run.checkpoint_files()


class UnreadableShards(RuntimeError):
    """A sharded checkpoint some rank could not read (DCP's CheckpointException, made an Exception)."""


def _failures(exc: BaseException) -> str:
    found = getattr(exc, "failures", {})
    parts = []
    for rank, failure in sorted(found.items()):
        error = failure[0] if isinstance(failure, tuple) else failure
        parts.append(f"rank {rank}: {type(error).__name__}: {str(error)[:120]}")
    return "; ".join(parts) or str(exc)[:300]


class NoReadableCheckpoint(RuntimeError):
    """The run has checkpoints and none of them loads: resuming would silently start over."""


def load_latest(run: RunDir, on_skip: Callable[[Path, BaseException], None] | None = None,
                shards: Callable[[], dict[str, Any]] | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; an unreadable one (a node crashed under it) is skipped and
    reported to `on_skip`.  None when there are none; NoReadableCheckpoint when none of them loads.
    A sharded checkpoint is read into `shards()` (this rank's model and optimizer state dicts to
    fill, a collective: every rank reads the same checkpoint together); without `shards`, only its
    trainer.pt is read."""
    found = list_checkpoints(run)
    reasons = []
    for path in reversed(found):
        try:
            return path, load_checkpoint(path, shards)
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


def load_checkpoint(path: Path, shards: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    # weights_only: a checkpoint holds tensors and plain values only, so one from someone else's run
    # folder cannot run code when it is loaded (torch refuses anything else).
    if not path.is_dir():
        return torch.load(path, map_location="cpu", weights_only=True)
    state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)
    if shards is not None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        wanted = shards()
        try:
            dcp.load(wanted, checkpoint_id=path, planner=WeightsOnlyLoadPlanner())  # collective
        except CheckpointException as exc:  # a BaseException; raised on every rank alike (DCP gathers failures)
            raise UnreadableShards(_failures(exc)) from None
        state.update(wanted)
    return state


def peek_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's step, world size, sample position and config without reading its weights
    (a .pt is memory-mapped, a sharded one's trainer.pt read)."""
    if path.is_dir():
        return torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {k: v for k, v in state.items() if k not in SHARDED_KEYS}


def read_model_state(path: Path) -> dict[str, Any]:
    """The whole model's state dict from a checkpoint of either kind, in this process alone (no
    process group): for Run.export_model.  A sharded one's shards are joined from its metadata."""
    if not path.is_dir():
        return load_checkpoint(path)["model"]
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp.FileSystemReader(path).read_metadata()
    model: dict[str, Any] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata):
            model[key.removeprefix("model.")] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load({"model": model}, checkpoint_id=path, planner=WeightsOnlyLoadPlanner(), no_dist=True)
    return model


def _weights_only_planner() -> type:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class _Planner(DefaultLoadPlanner):
        """DCP's default planner unpickles non-tensor values (the optimizer's hyperparameters) with
        weights_only=False; each is first read with weights_only=True, which refuses anything but
        plain values, so a planted pickle never runs."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            torch.load(io.BytesIO(value.getvalue()), weights_only=True)  # raises on anything but plain values
            value.seek(0)
            super().load_bytes(read_item, value)

    return _Planner


def WeightsOnlyLoadPlanner() -> Any:  # noqa: N802 - used as a class
    """A DCP load planner that reads no value but tensors and plain ones."""
    return _weights_only_planner()()
