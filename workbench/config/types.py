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

from workbench.errors import ConfigError, problem_fields  # noqa: F401 (problem_fields: re-export)


def coerce(value: Any, hint: Any) -> tuple[bool, Any, str]:
    """Check `value` against a type hint; returns (ok, converted value, "what is wrong; the fix")."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, typing.get_args(hint))
    if origin is Literal:
        choices = typing.get_args(hint)
        if value in choices:
            return True, value, ""
        return False, None, f"unknown value {_short(value)}; choose one of {', '.join(map(str, choices))}"
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
    return False, None, f"expected {_describe(args)}, got {_short(value)}; write one of those"


def _coerce_plain(value: Any, kind: Any) -> tuple[bool, Any, str]:
    if kind is bool:
        if isinstance(value, bool):
            return True, value, ""
        return False, None, f"expected true or false, got {_short(value)}; write true or false without quotes"
    if kind is int:
        return _coerce_int(value)
    if kind is float:
        return _coerce_float(value)
    if kind is str:
        if isinstance(value, str):
            return (True, value, "") if _is_text(value) else (False, None, _BAD_TEXT)
        return False, None, f"expected text, got {_short(value)}; put it in quotes"
    if kind is dict:
        if isinstance(value, dict):
            why = plain_data_problem(value if type(value) is dict else dict(value))
            return (True, dict(value), "") if not why else (False, None, why)
        return False, None, f"expected a mapping, got {_short(value)}; write e.g. {{key: value}}, or {{}} for none"
    if kind is list:
        if isinstance(value, (list, tuple)):
            why = plain_data_problem(value if type(value) in (list, tuple) else list(value))
            return (True, list(value), "") if not why else (False, None, why)
        return False, None, f"expected a list, got {_short(value)}; write e.g. [a, b], or [] for none"
    return True, value, ""


_BAD_TEXT = "text with a character that is not valid Unicode (a lone surrogate); write plain text"
_PLAIN_LEAVES = (type(None), bool, int, float, str)


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(name: Any) -> str:
    """A key or file name as a message shows it: as written when it is plain printable text, else
    quoted and escaped (a newline or an escape sequence must not break the one line)."""
    text = str(name)
    return text if text.isprintable() and 0 < len(text) <= 200 else _short(text)


def _short(value: Any) -> str:
    """A bounded repr for messages (a value may be a megabyte of text or a million-element list)."""
    import reprlib

    return reprlib.repr(value)


def plain_data_problem(value: Any) -> str | None:
    """Why `value` (an option mapping or list) is not plain data a config can hold, or None: text
    keys, leaves None/bool/number/text, at most configyaml.MAX_VALUES values (shared parts counted
    each time they appear) nested at most configyaml.MAX_DEPTH deep, no container inside itself."""
    from workbench.config.yamlfile import MAX_DEPTH, MAX_VALUES

    count = 0
    inside: set[int] = set()  # ids of the containers on the path to the current item
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, where = stack.pop()
        if item is _LEAVE:
            inside.discard(depth)  # for the marker, `depth` holds the id of the container left
            continue
        count += 1
        at = f" at {where[:80]}" if where else ""
        if count > MAX_VALUES:
            return f"holds more than {MAX_VALUES} values; keep large data in files your task factory reads"
        if depth > MAX_DEPTH:
            return f"nested more than {MAX_DEPTH} levels deep{at}; flatten it"
        if type(item) is dict:
            bad = [k for k in item if type(k) is not str or not _is_text(k)]
            if bad:
                return f"the key {_short(bad[0])}{at} is not text; option names are words"
            children = [(v, f"{where}.{k}" if where else k) for k, v in item.items()]
        elif type(item) in (list, tuple):
            children = [(v, f"{where}[{i}]") for i, v in enumerate(item)]
        elif type(item) in _PLAIN_LEAVES:  # exact types: numpy's float64 is a float YAML cannot write
            if type(item) is str and not _is_text(item):
                return f"the text{at} has a character that is not valid Unicode (a lone surrogate); write plain text"
            if type(item) is int and item.bit_length() > 1000:
                return f"the whole number{at} has more than 300 digits; write a smaller one"
            continue
        else:
            return (f"holds {_short(item)} ({type(item).__name__}){at}; a config holds plain data "
                    "(numbers, text, lists, mappings): pass objects through the task factory")
        if id(item) in inside:
            return f"contains itself{at}; a config holds plain data, without cycles"
        inside.add(id(item))
        stack.append((_LEAVE, id(item), where))
        stack += [(child, depth + 1, path) for child, path in children]
    return None


_LEAVE = object()
"""A marker on plain_data_problem's stack: the container under it is done."""


def _coerce_int(value: Any) -> tuple[bool, Any, str]:
    if isinstance(value, int) and not isinstance(value, bool):
        return True, value, ""
    if isinstance(value, float) and value.is_integer():
        return True, int(value), ""
    return False, None, f"expected a whole number, got {_short(value)}; write it in digits without a fraction, e.g. 2"


def _coerce_float(value: Any) -> tuple[bool, Any, str]:
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):  # YAML 1.1 reads "5e-5" (no dot) as text; accept it as a number.
        with contextlib.suppress(ValueError):
            number = float(value)
    if number is None:
        return False, None, f"expected a number, got {_short(value)}; write it in digits, e.g. 0.001 or 3e-4"
    if not math.isfinite(number):  # YAML's .inf and .nan, or "inf"/"nan"/"1e999" as text
        return False, None, f"must be a finite number, got {_short(value)}; inf and nan are not allowed, write digits"
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
    """Plain data from config YAML (workbench.config.yamlfile: safe, bounded); YamlProblem if it is not."""
    from workbench.config.yamlfile import load

    return load(text)


def apply_overrides(data: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply "a.b.c=value" assignments to nested dict `data` (values parsed as YAML)."""
    from workbench.config.yamlfile import YamlProblem

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
        except YamlProblem as exc:
            problems.append(f"--set {item!r}: the value is not valid YAML ({exc})")
    if problems:
        raise ConfigError(problems)
    return data
