"""ConfigForm: every JobConfig field as a widget, grouped by section, validated as a whole when a
field is committed (Enter, Tab or a click elsewhere), never on a keystroke on the way.

A numeric field given several values ("1e-3, 3e-3" or "loguniform(1e-4, 1e-2)", as the CLI's --grid
and --search write them), or a choice field switched to several values, makes the form a sweep:
`.space` holds the swept fields, `.config` is the first point (workbench.ui.sweepform)."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as w

from workbench.config.scaling import reference_batch
from workbench.config.sections import JobConfig
from workbench.errors import ConfigError
from workbench.ui import sweepform
from workbench.ui.fields import (
    FieldSpec,
    config_fields,
    from_widget,
    get_path,
    problem_field,
    sections,
    set_path,
    to_widget,
)

INVALID_BORDER = "2px solid #d9534f"
MARK = "✘"
"""The invalid mark: a symbol every font here has (the ❌ emoji drew as an empty box in headless Chromium)."""
MARK_STYLE = "color:#d32f2f;font-weight:bold"
ERROR_STYLE = ("color:var(--jp-ui-font-color1,#222);border-left:3px solid #d9534f;padding:0 6px;"
               "font-size:90%;white-space:normal;line-height:1.4")
"""Problem text in the theme's own font colour (readable light or dark), marked red at its edge."""
_DESCRIPTION = {"description_width": "190px"}


def make_widget(spec: FieldSpec, value: Any) -> w.ValueWidget:
    """The widget for one field, showing `value`; the field's doc is its tooltip."""
    common = dict(description=spec.name, tooltip=spec.doc, style=_DESCRIPTION, layout=w.Layout(width="440px"))
    if spec.kind == "choice":
        options = ([""] if spec.optional else []) + list(spec.choices)  # "" stands for None
        return w.Dropdown(options=options, value=to_widget(spec, value), **common)
    if spec.kind == "bool":
        return w.Checkbox(value=value, indent=True, **common)
    placeholder = "empty = none" if spec.optional else ""
    # continuous_update=False: the value reaches the kernel when the field is committed (Enter, or the
    # focus leaves it), so typing "2.5" over 32 never validates the "2" on the way as a config.
    return w.Text(value=to_widget(spec, value), placeholder=placeholder, continuous_update=False, **common)


class FieldRow:
    """One field: its widget, a ✘ mark, the doc in small muted text, and the problem written under it.
    A choice field that can be swept has a "several" toggle: on, a text of its values replaces the
    dropdown ("adamw, sgd")."""

    def __init__(self, spec: FieldSpec, value: Any):
        self.spec = spec
        self.widget = make_widget(spec, value)
        self.mark = w.HTML(layout=w.Layout(width="24px"))
        doc = w.HTML(f'<span style="color:var(--jp-ui-font-color2,#666);font-size:85%">{html.escape(spec.doc)}'
                     "</span>", layout=w.Layout(flex="1 1 200px", width="auto", min_width="200px"))
        self.error = w.HTML(layout=w.Layout(display="none", margin="0 0 4px 194px"))
        self.several: w.ToggleButton | None = None
        self.values: w.Text | None = None
        own = [self.widget]
        if spec.kind == "choice" and sweepform.sweepable(spec):
            self._add_several(spec)
            own = [self.widget, self.values, self.several]
        line = w.HBox([*own, self.mark, doc], layout=w.Layout(flex_flow="row wrap"))
        self.box = w.VBox([line, self.error])

    def _add_several(self, spec: FieldSpec) -> None:
        self.values = w.Text(description=spec.name, tooltip=spec.doc, continuous_update=False,
                             placeholder=", ".join(map(str, spec.choices)), style=_DESCRIPTION,
                             layout=w.Layout(width="408px", display="none"))
        self.several = w.ToggleButton(value=False, icon="list", tooltip=f"sweep several values of {spec.path}",
                                      layout=w.Layout(width="34px", padding="0"))  # the icon alone
        self.several.observe(self._on_several, names="value")

    def _on_several(self, change: Any) -> None:
        on = bool(change["new"])
        if on and self.values is not None and not self.values.value.strip():
            self.values.value = str(self.widget.value)  # start from the value the dropdown shows
        one = {str(c): c for c in self.spec.choices}.get(self.values.value.strip()) if self.values else None
        if not on and one is not None:
            self.widget.value = one  # the one value typed stays the field's value
        self.widget.layout.display = "none" if on else ""
        if self.values is not None:
            self.values.layout.display = "" if on else "none"

    def raw(self) -> Any:
        """What the user gave: the widget's value, or the text of several values."""
        if self.several is not None and self.several.value and self.values is not None:
            return self.values.value
        return self.widget.value

    def set(self, value: Any) -> None:
        if self.several is not None:
            self.several.value = False
        self.widget.value = to_widget(self.spec, value)

    def show(self, problems: list[str]) -> None:
        """Mark the widget invalid (red border, ✘) and write the problems under it, or clear them."""
        self.widget.layout.border = INVALID_BORDER if problems else ""
        title = html.escape("\n".join(problems), quote=True)
        self.mark.value = f'<span title="{title}" style="{MARK_STYLE}">{MARK}</span>' if problems else ""
        self.error.value = "".join(f'<div class="wb-field-error" style="{ERROR_STYLE}">{html.escape(p)}</div>'
                                   for p in problems)
        self.error.layout.display = "" if problems else "none"


BATCH_FIELDS = ("train.micro_batch_size", "train.grad_accum_steps")
"""Fields that change the effective batch at a fixed world size (the lr's reference stays; see _keep_reference)."""


class ConfigForm:
    """An editable JobConfig.  `.config` is the current config (or raises ConfigError)."""

    def __init__(self, cfg: JobConfig | None = None):
        cfg = cfg or JobConfig()
        self.specs = config_fields()
        self.rows = {spec.path: FieldRow(spec, get_path(cfg, spec.path)) for spec in self.specs}
        self.last_valid: JobConfig | None = None
        self._problems: list[str] = []
        self._space: dict[str, sweepform.Values] = {}
        self.sweep_target: dict[str, Any] = {}
        """What a sweep of this form runs, {"fn": train} or {"task": factory} (Workbench sets it): its
        swept values are checked against it."""
        self._callbacks: list[Callable[[JobConfig], None]] = []
        self._checked: list[Callable[[list[str]], None]] = []
        self._holding = False
        self._build_widgets()
        for row in self.rows.values():
            for widget in (row.widget, row.values, row.several):
                if widget is not None:
                    widget.observe(self._on_change, names="value")
        self._update()

    # --- widgets ---------------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        groups = sections(self.specs)
        self.section_names = list(groups)
        boxes = [w.VBox([self.rows[s.path].box for s in specs]) for specs in groups.values()]
        self.accordion = w.Accordion(children=boxes, titles=tuple(self.section_names), selected_index=None)
        self.problems_html = w.HTML()
        self.path_text = w.Text(value="config.yaml", description="YAML file", layout=w.Layout(width="360px"))
        self.load_button = w.Button(description="Load", icon="folder-open", tooltip="Load the YAML file into the form")
        self.save_button = w.Button(description="Save", icon="save", tooltip="Save the form's config as YAML")
        self.file_status = w.HTML()
        self.load_button.on_click(lambda _: self._file_action(self.load_yaml, "loaded"))
        self.save_button.on_click(lambda _: self._file_action(self.save_yaml, "saved to"))
        files = w.HBox([self.path_text, self.load_button, self.save_button, self.file_status])
        self.widget = w.VBox([files, self.accordion, self.problems_html])

    def widget_for(self, path: str) -> w.ValueWidget:
        """The widget editing field `path`, e.g. "train.lr"."""
        return self.rows[path].widget

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # --- config ----------------------------------------------------------------------------------
    @property
    def config(self) -> JobConfig:
        """The config the form shows; raises ConfigError listing every problem."""
        cfg, problems = self._validate()
        if problems:
            raise ConfigError(problems)
        return cfg  # type: ignore[return-value]

    @property
    def space(self) -> dict[str, sweepform.Values]:
        """The fields given several values ({} for one config): a list (a grid) or a range, as
        workbench.sweep takes them.  `.config` is then the first point."""
        return dict(self._space)

    @property
    def problems(self) -> list[str]:
        """The form's problems, with the messages of JobConfig validation (empty when valid)."""
        return list(self._problems)

    def set_config(self, cfg: JobConfig) -> None:
        """Show `cfg` in every widget (one validation at the end)."""
        self._holding = True
        try:
            for path, row in self.rows.items():
                row.set(get_path(cfg, path))
        finally:
            self._holding = False
        self._update()

    def observe(self, callback: Callable[[JobConfig], None]) -> None:
        """Call `callback(cfg)` whenever the form holds a new valid config."""
        self._callbacks.append(callback)

    def observe_problems(self, callback: Callable[[list[str]], None]) -> None:
        """Call `callback(problems)` after every check of the form (an empty list: valid)."""
        self._checked.append(callback)

    def load_yaml(self, path: str | Path) -> JobConfig:
        cfg = JobConfig.from_yaml(Path(path))
        self.set_config(cfg)
        return cfg

    def save_yaml(self, path: str | Path) -> Path:
        cfg = self.config
        if self._space:
            raise ConfigError([f"{next(iter(self._space))}: holds several values (a sweep) and a YAML file "
                               "holds one config; give one value to save, or run the sweep from a terminal "
                               "with workbench sweep CONFIG.yaml --grid FIELD=V1,V2"])
        cfg.to_yaml(Path(path))
        return Path(path)

    # --- validation ------------------------------------------------------------------------------
    def _collect(self) -> tuple[dict[str, Any], dict[str, sweepform.Values], list[str]]:
        """The single values as plain data, the swept fields' values (left out of the data), problems."""
        data: dict[str, Any] = {}
        space: dict[str, sweepform.Values] = {}
        problems: list[str] = []
        for path, row in self.rows.items():
            raw = row.raw()
            if sweepform.several(row.spec, raw):
                values, found = sweepform.swept_values(row.spec, raw)
                problems += found
                if values is not None:
                    space[path] = values
                continue
            value, problem = from_widget(row.spec, raw)
            if problem:
                problems.append(problem)
            else:
                set_path(data, path, value)
        return data, space, problems

    def _validate(self) -> tuple[JobConfig | None, list[str]]:
        """The config (the first point of a sweep) and every problem: the single values' as
        JobConfig says them, then each swept value checked like a single value."""
        data, self._space, problems = self._collect()
        cfg: JobConfig | None
        try:
            cfg = JobConfig.from_dict(data)  # swept fields at their defaults: the base every value is tried on
        except ConfigError as exc:
            return None, problems + exc.problems
        if problems:
            return None, problems
        found = cfg.problems()
        if not found and self._space:
            found = sweepform.check_values(cfg, self._space, self.sweep_target)
            cfg, found = (None, found) if found else sweepform.first_config(cfg, self._space)
        return (None if found else cfg), found

    def _on_change(self, change: Any) -> None:
        if self._holding:
            return
        if any(change.owner is self.rows[path].widget for path in BATCH_FIELDS):
            self._keep_reference()
        self._update()

    def _keep_reference(self) -> None:
        """The per-rank batch or the accumulation changed: lr moves by the rule, from the effective batch the
        config's lr was tuned at (without lr_ref_batch that reference moved with the batch, and the lr with it
        stayed put).  The reference is written into train.lr_ref_batch, where the user sees and can change it."""
        row = self.rows.get("train.lr_ref_batch")
        if row is None or self.last_valid is None or self.last_valid.train.lr_ref_batch or str(row.raw()).strip():
            return
        self._holding = True
        try:
            row.set(reference_batch(self.last_valid.train))
        finally:
            self._holding = False

    def _update(self) -> None:
        cfg, self._problems = self._validate()
        self.show_problems(self._problems)
        if cfg is not None and cfg != self.last_valid:
            self.last_valid = cfg
            for callback in list(self._callbacks):
                callback(cfg)
        for checked in list(self._checked):
            checked(self.problems)

    def show_problems(self, problems: list[str], title: str = "") -> None:
        """List `problems` under the form and mark the fields they name."""
        by_field: dict[str, list[str]] = {}
        for problem in problems:
            by_field.setdefault(problem_field(problem), []).append(problem)
        for path, row in self.rows.items():
            row.show(by_field.get(path, []))
        self._mark_sections(by_field)
        self.problems_html.value = problems_html(problems, title)

    def _mark_sections(self, by_field: dict[str, list[str]]) -> None:
        counts = {name: 0 for name in self.section_names}
        for path, found in by_field.items():
            section = self.rows[path].spec.section if path in self.rows else None
            if section in counts:
                counts[section] += len(found)
        titles = tuple(f"{name}  {MARK} {counts[name]}" if counts[name] else name for name in self.section_names)
        if titles != tuple(self.accordion.titles):
            self.accordion.titles = titles

    def _file_action(self, action: Callable[[str], Any], verb: str) -> None:
        path = self.path_text.value.strip()
        try:
            action(path)
        except ConfigError as exc:
            self.show_problems(exc.problems, f"cannot use {path}:")
            self.file_status.value = _status(f"{path}: config has problems (listed below)", ok=False)
        except OSError as exc:
            self.file_status.value = _status(f"{path}: {exc.strerror or exc}", ok=False)
        else:
            self.file_status.value = _status(f"{verb} {path}", ok=True)


def problems_html(problems: list[str], title: str = "") -> str:
    if not problems:
        return _status("the config is valid", ok=True)
    items = "".join(f"<li>{html.escape(p)}</li>" for p in problems)
    head = html.escape(title or f"{len(problems)} problem(s) in the job config:")
    return (f'<div class="wb-problems" style="color:var(--jp-ui-font-color1,#222);border:1px solid #d9534f;'
            f'border-left-width:4px;padding:4px 8px;line-height:1.4">'
            f"<b>{head}</b><ul style='margin:2px 0'>{items}</ul></div>")


def _status(text: str, ok: bool) -> str:
    """A status message in the theme's font colour (readable light and dark), a coloured mark before it."""
    mark = '<b style="color:#2e7d32">✓</b>' if ok else '<b style="color:#d32f2f">✘</b>'
    return f'<span style="color:var(--jp-ui-font-color1,#222)">{mark} {html.escape(text)}</span>'
