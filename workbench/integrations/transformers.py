"""A Hugging Face Trainer callback that writes what the Trainer logs, on every rank.

    trainer = Trainer(model, args, train_dataset=..., callbacks=[WorkbenchCallback()])

The Trainer calls ``on_log`` on every rank with the same values (its training loss is already
averaged across ranks); the callback writes them with ``state.global_step``, so the dashboard and
`workbench show` follow a Trainer job like any other."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from workbench.engine.script import log
from workbench.integrations import numbers


class WorkbenchCallback(TrainerCallback):
    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        values = numbers(logs or {})
        if values:
            log(step=int(state.global_step), **values)
