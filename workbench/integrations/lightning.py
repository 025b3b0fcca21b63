"""A Lightning Logger for the Trainer and for Fabric that writes every rank's logged values.

    trainer = L.Trainer(strategy="ddp", logger=WorkbenchLogger())
    fabric = L.Fabric(strategy="ddp", loggers=[WorkbenchLogger()])

Lightning's own loggers write from rank 0 only (``@rank_zero_only``); this one writes on every rank,
so values logged without ``sync_dist=True`` show each rank's own number."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from lightning.pytorch.loggers import Logger

from workbench.engine.script import log
from workbench.integrations import numbers


class WorkbenchLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self._step = 0

    @property
    def name(self) -> str:
        return "workbench"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        return None  # the run folder keeps the config; hyperparameters are not per-step metrics

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        values = numbers(metrics)
        values.pop("step", None)
        if values:
            self._step = self._step + 1 if step is None else int(step)
            log(step=self._step, **values)
