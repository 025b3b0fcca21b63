"""Workbench: config form -> scaling table -> Submit -> live dashboard of the submitted run."""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from workbench.errors import ConfigError
from workbench.ui.dashboard import Dashboard
from workbench.ui.form import ConfigForm
from workbench.ui.scaling_view import ScalingView

if TYPE_CHECKING:
    from workbench.config.sections import JobConfig
    from workbench.launch.pool import Pool
    from workbench.launch.run import Run


class Workbench:
    """The whole loop in one widget.  `.run` is the last submitted Run, `.dashboard` its Dashboard;
    `.runs` every run submitted from it (the "run" picker shows any one's dashboard)."""

    def __init__(self, cfg: JobConfig | None = None, task: Callable[..., Any] | None = None, *,
                 fn: Callable[..., Any] | None = None, args: tuple[Any, ...] = (),
                 kwargs: dict[str, Any] | None = None):
        """`task`: a task factory for the engine; or `fn` (with `args`, `kwargs`): a training function
        that Submit runs on every rank, as workbench.submit_fn does, with the form's dist and launch."""
        if task is not None and fn is not None:
            raise ConfigError(["Workbench: give task= (a task factory) or fn= (a training function), not both"])
        self.task, self.fn, self.fn_args, self.fn_kwargs = task, fn, tuple(args), dict(kwargs or {})
        self.form = ConfigForm(cfg)
        self.scaling = ScalingView(self.form)
        self.run: Run | None = None
        self.dashboard: Dashboard | None = None
        self.runs: list[Run] = []
        self.dashboards: dict[str, Dashboard] = {}
        self._submitting = False
        self.executor = w.ToggleButtons(options=["local", "slurm"], description="executor",
                                        tooltip="launch.executor: where the ranks run")
        w.link((self.executor, "value"), (self.form.widget_for("launch.executor"), "value"))
        self.submit_button = w.Button(description="Submit", icon="play", button_style="primary",
                                      tooltip="Submit the form's config (disabled while a submission is in flight)")
        self.submit_button.on_click(self._on_click)
        self.pool: Pool | None = None
        """The warm ranks Submit goes through while "keep ranks warm" is on (workbench.Pool)."""
        self.keep_warm = w.Checkbox(value=False, description="keep ranks warm", indent=False,
                                    tooltip="Submit runs jobs in ranks started once (workbench.Pool): no start-up "
                                            "per job; close the pool when done")
        self.close_pool_button = w.Button(description="Close pool", icon="power-off",
                                          layout=w.Layout(display="none"),
                                          tooltip="End the warm ranks (and release a SLURM allocation)")
        self.close_pool_button.on_click(lambda _button: self.close_pool())
        self._idle_status = _task_note(fn or task, "function" if fn is not None else "task")
        self.status = w.HTML(self._idle_status)
        self._refused = False
        """The status line says "not submitted" (problems): it goes when the form is valid again."""
        self.form.observe_problems(self._on_checked)
        self.picker = w.Dropdown(description="run", options=[], layout=w.Layout(display="none", width="520px"))
        self.picker.observe(lambda change: self._show(change["new"]), names="value")
        self.run_box = w.VBox()
        # Form and table side by side (they wrap below each other on a narrow screen); the form
        # scrolls in its own box, so the table stays in view while fields are edited.
        form_box = w.VBox([w.HTML("<h4>Config</h4>"), self.form.widget],
                          layout=w.Layout(flex="1 1 560px", min_width="420px", max_height="620px", overflow="auto"))
        side = w.VBox([w.HTML("<h4>Scaling</h4>"), self.scaling.widget,
                       w.HBox([self.executor, self.submit_button]),
                       w.HBox([self.keep_warm, self.close_pool_button]), self.status],
                      layout=w.Layout(flex="1 1 440px", min_width="380px", margin="0 0 0 12px"))
        top = w.HBox([form_box, side], layout=w.Layout(flex_flow="row wrap", align_items="flex-start"))
        self.widget = w.VBox([top, self.picker, self.run_box])

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _on_click(self, _button: Any) -> None:
        """A click while a submission is in flight does nothing: a double-click makes one run.  The
        flag is set here, in the kernel's message loop, before the next click message is read."""
        if self._submitting:
            return
        self._submitting = True
        self.submit_button.disabled, self.submit_button.description = True, "Submitting…"
        threading.Thread(target=self._submit_in_background, name="workbench-submit", daemon=True).start()

    def _submit_in_background(self) -> None:
        try:
            self.submit()
        finally:
            self._submitting = False
            self.submit_button.disabled, self.submit_button.description = False, "Submit"

    def submit(self) -> Run | None:
        """Submit the form's config; problems are shown in the form (never raised).  Returns the Run."""
        import workbench

        try:
            cfg = self.form.config
            target: Any = self._warm_pool(cfg) if self.keep_warm.value else workbench
            if self.fn is not None:
                run = target.submit_fn(self.fn, *self.fn_args, cfg=cfg, **self.fn_kwargs)
            else:
                run = target.submit(cfg, task=self.task)
        except ConfigError as exc:
            self.form.show_problems(exc.problems, "not submitted - fix these first:")
            self.status.value = _message("not submitted: the config has problems (listed in the form)", ok=False)
            self._refused = True
            return None
        except Exception as exc:  # noqa: BLE001 - a button callback: show it, don't lose it in a log
            self.status.value = _message(f"submit failed: {type(exc).__name__}: {exc}", ok=False)
            return None
        self._add_run(run)
        return run

    def _on_checked(self, problems: list[str]) -> None:
        """After each check of the form: a "not submitted" about problems clears once there are none."""
        if self._refused and not problems:
            self._refused = False
            ready = _message("the form's config is valid: ready to submit", ok=True)
            self.status.value = "<br>".join(filter(None, (self._idle_status, ready)))

    def _warm_pool(self, cfg: JobConfig) -> Pool:
        """The widget's pool, started for this config's ranks when there is none (or it closed, or
        the form now asks other ranks: then the old one is closed first)."""
        import workbench

        if self.pool is not None and self.pool.alive():
            try:
                self.pool.check(cfg)
                return self.pool
            except ConfigError:
                self.pool.close()
        self.pool = workbench.Pool(cfg)
        self.close_pool_button.layout.display = ""
        return self.pool

    def close_pool(self) -> None:
        """End the warm ranks (the Close pool button)."""
        if self.pool is not None:
            self.pool.close()
            self.status.value = _message(f"pool {self.pool.name} closed", ok=True)
        self.pool = None
        self.close_pool_button.layout.display = "none"

    def _add_run(self, run: Run) -> None:
        key = str(run.folder)
        self.runs.append(run)
        self.dashboards[key] = Dashboard(run)
        self.picker.options = [(Path(str(r.folder)).name, str(r.folder)) for r in reversed(self.runs)]
        self.picker.layout.display = "" if len(self.runs) > 1 else "none"
        self.picker.value = key  # shows its dashboard
        self._show(key)
        self._refused = False
        self.status.value = _message(f"submitted {run.folder}", ok=True)

    def _show(self, key: str | None) -> None:
        """Show the dashboard of the run `key` (its folder); every submitted run keeps its own."""
        if key is None or key not in self.dashboards:
            return
        self.dashboard = self.dashboards[key]
        self.run = self.dashboard.run
        self.run_box.children = [self.dashboard.widget]


def _task_note(obj: Callable[..., Any] | None, kind: str = "task") -> str:
    if obj is None:
        return ""
    name = getattr(obj, "__qualname__", None) or getattr(getattr(obj, "func", None), "__qualname__", repr(obj))
    what = "runs on every rank" if kind == "function" else "a Python object; it replaces task.name"
    return _message(f"{kind}: {name} ({what})", ok=True)


def _message(text: str, ok: bool) -> str:
    mark = '<b style="color:#2e7d32">✓</b>' if ok else '<b style="color:#d32f2f">✘</b>'
    return f'<span style="color:var(--jp-ui-font-color1,#222)">{mark} {html.escape(text)}</span>'
