"""What a sweep searches: config fields mapped to a list (a grid) or a distribution, checked against
the config before any trial starts.  Plain Python (no Optuna): the sampler reads these through
`suggest`, the CLI through `parse_assignment`.

Fields are config paths ("train.lr", "dist.procs_per_node", "task.options.hidden") or, for a swept
function (`workbench.sweep(cfg, space, payload=Fn(train))`), "fn.<keyword>", and for a swept script
(`workbench.sweep(cfg, space, payload=Script("train.py"))`), "args.<name>": its option --<name>.  What is
swept (the engine's config, a task factory, a function or a script) decides which fields mean
something: `check_kind` refuses the others before any trial starts."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.config.sections import JobConfig
from workbench.errors import ConfigError

FN_PREFIX = "fn."
"""Fields of a swept function's keyword arguments."""
ARGS_PREFIX = "args."
"""Fields of a swept script's options: args.lr is `--lr VALUE` on its command line."""
OPTIONS_PREFIX = "task.options."
"""Fields of the task factory's options (a built-in task, a named factory or task=)."""
ENGINE_SECTIONS = ("task", "data", "train", "scaling", "log")
"""Config sections only the engine reads: a function or a script gets dist.* and launch.* alone."""
MAX_GRID_POINTS = 10_000
"""A grid larger than this is a typo (a range of floats written as a list), not a plan."""


@dataclass(frozen=True)
class Distribution:
    """A range to sample: kind is "uniform", "loguniform", "int" (int_range) or "choice"."""

    kind: str
    low: float = 0.0
    high: float = 0.0
    step: int = 1
    choices: tuple[Any, ...] = ()

    def __repr__(self) -> str:
        if self.kind == "choice":
            return f"choice{list(self.choices)}"
        if self.kind == "int":
            return f"int_range({int(self.low)}, {int(self.high)}" + (f", step={self.step})" if self.step != 1 else ")")
        return f"{self.kind}({self.low:g}, {self.high:g})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "low": self.low, "high": self.high, "step": self.step, "choices": list(self.choices)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Distribution:
        return cls(str(data["kind"]), float(data.get("low", 0.0)), float(data.get("high", 0.0)),
                   int(data.get("step", 1)), tuple(data.get("choices") or ()))

    def corners(self) -> list[Any]:
        """The values that bound the range (what is checked against the config)."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]


def loguniform(low: float, high: float) -> Distribution:
    """Sample between low and high, evenly in log space (learning rates, weight decay)."""
    return _bounded("loguniform", low, high, positive=True)


def uniform(low: float, high: float) -> Distribution:
    """Sample between low and high, evenly."""
    return _bounded("uniform", low, high)


def int_range(low: int, high: int, step: int = 1) -> Distribution:
    """A whole number from low to high inclusive (every `step`)."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high, step)) or step < 1 or high < low:
        raise ConfigError([f"int_range({low!r}, {high!r}, step={step!r}): give whole numbers low <= high and "
                           "step >= 1, e.g. int_range(1, 4)"])
    return Distribution("int", float(low), float(high), step)


def choice(*values: Any) -> Distribution:
    """One of `values`, searched by the sampler (a plain list is a grid instead)."""
    if len(values) == 1 and isinstance(values[0], (list, tuple)):
        values = tuple(values[0])
    if not values:
        raise ConfigError(["choice(): give at least one value, e.g. choice('adamw', 'sgd')"])
    return Distribution("choice", choices=tuple(values))


def _bounded(kind: str, low: float, high: float, positive: bool = False) -> Distribution:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high))
    if not numbers or not low < high or (positive and low <= 0):
        floor = "0 < " if positive else ""
        raise ConfigError([f"{kind}({low!r}, {high!r}): give numbers with {floor}low < high, e.g. {kind}(1e-4, 1e-2)"])
    return Distribution(kind, float(low), float(high))


# --- the space as a whole ----------------------------------------------------------------------


_FIELD = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+|args\.[A-Za-z_][\w-]*"
"""section.field[.key], or args.NAME where NAME may have dashes as an option does (args.batch-size)."""


def normalised(space: Mapping[str, Any]) -> dict[str, list[Any] | Distribution]:
    """The space with every value a list or a Distribution; one ConfigError line per bad entry."""
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(["space: give a dict of fields to values, e.g. {'train.lr': [1e-3, 3e-3]} or "
                           "{'train.lr': workbench.sweeps.loguniform(1e-4, 1e-2)}"])
    out: dict[str, list[Any] | Distribution] = {}
    problems = []
    for field, values in space.items():
        if not isinstance(field, str) or not re.fullmatch(_FIELD, field):
            problems.append(f"space: {field!r} is not a field; write section.field, e.g. 'train.lr'")
        elif isinstance(values, Distribution):
            out[field] = values
        elif isinstance(values, (list, tuple, range)) and len(values):
            out[field] = list(values)
        else:
            problems.append(f"space[{field!r}]: {values!r} is neither a non-empty list of values nor a distribution; "
                            "write a list ([1e-3, 3e-3]) or workbench.sweeps.loguniform(1e-4, 1e-2)")
    if problems:
        raise ConfigError(problems)
    return out


def is_grid(space: Mapping[str, Any]) -> bool:
    return all(isinstance(v, list) for v in space.values())


def grid_points(space: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of a grid space, the first field varying slowest."""
    size = math.prod(len(v) for v in space.values())
    if size > MAX_GRID_POINTS:
        raise ConfigError([f"space: the grid has {size} points (more than {MAX_GRID_POINTS}); use fewer values or "
                           "a distribution with trials=N"])
    fields = list(space)
    return [dict(zip(fields, combo)) for combo in itertools.product(*(space[f] for f in fields))]


def apply_params(cfg: JobConfig, params: Mapping[str, Any]) -> JobConfig:
    """cfg with the swept config fields set (fn.* and args.* fields are the function's and the
    script's, not the config's); ConfigError naming the field when a value does not fit it."""
    data = cfg.to_dict()
    for field, value in params.items():
        if field.startswith((FN_PREFIX, ARGS_PREFIX)):
            continue
        node = data
        *parents, leaf = field.split(".")
        for part in parents:
            if not isinstance(node, dict):
                break
            node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError([f"space[{field!r}]: {field.rsplit('.', 1)[0]} is not a section; sweep a field "
                               "such as 'train.lr' (workbench config --docs lists them)"])
        node[leaf] = value
    try:
        return JobConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError([f"space: {line} (swept value; fix the space)" for line in exc.problems]) from None


def fn_kwargs(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k[len(FN_PREFIX):]: v for k, v in params.items() if k.startswith(FN_PREFIX)}


HYDRA_OVERRIDE = re.compile(r"^(\+{0,2})([A-Za-z_][\w\-]*(?:[./][\w\-@]+)*)=")
"""A Hydra override on a command line: key=value, +key=value (add), ++key=value (add or override)."""


def script_argv(base: Sequence[str], params: Mapping[str, Any]) -> list[str]:
    """A trial's script arguments: each args.NAME field takes the place of the base arguments' own NAME, in
    the style it is written there (`--NAME V`, `--NAME=V`, or Hydra's `NAME=V`); a NAME the base arguments
    lack follows them as `--NAME=V` (which argparse, click and nanoGPT's configurator all read), or as
    Hydra's `++NAME=V` (add or override) for a Hydra script: one whose base arguments are Hydra overrides
    and no options, or, with no base arguments, a dotted NAME (trainer.lr)."""
    argv = list(base)
    hydra = hydra_style(base)
    for field, value in params.items():
        if field.startswith(ARGS_PREFIX):
            name, text = field[len(ARGS_PREFIX):], arg_text(value)
            if _override_at(argv, name) is not None or hydra or (not base and "." in name):
                argv = _with_override(argv, name, text)
            else:
                argv = _with_option(argv, "--" + name, text)
    return argv


def hydra_style(base: Sequence[str]) -> bool:
    """Whether base arguments are a Hydra app's: overrides (key=value) and no option (-x, --name)."""
    return bool(base) and all(HYDRA_OVERRIDE.match(a) for a in base)


def _override_at(argv: list[str], name: str) -> int | None:
    for i, token in enumerate(argv):
        if token == "--":
            return None
        found = HYDRA_OVERRIDE.match(token)
        if found and found.group(2) == name:
            return i
    return None


def _with_override(argv: list[str], name: str, text: str) -> list[str]:
    at = _override_at(argv, name)
    if at is None:
        end = argv.index("--") if "--" in argv else len(argv)
        return [*argv[:end], f"++{name}={text}", *argv[end:]]
    prefix = HYDRA_OVERRIDE.match(argv[at]).group(1)  # type: ignore[union-attr]  # _override_at matched it
    return [*argv[:at], f"{prefix}{name}={text}", *argv[at + 1:]]


def _with_option(argv: list[str], flag: str, text: str) -> list[str]:
    out: list[str] = []
    i, found = 0, False
    while i < len(argv):
        token = argv[i]
        if token == "--":  # what follows a bare -- is the script's positional text: keep it last
            break
        if token == flag or token.startswith(flag + "="):
            out += [f"{flag}={text}"] if "=" in token else [flag, text]
            has_value = token == flag and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            i, found = i + (2 if has_value else 1), True
            continue
        out.append(token)
        i += 1
    return out + ([] if found else [f"{flag}={text}"]) + argv[i:]


def arg_text(value: Any) -> str:
    """A swept value as the script's command line gets it: 0.001, 16, true, adamw."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def check_space(cfg: JobConfig, space: Mapping[str, list[Any] | Distribution], fn: Any = None, *,
                task: Any = None, script: Any = None) -> None:
    """Every field means something to what is swept (check_kind), and every grid point and every
    distribution's bounds are valid configs whose task options bind (before any trial starts)."""
    check_kind(space, fn=fn, task=task, script=script)
    if fn is not None:
        _check_fn_fields(fn, [f for f in space if f.startswith(FN_PREFIX)])
    lists = {f: v if isinstance(v, list) else v.corners() for f, v in space.items()}
    if is_grid(space):
        grid_points(lists)  # its size
    for field, values in lists.items():  # each value alone: the error names the field that is wrong
        for value in values:
            if field.startswith(ARGS_PREFIX) and not isinstance(value, (str, int, float)):
                raise ConfigError([f"space[{field!r}]: {value!r} is not a command-line value; give text, a "
                                   "number or true/false"])
            apply_params(cfg, {field: value}).check()
    if is_grid(space):
        for point in grid_points(lists):  # combinations (e.g. a world size with a batch)
            apply_params(cfg, point).check()
    _check_task_options(cfg, lists, task)


def check_kind(space: Mapping[str, Any], *, fn: Any = None, task: Any = None, script: Any = None) -> None:
    """One thing is swept (the engine's config, task=, fn= or script=) and each field means something
    to it: fn.* only with fn=, args.* only with script=, and no section a function or script never
    reads (train.lr would run the same trial twice).  One ConfigError line per field that does not."""
    given = [name for name, value in (("task", task), ("fn", fn), ("script", script)) if value is not None]
    if len(given) > 1:
        raise ConfigError([f"sweep: {' and '.join(g + '=' for g in given)} given; sweep one thing: a task factory "
                           "(payload=factory), a function (payload=Fn(fn, ...)) or a script "
                           "(payload=Script(path, ...))"])
    kind = given[0] if given else "config"
    problems = [p for p in (_kind_problem(f, kind) for f in space) if p]
    if problems:
        raise ConfigError(problems)


def _kind_problem(field: str, kind: str) -> str | None:
    section, _, rest = field.partition(".")
    name = rest.rsplit(".", 1)[-1]
    if section == "fn" and kind != "fn":
        return f"space[{field!r}]: fn.* fields are a swept function's arguments; " + (
            f"this sweep runs a script: sweep 'args.{name}' (--{name}) instead" if kind == "script" else
            "pass payload=workbench.sweeps.Fn(fn) to workbench.sweep, or sweep a config field")
    if section == "args" and kind != "script":
        return f"space[{field!r}]: args.* fields are a swept script's options (--{name}); " + (
            f"this sweep runs a function: sweep 'fn.{name}' instead" if kind == "fn" else
            "pass payload=workbench.sweeps.Script('train.py') to workbench.sweep (workbench sweep --script train.py), "
            "or sweep a config field")
    if kind in ("fn", "script") and section in ENGINE_SECTIONS:
        own = f"'fn.{name}'" if kind == "fn" else f"'args.{name}' (--{name})"
        return (f"space[{field!r}]: a {'function' if kind == 'fn' else 'script'} does not read the {section} section "
                f"(only dist.* and launch.* reach it); sweep its own argument instead, e.g. {own}")
    return None


def _check_task_options(cfg: JobConfig, lists: Mapping[str, list[Any]], task: Any) -> None:
    """Every combination of the swept task.options binds to the factory (task=, or the task that
    task.name names: a built-in's options are known, a named factory's module is imported)."""
    from workbench.engine.tasks import named_task_problem, options_problem

    swept = {f: v for f, v in lists.items() if f.startswith(OPTIONS_PREFIX)}
    for point in grid_points(swept) if swept else [{}]:
        options = apply_params(cfg, point).task.options
        problem = options_problem(task, options) if task is not None else named_task_problem(cfg.task.name, options)
        if problem:
            raise ConfigError([f"space: {problem} (swept value; fix the space)"])


def factory_config(cfg: JobConfig, task: Any) -> JobConfig:
    """The base config of a task factory sweep (task=): named after the factory, its task.options
    those of the config, except that options written for the built-in task the config names are
    that task's, not the factory's (as submit(cfg, task=) binds them: engine.tasks.factory_options).
    The swept task.options.* go on top, trial by trial; check_space binds each combination."""
    from workbench.engine.tasks import BUILTIN_OPTIONS, factory_label, options_problem

    options = dict(cfg.task.options)
    unbound = options_problem(task, options)
    if unbound and set(options) <= set(BUILTIN_OPTIONS.get(cfg.task.name, ())):
        options = {}
    return cfg.replace(task__name=factory_label(task), task__options=options)


def _check_fn_fields(fn: Any, fields: list[str]) -> None:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for field in fields:
        if not takes_any and field[len(FN_PREFIX):] not in params:
            raise ConfigError([f"space[{field!r}]: {getattr(fn, '__name__', 'fn')} takes no argument "
                               f"{field[len(FN_PREFIX):]!r}; its arguments are {', '.join(params) or 'none'}"])


# --- the command line: --grid FIELD=V1,V2 and --search FIELD=loguniform(A,B) -----------------------

_DIST = re.compile(r"^(loguniform|uniform|int_range|choice)\((.*)\)$")


def parse_assignment(text: str, flag: str = "--grid") -> tuple[str, list[Any] | Distribution]:
    """"train.lr=1e-3,3e-3" -> ("train.lr", [0.001, 0.003]); "train.lr=loguniform(1e-4,1e-2)" ->
    a Distribution.  Each value is read as YAML (numbers, true/false, text)."""
    from workbench.config.types import yaml_load
    from workbench.config.yamlfile import YamlProblem

    field, sep, raw = text.partition("=")
    field, raw = field.strip(), raw.strip()
    if not sep or not field or not raw:
        raise ConfigError([f"{flag} {text!r}: write FIELD=VALUE,VALUE,..., e.g. {flag} train.lr=1e-3,3e-3"])
    found = _DIST.match(raw)
    try:
        if found:
            args = [yaml_load(a.strip()) for a in found.group(2).split(",") if a.strip()]
            maker: dict[str, Callable[..., Distribution]] = {"loguniform": loguniform, "uniform": uniform,
                                                             "int_range": int_range, "choice": choice}
            return field, maker[found.group(1)](*args)
        return field, [yaml_load(v.strip()) for v in raw.split(",")]
    except YamlProblem as exc:
        raise ConfigError([f"{flag} {text!r}: a value is not valid YAML ({exc})"]) from None
    except TypeError:
        raise ConfigError([f"{flag} {text!r}: {found.group(1) if found else 'the range'} takes two numbers, "
                           "e.g. loguniform(1e-4,1e-2)"]) from None


def parse_assignments(grid: Sequence[str], search: Sequence[str] = ()) -> dict[str, list[Any] | Distribution]:
    space: dict[str, list[Any] | Distribution] = {}
    for text, flag in [*((t, "--grid") for t in grid), *((t, "--search") for t in search)]:
        field, values = parse_assignment(text, flag)
        if field in space:
            raise ConfigError([f"{flag} {text!r}: {field} is swept twice; give its values once"])
        space[field] = values
    return space


def space_to_json(space: Mapping[str, list[Any] | Distribution]) -> dict[str, Any]:
    return {f: (v.to_dict() if isinstance(v, Distribution) else {"grid": list(v)}) for f, v in space.items()}


def space_from_json(data: Mapping[str, Any]) -> dict[str, list[Any] | Distribution]:
    return {f: (list(v["grid"]) if "grid" in v else Distribution.from_dict(v)) for f, v in data.items()}
