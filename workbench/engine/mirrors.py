"""Live copies of a rank's metrics to the tools people already use: TensorBoard (every rank, its own
event file), Weights & Biases and MLflow (rank 0: one run each), as the `log` config section asks.

A mirror never stops training: one that cannot start or fails later is dropped, and the rank records
a "warning" event saying which and why (the dashboard's health line and `workbench show` list it).
The JSONL files stay the source of truth; a mirror is a copy.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from workbench.runfolder.records import scalars

if TYPE_CHECKING:
    from workbench.config.sections import JobConfig
    from workbench.runfolder.layout import RunDir

class TensorBoardMirror:
    name = "log.tensorboard"

    def __init__(self, cfg: JobConfig, run: RunDir, rank: int):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        from workbench.runfolder.private import own_folder

        folder = own_folder(run.root, run.tensorboard(rank))  # a link planted there: refused, not written through
        self.writer = SummaryWriter(log_dir=str(folder), flush_secs=5)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbMirror:
    name = "log.wandb"

    def __init__(self, cfg: JobConfig, run: RunDir, rank: int):
        import wandb

        folder = run.wandb
        folder.mkdir(exist_ok=True)
        mode: Any = cfg.log.wandb_mode or os.environ.get("WANDB_MODE")  # None: W&B's own default
        self.run = wandb.init(project=cfg.log.wandb_project, name=run.root.name, dir=str(folder),
                              config=cfg.to_dict(), mode=mode, reinit="create_new")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowMirror:
    name = "log.mlflow"

    def __init__(self, cfg: JobConfig, run: RunDir, rank: int):
        from mlflow.tracking import MlflowClient

        from workbench.config.sections import flatten

        self.client = MlflowClient(tracking_uri=cfg.log.mlflow_tracking_uri or None)
        found = self.client.get_experiment_by_name(cfg.log.mlflow_experiment)
        experiment = found.experiment_id if found else self.client.create_experiment(cfg.log.mlflow_experiment)
        self.run_id = self.client.create_run(experiment, run_name=run.root.name).info.run_id
        for key, value in flatten(cfg.to_dict()).items():
            self.client.log_param(self.run_id, key, str(value)[:500])

    def log(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


MIRRORS: dict[str, tuple[Any, bool]] = {
    "tensorboard": (TensorBoardMirror, True), "wandb": (WandbMirror, False), "mlflow": (MlflowMirror, False)}
"""log field -> (mirror, on every rank?); the others mirror from rank 0 only."""


class Mirrors:
    """The rank's mirrors; errors become warning events (through `warn`) and drop the mirror."""

    def __init__(self, cfg: JobConfig, run: RunDir, rank: int, warn: Callable[[str], None]):
        self.warn = warn
        self.active: list[Any] = []
        for field, (kind, every_rank) in MIRRORS.items():
            if getattr(cfg.log, field) and (every_rank or rank == 0):
                try:
                    self.active.append(kind(cfg, run, rank))
                except Exception as exc:  # noqa: BLE001 - a missing package or a bad URI: warn, train on
                    self._failed(f"{kind.name}: could not start ({type(exc).__name__}: {exc}); "
                                 "training goes on without it")

    def log(self, record: dict[str, Any]) -> None:
        """Copy one metrics record (or eval result) to every mirror."""
        values = scalars(record)
        if not values or "step" not in record:
            return
        for mirror in list(self.active):
            try:
                mirror.log(int(record["step"]), values)
            except Exception as exc:  # noqa: BLE001 - a mirror must never break training
                self.active.remove(mirror)
                self._failed(f"{mirror.name}: stopped ({type(exc).__name__}: {exc}); training goes on without it")

    def close(self) -> None:
        for mirror in self.active:
            try:
                mirror.close()
            except Exception as exc:  # noqa: BLE001 - the run itself is done; say so and move on
                self._failed(f"{mirror.name}: could not close ({type(exc).__name__}: {exc})")
        self.active = []

    def _failed(self, message: str) -> None:
        self.warn(message)


class NoMirrors:
    """The default: nothing to copy to."""

    active: list[Any] = []

    def log(self, record: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None
