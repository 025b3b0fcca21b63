"""The config model seen as a flat list of editable fields (no widgets here).

Fields are found by walking the JobConfig dataclasses, so a field added to a config section shows up
in the form without touching this package.  Each field gets a `kind` that picks its widget, and two
conversions: config value -> widget value, and widget value -> plain data for ``JobConfig.from_dict``
(so type errors get the very messages the Python API gives).
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from workbench.config.sections import JobConfig
from workbench.config.types import yaml_load

# kind -> widget: choice -> Dropdown, bool -> Checkbox; int, float, text and yaml -> Text (an IntText would
# turn a typed 2.5 into 25 and silently drop 'abc'; a Text is parsed strictly and says what is wrong).
KINDS = ("choice", "bool", "int", "float", "text", "yaml")


@dataclass(frozen=True)
class FieldSpec:
    path: str
    """Dotted path, e.g. "train.early_stopping.patience"."""
    section: str
    """Dotted path of the dataclass holding the field, e.g. "train.early_stopping"."""
    kind: str
    optional: bool
    """None is allowed: an empty text means None."""
    choices: tuple[Any, ...] = ()
    container: type | None = None
    """dict or list for yaml fields (an empty text means an empty one)."""
    doc: str = ""
    number: str = ""
    """"int" or "float" for a number field (Optional ones included): it may hold several values (a sweep)."""

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def config_fields(cls: type = JobConfig) -> list[FieldSpec]:
    """Every leaf field of `cls`, depth first: a section's own fields, then its nested sections."""
    docs = JobConfig.docs() if cls is JobConfig else {}
    return _walk(cls, "", docs)


def _walk(cls: type, prefix: str, docs: dict[str, str]) -> list[FieldSpec]:
    hints = typing.get_type_hints(cls)
    own, nested = [], []
    for f in dataclasses.fields(cls):
        path, hint = f"{prefix}{f.name}", hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            nested += _walk(hint, f"{path}.", docs)
        else:
            own.append(field_spec(path, hint, docs.get(path, "")))
    return own + nested


def field_spec(path: str, hint: Any, doc: str = "") -> FieldSpec:
    """The kind of widget a type hint calls for."""
    base, optional = _strip_optional(hint)
    section = path.rsplit(".", 1)[0] if "." in path else ""
    origin = typing.get_origin(base)
    if origin is Literal:
        return FieldSpec(path, section, "choice", optional, typing.get_args(base), doc=doc)
    if origin in (dict, list) or base in (dict, list):
        return FieldSpec(path, section, "yaml", optional, container=origin or base, doc=doc)
    kind = {bool: "bool", int: "int", float: "float", str: "text"}.get(base, "yaml")
    if kind in ("bool", "int") and optional:
        kind = "yaml"  # Optional[int] -> Text, where empty means None
    return FieldSpec(path, section, kind, optional, doc=doc, number={int: "int", float: "float"}.get(base, ""))


def _strip_optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        return (args[0] if len(args) == 1 else hint), optional
    return hint, False


def sections(specs: list[FieldSpec]) -> dict[str, list[FieldSpec]]:
    """Fields grouped by section, in walk order."""
    out: dict[str, list[FieldSpec]] = {}
    for spec in specs:
        out.setdefault(spec.section, []).append(spec)
    return out


# --- values ----------------------------------------------------------------------------------------
def to_widget(spec: FieldSpec, value: Any) -> Any:
    """The widget value showing config value `value`."""
    if value is None:
        return "" if spec.kind in ("choice", "float", "text", "yaml") else value
    if spec.kind in ("choice", "bool"):
        return value
    if spec.kind == "int":
        return str(value)
    if spec.kind == "float":
        return repr(float(value))  # 5e-05 stays 5e-05 (a FloatText would round it)
    if spec.kind == "text":
        return str(value)
    if spec.container is not None or isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def from_widget(spec: FieldSpec, raw: Any) -> tuple[Any, str | None]:
    """(plain value for from_dict, problem) from a widget value; problem names the field and the fix."""
    if spec.kind == "choice" and spec.optional and raw == "":
        return None, None
    if spec.kind in ("choice", "bool"):
        return raw, None
    text = str(raw).strip()
    if spec.kind == "int":
        return parse_int(spec, text)
    if text == "":
        if spec.container is not None:
            return spec.container(), None
        return (None if spec.optional else ""), None
    if spec.kind in ("float", "text"):
        return text, None  # from_dict accepts "5e-5" for floats and says why not for "abc"
    return _parse_yaml(spec, text)


def parse_int(spec: FieldSpec, text: str) -> tuple[Any, str | None]:
    """A whole number, strictly: "2.5", "abc", "1e3" and "" are problems, never 25 or the old value."""
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text), None
    shown = repr(text) if text else "nothing"
    return None, f"{spec.path}: expected a whole number (e.g. 4), got {shown}"


def _parse_yaml(spec: FieldSpec, text: str) -> tuple[Any, str | None]:
    from workbench.config.yamlfile import YamlProblem

    try:
        return yaml_load(text), None  # the config loader: 1:30:00 stays text, 5e-5 is a number
    except YamlProblem as exc:
        why = str(exc)
        example = "{momentum: 0.9}" if spec.container is dict else '["module load cuda"]'
        return None, f"{spec.path}: not valid YAML or JSON ({why}); write e.g. {example}"


def get_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[leaf] = value


def problem_field(problem: str) -> str:
    """The field path a validation message names (the text before the first colon)."""
    return problem.split(":", 1)[0].strip()
