"""Workbench: config form -> scaling table -> Submit -> live dashboard of the submitted run.

A field given several values ("1e-3, 3e-3") turns Submit into "Sweep N trials": workbench.sweep runs
them, and a SweepView of the sweep (live table, figure, Cancel) takes the dashboard's place."""

from __future__ import annotations

import functools
import html
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import ipywidgets as w

from workbench.errors import ConfigError
from workbench.ui import sweepform
from workbench.ui.dashboard import Dashboard
from workbench.ui.form import ConfigForm
from workbench.ui.scaling_view import ScalingView
from workbench.ui.sweepview import SweepView

if TYPE_CHECKING:
    from workbench.config.sections import JobConfig
    from workbench.launch.pool import Pool
    from workbench.launch.run import Run
    from workbench.sweeps.driver import Sweep

T = TypeVar("T")

DOUBLE_CLICK_S = 2.0
"""A click this soon after the click that submitted belongs to the same double-click (a browser under
load delivers the second click late); a deliberate second run is a click after it, or `app.submit()`."""
SWEEP_NOTE = ("color:var(--jp-ui-font-color1,#222);border-left:3px solid #1976d2;padding:0 6px;margin:2px 0;"
              "line-height:1.4")


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
        self._swept_fn = functools.partial(fn, **self.fn_kwargs) if fn is not None and self.fn_kwargs else fn
        self.form.sweep_target = {"fn": self._swept_fn, "task": task}
        self.scaling = ScalingView(self.form)
        self.run: Run | None = None
        self.dashboard: Dashboard | None = None
        self.runs: list[Run] = []
        self.dashboards: dict[str, Dashboard] = {}
        self.sweeps: list[Sweep] = []
        """Every sweep started from the form (fields given several values); `.sweep_view` the last one's view."""
        self.sweep_view: SweepView | None = None
        self.sweep_views: dict[str, SweepView] = {}
        self._submitting = False
        self._clicked_at = -DOUBLE_CLICK_S  # when the last accepted click came
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
        self._build_sweep_controls()
        self.form.observe_problems(self._on_checked)
        self.picker = w.Dropdown(description="run", options=[], layout=w.Layout(display="none", width="520px"))
        self.picker.observe(lambda change: self._show(change["new"]), names="value")
        self.run_box = w.VBox()
        # Form and table side by side (they wrap below each other on a narrow screen); the form
        # scrolls in its own box, so the table stays in view while fields are edited.
        form_box = w.VBox([w.HTML("<h4>Config</h4>"), self.form.widget],
                          layout=w.Layout(flex="1 1 560px", min_width="420px", max_height="620px", overflow="auto"))
        side = w.VBox([w.HTML("<h4>Scaling</h4>"), self.sweep_note, self.scaling.widget, self.sweep_controls,
                       w.HBox([self.executor, self.submit_button]),
                       w.HBox([self.keep_warm, self.close_pool_button]), self.status],
                      layout=w.Layout(flex="1 1 440px", min_width="380px", margin="0 0 0 12px"))
        top = w.HBox([form_box, side], layout=w.Layout(flex_flow="row wrap", align_items="flex-start"))
        self.widget = w.VBox([top, self.picker, self.run_box])
        self._sync_mode()

    def _build_sweep_controls(self) -> None:
        """trials, parallel and metric for workbench.sweep, and the note saying what the sweep is:
        shown while a field holds several values."""
        narrow = {"description_width": "initial"}
        self.trials = w.Text(description="trials", placeholder="all", continuous_update=False, style=narrow,
                             tooltip="how many trials (a range needs it; empty: every grid point)",
                             layout=w.Layout(width="130px"))
        self.parallel = w.Text(value="1", description="parallel", continuous_update=False, style=narrow,
                               tooltip="trials running at once", layout=w.Layout(width="110px"))
        self.metric = w.Text(value="val_loss", description="metric", continuous_update=False, style=narrow,
                             tooltip="the metric to optimise and prune on (val_loss, loss, ...)",
                             layout=w.Layout(width="190px"))
        for control in (self.trials, self.parallel, self.metric):
            control.observe(lambda _change: self._sync_mode(), names="value")
        self.sweep_problems = w.HTML()
        self.sweep_note = w.HTML(layout=w.Layout(display="none"))
        self.sweep_controls = w.VBox([w.HBox([self.trials, self.parallel, self.metric]), self.sweep_problems],
                                     layout=w.Layout(display="none"))

    def _sweep_options(self) -> tuple[sweepform.SweepOptions | None, list[str]]:
        return sweepform.read_options(self.form.space, self.trials.value, self.parallel.value, self.metric.value)

    def _sync_mode(self) -> None:
        """A plain Submit for one config; "Sweep N trials", the note and the controls for several values."""
        space = self.form.space
        options, problems = self._sweep_options() if space else (None, [])
        shown = "" if space else "none"
        self.sweep_controls.layout.display = self.sweep_note.layout.display = shown
        if space:
            trials = options.trials if options is not None else None
            point = (f"; the table shows the first point ({sweepform.first_point(space)})"
                     if not self.form.problems else "")
            self.sweep_note.value = (f"<div class='wb-sweep-note' style='{SWEEP_NOTE}'>"
                                     f"{html.escape(sweepform.summary(space, trials) + point)}</div>")
            self.sweep_problems.value = "".join(f"<div class='wb-sweep-problem'>{_message(p, ok=False)}</div>"
                                                for p in problems)
        if not self._submitting:
            self.submit_button.description = sweepform.button_label(space, options)
            self.submit_button.icon = "th" if space else "play"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _on_click(self, _button: Any) -> None:
        """A double-click makes one run: a click while a submission is in flight, or within
        DOUBLE_CLICK_S of the click that started the last one, does nothing.  The second click of a
        double-click can reach the kernel after a quick submission has ended (a busy browser sends it
        late: 0.7 s was seen), so being in flight is not enough.  The flag is set here, in the kernel's
        message loop, before the next click message is read."""
        now = time.monotonic()
        if self._submitting or now - self._clicked_at < DOUBLE_CLICK_S:
            return
        self._submitting, self._clicked_at = True, now
        sweeping = bool(self.form.space)
        self.submit_button.disabled, self.submit_button.description = True, "Starting…" if sweeping else "Submitting…"
        action = self.sweep if sweeping else self.submit
        threading.Thread(target=self._submit_in_background, args=(action,), name="workbench-submit",
                         daemon=True).start()

    def _submit_in_background(self, action: Callable[[], Any]) -> None:
        made = None
        try:
            made = action()
        finally:
            if made is None:  # refused or failed: the next click is the user's retry, not a double-click
                self._clicked_at = -DOUBLE_CLICK_S
            self._submitting = False
            self.submit_button.disabled = False
            self._sync_mode()

    def submit(self) -> Run | None:
        """Submit the form's config; problems are shown in the form (never raised).  Returns the Run."""
        import workbench

        def start() -> Run:
            cfg = self.form.config
            if self.form.space:
                raise ConfigError([f"{', '.join(self.form.space)}: several values make a sweep; click "
                                   "Sweep (Workbench.sweep()), or give one value to submit one run"])
            target: Any = self._warm_pool(cfg) if self.keep_warm.value else workbench
            if self.fn is not None:
                return target.submit_fn(self.fn, *self.fn_args, cfg=cfg, **self.fn_kwargs)
            return target.submit(cfg, task=self.task)

        run = self._shown_in_form(start, "not submitted", "the config has problems", "submit failed")
        if run is not None:
            self._add_run(run)
        return run

    def sweep(self) -> Sweep | None:
        """Sweep the fields the form gives several values (workbench.sweep, with the trials, parallel
        and metric controls); problems are shown in the form (never raised).  Returns the Sweep."""
        import workbench

        def start() -> Sweep:
            from workbench.sweeps.payload import Fn

            cfg, space = self.form.config, self.form.space
            options, problems = self._sweep_options()
            if not space:
                raise ConfigError(["sweep: no field holds several values; write e.g. 1e-3, 3e-3 in train.lr"])
            if options is None:
                raise ConfigError(problems)
            return workbench.sweep(cfg, space, trials=options.trials, parallel=options.parallel,
                                   metric=options.metric, pool=self._warm_pool(cfg) if self.keep_warm.value else None,
                                   payload=Fn(self._swept_fn, *self.fn_args) if self._swept_fn else self.task)

        sweep = self._shown_in_form(start, "sweep not started", "the form has problems", "sweep failed")
        if sweep is not None:
            self._add_sweep(sweep)
        return sweep

    def _shown_in_form(self, start: Callable[[], T], refused: str, why: str, failed: str) -> T | None:
        """Run a button's action: a ConfigError's problems listed in the form under `refused`, any
        other error one status line (a button callback: shown, never lost in a log)."""
        try:
            return start()
        except ConfigError as exc:
            self.form.show_problems(exc.problems, f"{refused} - fix these first:")
            self.status.value = _message(f"{refused}: {why} (listed in the form)", ok=False)
            self._refused = True
        except Exception as exc:  # noqa: BLE001 - a button callback: show it, don't lose it in a log
            self.status.value = _message(f"{failed}: {type(exc).__name__}: {exc}", ok=False)
        return None

    def _add_sweep(self, sweep: Sweep) -> None:
        self.sweeps.append(sweep)
        self.sweep_view = SweepView(sweep)
        self.sweep_views[str(sweep.folder)] = self.sweep_view
        self._list_views(str(sweep.folder))
        self._refused = False
        self.status.value = _message(f"sweep started: {sweep.folder}", ok=True)

    def _on_checked(self, problems: list[str]) -> None:
        """After each check of the form: a "not submitted" about problems clears once there are none;
        the button and the sweep controls follow the form (one value or several)."""
        self._sync_mode()
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
        self._list_views(key)
        self._refused = False
        self.status.value = _message(f"submitted {run.folder}", ok=True)

    def _list_views(self, key: str) -> None:
        """The picker lists every run and sweep started here, newest first, and shows `key`'s view."""
        shown = [*self.dashboards, *self.sweep_views]
        self.picker.options = [(Path(k).name, k) for k in reversed(shown)]
        self.picker.layout.display = "" if len(shown) > 1 else "none"
        self.picker.value = key  # shows its view
        self._show(key)

    def _show(self, key: str | None) -> None:
        """Show the dashboard of the run `key` (its folder), or the view of the sweep `key`; every
        submitted run and sweep keeps its own."""
        if key is not None and key in self.sweep_views:
            self.run_box.children = [self.sweep_views[key].widget]
            return
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
