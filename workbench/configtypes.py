"""Small helpers behind the config model: type coercion, field docs, error type, overrides."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
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
        return [p.split(":", 1)[0] for p in self.problems]


def coerce(value: Any, hint: Any) -> tuple[bool, Any, str]:
    """Check `value` against a type hint; returns (ok, converted value, why not)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return True, None, ""
        for arg in (a for a in args if a is not type(None)):
            ok, converted, _ = coerce(value, arg)
            if ok:
                return True, converted, ""
        return False, None, f"expected {_describe(hint)}, got {value!r}"
    if origin is Literal:
        choices = typing.get_args(hint)
        if value in choices:
            return True, value, ""
        return False, None, f"unknown value {value!r}; choose one of {', '.join(map(str, choices))}"
    return _coerce_plain(value, origin or hint)


def _coerce_plain(value: Any, kind: Any) -> tuple[bool, Any, str]:
    if kind is bool:
        return (True, value, "") if isinstance(value, bool) else (False, None, f"expected true or false, got {value!r}")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return True, value, ""
        if isinstance(value, float) and value.is_integer():
            return True, int(value), ""
        return False, None, f"expected a whole number, got {value!r}"
    if kind is float:
        return _coerce_float(value)
    if kind is str:
        return (True, value, "") if isinstance(value, str) else (False, None, f"expected text, got {value!r}")
    if kind is dict:
        if isinstance(value, dict):
            return True, dict(value), ""
        return False, None, f"expected a mapping (key: value), got {value!r}"
    if kind is list:
        if isinstance(value, (list, tuple)):
            return True, list(value), ""
        return False, None, f"expected a list, got {value!r}"
    return True, value, ""


def _coerce_float(value: Any) -> tuple[bool, Any, str]:
    if isinstance(value, bool):
        return False, None, f"expected a number, got {value!r}"
    if isinstance(value, (int, float)):
        return True, float(value), ""
    if isinstance(value, str):  # YAML 1.1 reads "5e-5" (no dot) as text; accept it as a number.
        try:
            return True, float(value), ""
        except ValueError:
            pass
    return False, None, f"expected a number, got {value!r}"


def _describe(hint: Any) -> str:
    names = []
    for arg in typing.get_args(hint):
        names.append("empty (null)" if arg is type(None) else getattr(arg, "__name__", str(arg)))
    return " or ".join(names)


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
            if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
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
