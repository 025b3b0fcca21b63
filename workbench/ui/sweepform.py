"""The form as a sweep, in plain Python (no widgets): a field's text holding several values, what the
sweep's space is, every value checked like a single value, and the trials/parallel/metric options.

A field is swept when its text is written as the CLI's --grid and --search write a field's values
(workbench.sweeps.space.parse_assignment reads both):

    train.lr          1e-3, 3e-3, 1e-2             a grid: every value, every combination
    train.lr          loguniform(1e-4, 1e-2)       a range, sampled (uniform, int_range, choice too)
    train.optimizer   adamw, sgd                   a choice field, its values written out
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.config.sections import JobConfig
from workbench.errors import ConfigError
from workbench.sweeps import space as sp
from workbench.ui.fields import FieldSpec, parse_int

Values = list[Any] | sp.Distribution

NOT_SWEPT = frozenset({"launch.executor"})
"""Fields a sweep cannot vary: every trial of a sweep runs on one executor (the executor toggle)."""
_SEVERAL = re.compile(r",|^\s*[a-z_]+\s*\(")
"""Text that holds several values: a comma, or a range such as loguniform(1e-4, 1e-2)."""
SWEPT_SUFFIX = " (swept value; fix the space)"


def sweepable(spec: FieldSpec) -> bool:
    """A numeric or choice field (an Optional[int] or Optional[float] too) may hold several values."""
    return (spec.kind in ("int", "float", "choice") or (spec.kind == "yaml" and bool(spec.number))) \
        and spec.path not in NOT_SWEPT


def several(spec: FieldSpec, raw: Any) -> bool:
    """Whether the field's text is a sweep (several values or a range) rather than one value."""
    return sweepable(spec) and isinstance(raw, str) and bool(_SEVERAL.search(raw))


def swept_values(spec: FieldSpec, raw: str) -> tuple[Values | None, list[str]]:
    """The field's values (a list or a Distribution) read as the CLI's --grid/--search reads them, or
    None and the problems, each naming the field."""
    text = raw.strip()
    if any(not part.strip() for part in text.split(",")) and not text.endswith(")"):
        return None, [f"{spec.path}: {text!r} has an empty value between commas; write the values apart, "
                      "e.g. 1e-3, 3e-3"]
    try:
        _field, values = sp.parse_assignment(f"{spec.path}={text}", flag=spec.path)
    except ConfigError as exc:
        return None, [field_line(spec.path, line, f"{spec.path} {spec.path + '=' + text!r}: ") for line in exc.problems]
    if isinstance(values, sp.Distribution) and spec.number == "int" and values.kind in ("uniform", "loguniform"):
        return None, [f"{spec.path}: takes whole numbers; write int_range({values.low:g}, {values.high:g}) "
                      f"instead of {values!r}"]
    if isinstance(values, list):
        seen = [v for i, v in enumerate(values) if v in values[:i]]
        if seen:
            return None, [f"{spec.path}: {seen[0]!r} is given twice; give each value once"]
    return values, []


def field_line(path: str, line: str, prefix: str = "") -> str:
    """A sweeps.space line as the form's: it starts with the field it is about (so it is written under
    that field), or with "sweep:" when it is about the sweep as a whole."""
    if prefix and line.startswith(prefix):
        line = line[len(prefix):]
    line = re.sub(r"^space\[(['\"])(.+?)\1\]: ", r"\2: ", line)  # space['train.lr']: -> train.lr:
    if line.startswith("space: "):
        line = line[len("space: "):]
    if line.endswith(SWEPT_SUFFIX):
        line = line[: -len(SWEPT_SUFFIX)] + " (one of the swept values)"
    if path and not line.startswith(f"{path}:"):
        return f"{path}: {line}"
    return line if re.match(r"[\w.]+: ", line) else f"sweep: {line}"


def first_value(values: Values) -> Any:
    """The value the form's single config (and its scaling table) takes: the first point."""
    return values[0] if isinstance(values, list) else values.corners()[0]


def first_config(base: JobConfig, space: Mapping[str, Values]) -> tuple[JobConfig | None, list[str]]:
    """The first point's config (the one the scaling table shows), or None and its problems."""
    try:
        cfg = sp.apply_params(base, {f: first_value(v) for f, v in space.items()})
    except ConfigError as exc:
        return None, [field_line("", line) for line in exc.problems]
    found = cfg.problems()
    return (None if found else cfg), found


def check_values(base: JobConfig, space: Mapping[str, Values], target: Mapping[str, Any] | None = None) -> list[str]:
    """Every swept value checked like a single value on `base` (one line per bad value, naming its
    field), then a grid's combinations; [] when every trial's config is valid.  `target`: what the
    sweep runs, {"fn": train} or {"task": factory} (a function reads no train.* field)."""
    problems: list[str] = []
    for path, values in space.items():
        for value in values if isinstance(values, list) else values.corners():
            problems += _space_problems(base, {path: [value]}, target or {})
    if not problems:
        problems = _space_problems(base, dict(space), target or {})
    return list(dict.fromkeys(problems))  # a field a function never reads: one line, not one per value


def _space_problems(base: JobConfig, space: dict[str, Values], target: Mapping[str, Any]) -> list[str]:
    try:
        sp.check_space(base, space, target.get("fn"), task=target.get("task"))
    except ConfigError as exc:
        return [field_line("", line) for line in exc.problems]
    return []


def grid_size(space: Mapping[str, Values]) -> int | None:
    """How many trials a grid has (None when a field is a range: the sampler needs trials=N)."""
    if not sp.is_grid(space):
        return None
    return math.prod(len(v) for v in space.values() if isinstance(v, list))


def summary(space: Mapping[str, Values], trials: int | None) -> str:
    """"sweep: 3 x 2 = 6 trials (train.lr, dist.procs_per_node)" for a grid; a range says how many
    trials are sampled; "" for no sweep."""
    if not space:
        return ""
    fields = ", ".join(space)
    size = grid_size(space)
    if size is not None:
        sizes = [str(len(v)) for v in space.values()]  # type: ignore[arg-type]
        product = f"{' x '.join(sizes)} = {size}" if len(sizes) > 1 else str(size)
        shown = f"{trials} of {size}" if trials and trials < size else product
        return f"sweep: {shown} trials ({fields})"
    ranges = "; ".join(f"{f} {v!r}" if isinstance(v, sp.Distribution) else f"{f}: {len(v)} values"
                       for f, v in space.items())
    count = f"{trials} trials sampled" if trials else "a range; give how many trials to sample"
    return f"sweep: {count} ({ranges})"


def first_point(space: Mapping[str, Values]) -> str:
    return ", ".join(f"{f}={first_value(v)!r}" for f, v in space.items())


@dataclass(frozen=True)
class SweepOptions:
    """What the form's sweep controls hold, read strictly."""

    trials: int | None
    parallel: int
    metric: str


def read_options(space: Mapping[str, Values], trials: str, parallel: str, metric: str) -> tuple[
        SweepOptions | None, list[str]]:
    """The controls' text as options for workbench.sweep, or None and one line per problem (each
    naming its control and the fix)."""
    problems: list[str] = []
    count = _whole("trials", trials, empty=None, problems=problems)
    at_once = _whole("parallel", parallel, empty=1, problems=problems)
    size = grid_size(space)
    if count is None and size is None and not problems:
        problems.append("trials: a range is sampled; give how many trials to run, e.g. 8")
    if count is not None and size is not None and count > size:
        problems.append(f"trials: the grid has {size} points; give at most {size}, or leave it empty for all")
    if not metric.strip():
        problems.append("metric: give the metric to optimise and prune on, e.g. val_loss or loss")
    if problems:
        return None, problems
    return SweepOptions(count, at_once or 1, metric.strip()), []


def _whole(name: str, text: str, empty: int | None, problems: list[str]) -> int | None:
    text = text.strip()
    if not text:
        return empty
    value, problem = parse_int(FieldSpec(name, "", "int", False), text)
    if problem or value < 1:
        problems.append(f"{name}: expected a whole number >= 1 (e.g. 2), got {text!r}")
        return None
    return value


def button_label(space: Mapping[str, Values], options: SweepOptions | None) -> str:
    """The Submit button's text: "Submit" for one config, "Sweep 6 trials" for a sweep."""
    if not space:
        return "Submit"
    count = (options.trials if options is not None else None) or grid_size(space)
    return f"Sweep {count} trials" if count else "Sweep"
