"""An Accelerate tracker that writes every rank's logged values.

    accelerator = Accelerator(log_with=WorkbenchTracker())
    accelerator.init_trackers("my-run")
    accelerator.log({"loss": loss.item()}, step=step)      # on every rank, as usual

``Accelerator.log`` runs on the main process only, whatever the tracker says.  Creating a
WorkbenchTracker therefore also lets ``Accelerator.log`` hand every other rank's values to the
WorkbenchTrackers of that accelerator (and to nothing else), so each rank's own numbers reach its
metrics file; the main process logs to every tracker as before."""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator
from accelerate.tracking import GeneralTracker

from workbench.engine.script import log
from workbench.integrations import numbers


class WorkbenchTracker(GeneralTracker):
    name = "workbench"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str = "workbench") -> None:
        super().__init__()
        self.run_name = run_name
        self._step = 0
        _log_on_every_rank()

    @property
    def tracker(self) -> None:
        return None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        return None  # the run folder keeps the config

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        found = numbers(values)
        found.pop("step", None)
        if found:
            self._step = self._step + 1 if step is None else int(step)
            log(step=self._step, **found)


def _log_on_every_rank() -> None:
    """Wrap Accelerator.log once so that non-main ranks reach their WorkbenchTrackers."""
    original = Accelerator.log
    if getattr(original, "_workbench_every_rank", False):
        return

    def log_every_rank(self: Accelerator, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> Any:
        if not self.is_main_process:
            for tracker in self.log_with:
                if isinstance(tracker, WorkbenchTracker):
                    tracker.log(values, step=step)
        return original(self, values, step=step, log_kwargs=log_kwargs)

    log_every_rank._workbench_every_rank = True  # type: ignore[attr-defined]
    Accelerator.log = log_every_rank
