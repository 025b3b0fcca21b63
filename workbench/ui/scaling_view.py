"""ScalingView: the scaling table of the form's config, live, with optional measured throughput."""

from __future__ import annotations

import html
import json
import numbers
import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import pandas as pd

from workbench.config.scaling import RULES, parse_world_sizes, reference_note, scaling_table
from workbench.errors import ConfigError
from workbench.ui.tables import TABLE_LABELS, header_cell, scrolling

if TYPE_CHECKING:
    from workbench.config.sections import JobConfig
    from workbench.ui.form import ConfigForm

RULE_CHOICES = [("rule from the config", "config"), *[(r, r) for r in RULES], ("compare all rules", "compare")]
MEASURED = {"samples_per_s": "measured_samples_per_s", "efficiency": "measured_efficiency"}
SELECTED_STYLE = ("background:var(--jp-layout-color2,#eee);color:var(--jp-ui-font-color0,#000);font-weight:bold;"
                  "box-shadow:inset 4px 0 0 #f57c00")
"""The config's own row: the theme's own contrast pair (readable light and dark), an orange edge."""
MUTED = "color:var(--jp-ui-font-color2,#666);font-size:85%;line-height:1.4"


def scaling_frame(cfg: JobConfig, world_sizes: list[int], choice: str = "config",
                  measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """The scaling table at `world_sizes` plus the config's own world size, with measured columns."""
    sizes = sorted(set(world_sizes) | {cfg.world_size})
    rule = None if choice in ("config", "compare") else choice
    frame = scaling_table(cfg, sizes, rule=rule, compare_rules=choice == "compare")
    return merge_measured(frame, measured)


def merge_measured(frame: pd.DataFrame, measured: pd.DataFrame | None) -> pd.DataFrame:
    """Add measured_samples_per_s / measured_efficiency by world size (NaN where not measured)."""
    if measured is None or len(measured) == 0 or "world_size" not in measured:
        return frame
    columns = [c for c in MEASURED if c in measured]
    if not columns:
        return frame
    found = measured.groupby("world_size", as_index=False)[columns].last().rename(columns=MEASURED)
    found["world_size"] = found["world_size"].astype(int)
    return frame.merge(found, on="world_size", how="left")


def table_html(frame: pd.DataFrame) -> str:
    """An HTML table; rows at the config's own world size carry class wb-selected and a highlight."""
    shown = [c for c in frame.columns if c != "selected"]
    head = "".join(header_cell(c, "padding:2px 5px;text-align:right", TABLE_LABELS) for c in shown)
    rows = []
    for _, row in frame.iterrows():
        selected = bool(row.get("selected", False))
        attrs = f' class="wb-selected" style="{SELECTED_STYLE}"' if selected else ""
        cells = "".join(f"<td style='padding:2px 5px;text-align:right;white-space:nowrap'>{_cell(c, row[c])}</td>"
                        for c in shown)
        rows.append(f"<tr{attrs}>{cells}</tr>")
    body = "".join(rows)
    return scrolling(f"<table class='wb-scaling' style='font-size:92%'><thead><tr>{head}</tr></thead>"
                     f"<tbody>{body}</tbody></table>")


def _cell(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "—"
    if column == "measured_efficiency":
        return f"{float(value):.0%}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) >= 10_000:
        return f"{int(value):,}"  # a plan's max_micro_batch of a small model: 20,981,033, not 20981033
    return html.escape(str(value))


class ScalingView:
    """How batch, lr, warmup and steps/epoch change with world size, for the form's config."""

    def __init__(self, form: ConfigForm, world_sizes: str = "1,2,4,8", measured: pd.DataFrame | None = None):
        self.form = form
        self.measured = measured
        self.frame = pd.DataFrame()
        narrow = {"description_width": "initial"}
        self.rule = w.Dropdown(options=RULE_CHOICES, value="config", description="rule", style=narrow,
                               layout=w.Layout(width="220px"))
        self.world_sizes = w.Text(value=world_sizes, description="world sizes", continuous_update=False,
                                  style=narrow, layout=w.Layout(width="200px"))
        self.plan = w.Checkbox(value=True, description="memory a rank", indent=False, layout=w.Layout(width="140px"),
                               tooltip="peak memory a rank, traced on fake tensors (workbench.plan), whether it fits "
                                       "in 0.85 of the device's memory, and the largest micro-batch that does")
        self.speed = w.Checkbox(value=False, description="speed", indent=False, layout=w.Layout(width="80px"),
                                tooltip="predicted step time, samples/s and epoch time at each world size "
                                        "(workbench.plan: it measures your model's step on this machine, a few "
                                        "seconds to a minute, once per model and world sizes)")
        self._speeds: dict[str, pd.DataFrame | str] = {}
        """The plan's speed columns (or why there are none) by what they depend on (speed_key)."""
        self._predicting: str | None = None
        """The key whose speed a background thread is predicting now."""
        self._plans: dict[str, pd.DataFrame] = {}
        """The plan's memory columns by what they depend on (the task and its options, the micro-batch,
        precision, optimizer, ranks a node): traced once per model shape, not at every change of lr."""
        self.traces = 0
        self.note = w.HTML()
        self.table = w.HTML()
        self.rule.observe(lambda _: self.update(), names="value")
        self.world_sizes.observe(lambda _: self.update(), names="value")
        self.plan.observe(lambda _: self.update(), names="value")
        self.speed.observe(lambda _: self.update(), names="value")
        self.stale = w.HTML()
        form.observe_problems(lambda _problems: self.update())
        controls = w.HBox([self.rule, self.world_sizes, self.plan, self.speed], layout=w.Layout(flex_flow="row wrap"))
        self.widget = w.VBox([controls, self.stale, self.table, self.note])
        self.update()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def set_measured(self, frame: pd.DataFrame | None) -> None:
        """Measured throughput per world size (columns world_size, samples_per_s, efficiency)."""
        self.measured = frame
        self.update()

    def update(self) -> None:
        problems = self.form.problems
        cfg = self.form.last_valid
        self.stale.value = _stale(problems, cfg is not None)
        self.table.layout.opacity = "0.55" if problems else "1"
        if cfg is None:
            self.table.value, self.note.value = "", ""
            return
        try:
            sizes = parse_world_sizes(self.world_sizes.value)
        except ConfigError as exc:
            self.note.value = _note(exc.problems[0])
            return
        self.frame = scaling_frame(cfg, sizes, self.rule.value, self.measured)
        planned = ""
        if self.plan.value:
            self.frame, planned = self._with_memory(cfg, self.frame)
        if self.speed.value:
            self.frame, said = self._with_speed(cfg, sizes, self.frame)
            planned += said
        self.table.value = table_html(self.frame)
        self.note.value = _caption(cfg, self.rule.value) + planned

    def _with_memory(self, cfg: JobConfig, frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
        """The frame with the plan's peak_mb, fits and max_micro_batch (the same at every world size under
        DDP), and a note: what does not fit and the way out, or why there is no plan."""
        from workbench.planning.plan import fit_text, plan

        t = cfg.train
        key = json.dumps([cfg.task.name, cfg.task.options, t.micro_batch_size, t.precision, t.optimizer,
                          t.optimizer_kwargs, t.grad_clip_norm, cfg.dist.gradient_as_bucket_view,
                          cfg.dist.procs_per_node], sort_keys=True, default=str)
        if key not in self._plans:
            try:
                self._plans[key] = plan(cfg, world_sizes=(cfg.world_size,), probe=False)
            except Exception as exc:  # noqa: BLE001 - the table stays; the plan says in one line why it is not there
                return frame, _note(f"memory: no plan ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
            self.traces += 1
        planned = self._plans[key]
        row = planned.iloc[0]
        frame = frame.assign(peak_mb=row["peak_mb"], fits=row["fits"], max_micro_batch=row["max_micro_batch"])
        lines = fit_text(planned)
        if lines:
            return frame, _note(f"does not fit: {lines[0].split(': ', 1)[1]}")
        if row["fits"] is None:
            return frame, _note(planned.attrs["notes"][0])
        return frame, (f"<div class='wb-plan' style='{MUTED}'>peak_mb: one rank's peak in MiB, traced on fake "
                       f"tensors (workbench.plan); fits within 0.85 of {row['device_memory_mb']:,.0f} MiB a rank"
                       "</div>")


    def _with_speed(self, cfg: JobConfig, sizes: list[int], frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
        """The frame with the plan's step_s, samples_per_s and epoch_s by world size, once a background
        thread has predicted them (the table stays live meanwhile); a note while it works or why not."""
        all_sizes = sorted(set(sizes) | {cfg.world_size})
        key = speed_key(cfg, all_sizes)
        found = self._speeds.get(key)
        if isinstance(found, pd.DataFrame):
            frame = frame.merge(found, on="world_size", how="left")
            return frame, (f"<div class='wb-speed' style='{MUTED}'>step_s, samples_per_s, epoch_s: predicted by "
                           "workbench.plan (on CPU the engine's step of your model measured with each world size's "
                           "ranks stepping at once here; beyond a node, modelled); they move with this machine's "
                           "load</div>")
        if isinstance(found, str):
            return frame, _note(found)
        if self._predicting is None:
            self._predicting = key
            threading.Thread(target=self._predict, args=(cfg, all_sizes, key), name="workbench-plan-speed",
                             daemon=True).start()
        return frame, (f"<div class='wb-speed wb-busy' style='{MUTED}'>speed: predicting at world sizes "
                       f"{', '.join(map(str, all_sizes))} (measuring your model's step on this machine; the table "
                       "stays live meanwhile)</div>")

    def _predict(self, cfg: JobConfig, sizes: list[int], key: str) -> None:
        from workbench.planning.plan import plan

        try:
            planned = plan(cfg, world_sizes=sizes)
            columns = ["world_size", "step_s", "samples_per_s", "epoch_s"]
            found: pd.DataFrame | str = planned[columns].astype({"world_size": int})
            if planned["step_s"].isna().all():
                found = "speed: not predicted (" + "; ".join(
                    n for n in planned.attrs["notes"] if "not measured" in n)[:300] + ")"
        except Exception as exc:  # noqa: BLE001 - the table stays; why there is no speed is one line
            found = f"speed: not predicted ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
        self._speeds[key] = found
        self._predicting = None
        self.update()  # from this thread: ipywidgets sends the new values to the page


def speed_key(cfg: JobConfig, sizes: list[int]) -> str:
    """What a predicted speed depends on: the task, the batch and step settings, the strategy and its
    settings, the world sizes; not lr, its schedule or where the run goes."""
    d = cfg.to_dict()
    train = {k: v for k, v in d["train"].items() if k in ("micro_batch_size", "grad_accum_steps", "optimizer",
                                                           "optimizer_kwargs", "grad_clip_norm", "precision",
                                                           "log_every_steps", "epochs", "max_steps")}
    return json.dumps([d["task"], d["data"], d["dist"], train, sizes], sort_keys=True, default=str)


def _stale(problems: list[str], shown: bool) -> str:
    """Say so when the table is not the form's config (which has problems), and list every problem."""
    if not problems:
        return ""
    what = ("this table shows the last valid config (valid as a whole), not the form's" if shown else
            "no table: the form has never held a valid config")
    items = "".join(f"<li>{html.escape(p)}</li>" for p in problems)
    return (f"<div class='wb-note wb-stale' style='{NOTE_STYLE}'>⚠ {html.escape(what)}; "
            f"{len(problems)} problem(s) in the form:<ul style='margin:2px 0;padding-left:18px'>{items}</ul></div>")


def _caption(cfg: JobConfig, choice: str) -> str:
    rule = {"config": cfg.scaling.rule, "compare": "each"}.get(choice, choice)
    row = (f"world size {cfg.world_size} under its rule ({cfg.scaling.rule})" if choice == "compare"
           else f"world size ({cfg.world_size})")
    text = (f"effective batch = micro_batch_size × grad_accum_steps × world_size; lr = base lr × multiplier "
            f"(rule: {html.escape(rule)}); the highlighted row is the config's own {html.escape(row)}.")
    return f"<div style='{MUTED}'>{text}</div>{reference_html(cfg)}"


def reference_html(cfg: JobConfig) -> str:
    """Which effective batch the lr was tuned at and how the rule scales from it (config.scaling.reference_note)."""
    return f"<div class='wb-reference' style='{MUTED}'>{html.escape(reference_note(cfg))}</div>"


NOTE_STYLE = ("color:var(--jp-ui-font-color1,#222);border-left:3px solid #d9534f;padding:0 6px;white-space:normal;"
              "line-height:1.4")


def _note(text: str) -> str:
    return f"<div class='wb-note' style='{NOTE_STYLE}'>{html.escape(text)}</div>"

