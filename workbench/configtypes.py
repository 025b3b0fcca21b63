"""Small helpers behind the config model: type coercion, field docs, error type, overrides."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import inspect
import math
import textwrap
import types
import typing
from typing import Any, Literal, Union


class ConfigError(ValueError):
    """A config with one or more problems; `problems` lists each, naming the field and the fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the job config:\n{lines}")

    def fields(self) -> list[str]:
        """The field paths named by the problems (the text before the first colon)."""
        return problem_fields(self.problems)


def problem_fields(problems: list[str]) -> list[str]:
    """The field path each "section.field: what; fix" message names."""
    return [p.split(":", 1)[0] for p in problems]


def coerce(value: Any, hint: Any) -> tuple[bool, Any, str]:
    """Check `value` against a type hint; returns (ok, converted value, "what is wrong; the fix")."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, typing.get_args(hint))
    if origin is Literal:
        choices = typing.get_args(hint)
        if value in choices:
            return True, value, ""
        return False, None, f"unknown value {value!r}; choose one of {', '.join(map(str, choices))}"
    return _coerce_plain(value, origin or hint)


def _coerce_union(value: Any, args: tuple[Any, ...]) -> tuple[bool, Any, str]:
    if value is None and type(None) in args:
        return True, None, ""
    kinds = [a for a in args if a is not type(None)]
    reasons = []
    for arg in kinds:
        ok, converted, why = coerce(value, arg)
        if ok:
            return True, converted, ""
        reasons.append(why)
    if len(kinds) == 1:  # Optional[X]: X's own reason, plus the way out
        return False, None, f"{reasons[0]}, or leave it empty"
    return False, None, f"expected {_describe(args)}, got {value!r}; write one of those"


def _coerce_plain(value: Any, kind: Any) -> tuple[bool, Any, str]:
    if kind is bool:
        if isinstance(value, bool):
            return True, value, ""
        return False, None, f"expected true or false, got {value!r}; write true or false without quotes"
    if kind is int:
        return _coerce_int(value)
    if kind is float:
        return _coerce_float(value)
    if kind is str:
        if isinstance(value, str):
            return True, value, ""
        return False, None, f"expected text, got {value!r}; put it in quotes"
    if kind is dict:
        if isinstance(value, dict):
            return True, dict(value), ""
        return False, None, f"expected a mapping, got {value!r}; write e.g. {{key: value}}, or {{}} for none"
    if kind is list:
        if isinstance(value, (list, tuple)):
            return True, list(value), ""
        return False, None, f"expected a list, got {value!r}; write e.g. [a, b], or [] for none"
    return True, value, ""


def _coerce_int(value: Any) -> tuple[bool, Any, str]:
    if isinstance(value, int) and not isinstance(value, bool):
        return True, value, ""
    if isinstance(value, float) and value.is_integer():
        return True, int(value), ""
    return False, None, f"expected a whole number, got {value!r}; write it in digits without a fraction, e.g. 2"


def _coerce_float(value: Any) -> tuple[bool, Any, str]:
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):  # YAML 1.1 reads "5e-5" (no dot) as text; accept it as a number.
        with contextlib.suppress(ValueError):
            number = float(value)
    if number is None:
        return False, None, f"expected a number, got {value!r}; write it in digits, e.g. 0.001 or 3e-4"
    if not math.isfinite(number):  # YAML's .inf and .nan, or "inf"/"nan"/"1e999" as text
        return False, None, f"must be a finite number, got {value!r}; inf and nan are not allowed, write digits"
    return True, number, ""


_KIND_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "text",
               dict: "a mapping", list: "a list", type(None): "empty (null)"}


def _describe(args: tuple[Any, ...]) -> str:
    return " or ".join(_KIND_NAMES.get(arg, getattr(arg, "__name__", str(arg))) for arg in args)


def unknown_key_message(path: str, key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
    return f"{path}: unknown key; {hint}"


def field_docs(cls: type, prefix: str = "") -> dict[str, str]:
    """Map "section.field" -> the docstring written under the field in the class body."""
    docs: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    own = _attribute_docstrings(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        docs[path] = own.get(f.name, "")
        if dataclasses.is_dataclass(hints[f.name]):
            docs.update(field_docs(hints[f.name], f"{path}."))
    return docs


def _attribute_docstrings(cls: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                found[node.target.id] = " ".join(str(nxt.value.value).split())
    return found


def yaml_load(text: str) -> Any:
    """yaml.safe_load, except that 1:30:00 stays text (not base-60) and 5e-5 is a number."""
    import yaml

    return yaml.load(text, Loader=_config_loader())  # noqa: S506 - a SafeLoader subclass


def _config_loader() -> type:
    import re

    import yaml

    class ConfigLoader(yaml.SafeLoader):
        pass

    int_tag, float_tag = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
    ConfigLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (int_tag, float_tag)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    ConfigLoader.add_implicit_resolver(int_tag, re.compile(
        r"^(?:[-+]?0b[0-1_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$"), list("-+0123456789"))
    ConfigLoader.add_implicit_resolver(float_tag, re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))
    return ConfigLoader


def apply_overrides(data: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply "a.b.c=value" assignments to nested dict `data` (values parsed as YAML)."""
    import yaml

    problems = []
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"--set {item!r}: write section.field=value, e.g. train.lr=3e-4")
            continue
        node = data
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            problems.append(f"--set {item!r}: {key.strip().rsplit('.', 1)[0]} is not a section")
            continue
        try:
            node[leaf] = yaml_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            problems.append(f"--set {item!r}: the value is not valid YAML ({exc.__class__.__name__})")
    if problems:
        raise ConfigError(problems)
    return data
