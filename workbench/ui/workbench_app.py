"""Workbench: config form -> scaling table -> Submit -> live dashboard of the submitted run."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from workbench.configtypes import ConfigError
from workbench.ui.dashboard import Dashboard
from workbench.ui.form import ConfigForm
from workbench.ui.scaling_view import ScalingView

if TYPE_CHECKING:
    from workbench.config import JobConfig
    from workbench.launch.run import Run


class Workbench:
    """The whole loop in one widget.  `.run` is the last submitted Run, `.dashboard` its Dashboard."""

    def __init__(self, cfg: JobConfig | None = None, task: Callable[..., Any] | None = None):
        self.task = task
        self.form = ConfigForm(cfg)
        self.scaling = ScalingView(self.form)
        self.run: Run | None = None
        self.dashboard: Dashboard | None = None
        self.executor = w.ToggleButtons(options=["local", "slurm"], description="executor",
                                        tooltip="launch.executor: where the ranks run")
        w.link((self.executor, "value"), (self.form.widget_for("launch.executor"), "value"))
        self.submit_button = w.Button(description="Submit", icon="play", button_style="primary")
        self.submit_button.on_click(lambda _: self.submit())
        self.status = w.HTML(_task_note(task))
        self.run_box = w.VBox()
        self.widget = w.VBox([
            w.HTML("<h4>Config</h4>"), self.form.widget,
            w.HTML("<h4>Scaling</h4>"), self.scaling.widget,
            w.HBox([self.executor, self.submit_button]), self.status, self.run_box,
        ])

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def submit(self) -> Run | None:
        """Submit the form's config; problems are shown in the form (never raised).  Returns the Run."""
        import workbench

        try:
            cfg = self.form.config
            run = workbench.submit(cfg, task=self.task)
        except ConfigError as exc:
            self.form.show_problems(exc.problems, "not submitted - fix these first:")
            self.status.value = _message("not submitted: the config has problems (listed in the form)", ok=False)
            return None
        except Exception as exc:  # noqa: BLE001 - a button callback: show it, don't lose it in a log
            self.status.value = _message(f"submit failed: {type(exc).__name__}: {exc}", ok=False)
            return None
        self._show_run(run)
        return run

    def _show_run(self, run: Run) -> None:
        if self.dashboard is not None:
            self.dashboard.stop()
        self.run, self.dashboard = run, Dashboard(run)
        self.run_box.children = [self.dashboard.widget]
        self.status.value = _message(f"submitted {run.folder}", ok=True)


def _task_note(task: Callable[..., Any] | None) -> str:
    if task is None:
        return ""
    name = getattr(task, "__qualname__", None) or getattr(getattr(task, "func", None), "__qualname__", repr(task))
    return _message(f"task: {name} (a Python object; it replaces task.name)", ok=True)


def _message(text: str, ok: bool) -> str:
    colour = "#3c763d" if ok else "#a94442"
    return f'<span style="color:{colour}">{html.escape(text)}</span>'
