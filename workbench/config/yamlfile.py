"""Reading a config's YAML, bounded: a config is data from colleagues and old runs, never code.

`load(text)` parses with a ``yaml.SafeLoader`` subclass (pure Python: libyaml's parser crashes the
process on deeply nested input) that builds only plain data: mappings with text keys, lists, text,
numbers, booleans and null.  Timestamps, sets, binary and every Python tag are errors; ``1:30:00``
stays text (not base 60) and ``5e-5`` is a number.  Limits, each reported as one `YamlProblem`
line naming the cause and the fix:

- at most `MAX_BYTES` of text (the pure-Python parser reads about 100 KiB a second);
- at most `MAX_VALUES` values once anchors and aliases (``&a``, ``*a``) are expanded (an alias bomb
  loads in milliseconds and expands to billions of values), no alias that contains itself, nesting
  at most as deep as Python's recursion allows;
- every mapping key is text and appears once (PyYAML would silently keep the last of two).

No workbench imports: configtypes and config turn a YAMLProblem into a ConfigError.
"""

from __future__ import annotations

import re
from typing import Any

MAX_BYTES = 256 << 10
"""Largest config text or file read (a real config is a few KiB)."""
MAX_VALUES = 100_000
"""Most values (scalars, lists, mappings) a config may hold, counted with aliases expanded."""
MAX_DEPTH = 64
"""Deepest nesting of lists and mappings a config may hold."""

_STR, _INT, _FLOAT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_PLAIN_TAGS = {"tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", _INT, _FLOAT, _STR,
               "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"}


class YamlProblem(ValueError):
    """Text that is not a config this loader accepts; the message is one line: where, what, the fix."""


def load(text: str) -> Any:
    """Plain data from YAML `text`, or YamlProblem."""
    import yaml

    if len(text) > MAX_BYTES:
        raise YamlProblem(f"{len(text) >> 10} KiB of YAML is more than a config may hold ({MAX_BYTES >> 10} KiB); "
                          "keep large data in files your task factory reads")
    fast = _c_loader(tree="&" not in text and "*" not in text) if len(text) <= C_MAX_BYTES else None
    if fast is not None:
        try:
            return yaml.load(text, Loader=fast)  # noqa: S506 - SafeConstructor with the same checks
        except Exception:  # noqa: BLE001 - bad input: the pure-Python parser below says what, in its words
            pass
    try:
        return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
    except YamlProblem:
        raise
    except yaml.constructor.ConstructorError as exc:
        if "constructor for the tag" not in str(exc.problem):
            raise YamlProblem(f"{_where(exc.problem_mark)}cannot read YAML ({exc.problem}); fix it") from None
        tag = str(exc.problem).rsplit(" ", 1)[-1]
        raise YamlProblem(f"{_where(exc.problem_mark)}the tag {tag} is not allowed: a config holds plain data "
                          "(text, numbers, lists, mappings); remove the tag") from None
    except yaml.MarkedYAMLError as exc:
        raise YamlProblem(f"{_where(exc.problem_mark)}cannot parse YAML ({exc.problem or exc.context}); "
                          "fix the syntax") from None
    except yaml.YAMLError as exc:
        raise YamlProblem(f"cannot parse YAML ({' '.join(str(exc).split())}); fix the syntax") from None
    except RecursionError:
        raise YamlProblem(f"YAML nested too deeply; a config nests at most {MAX_DEPTH} levels") from None
    except ValueError as exc:  # a constructor's own check, e.g. an integer of more than 4300 digits
        why = str(exc).split(";")[0][:120]
        raise YamlProblem(f"cannot read a value ({why}); write it as plain text or shorter digits") from None


C_MAX_BYTES = 16 << 10
"""Text up to this long is parsed with libyaml (about 20x faster: listing 500 never-listed run folders
parses 500 config snapshots).  Text this short cannot nest deeper than its length, and libyaml survives
16,384 levels of [, {a: and - (it crashes the process near 100,000); longer text, and any text libyaml
refuses, goes to the pure-Python parser, whose messages are the ones users see."""


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


_LOADER: type | None = None


def _loader() -> type:
    global _LOADER
    if _LOADER is None:
        _LOADER = _make_loader()
    return _LOADER


class _Checked:
    """The checks both loaders (pure Python, and libyaml's parser) make as they read: the document's
    size and depth (_check_size) and each mapping's keys (_check_keys)."""

    _size_check = staticmethod(lambda node: _check_size(node))

    def get_single_node(self) -> Any:
        node = super().get_single_node()  # type: ignore[misc]
        if node is not None:
            self._size_check(node)
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        _check_keys(node)
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


def _make_loader() -> type:
    import yaml

    class ConfigLoader(_Checked, yaml.SafeLoader):
        pass

    ConfigLoader.yaml_constructors = {tag: c for tag, c in yaml.SafeLoader.yaml_constructors.items()
                                      if tag in _PLAIN_TAGS or tag is None}
    # No timestamps, and YAML 1.1's int/float rules replaced: 1:30:00 stays text, 5e-5 is a number.
    ConfigLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT, "tag:yaml.org,2002:timestamp")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    ConfigLoader.add_implicit_resolver(_INT, re.compile(
        r"^(?:[-+]?0b[0-1_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$"), list("-+0123456789"))
    ConfigLoader.add_implicit_resolver(_FLOAT, re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))
    return ConfigLoader


_C_LOADER: type | None = None
_C_TREE_LOADER: type | None = None


def _c_loader(tree: bool = False) -> type | None:
    """ConfigLoader's constructors, resolvers and checks over libyaml's parser; None without libyaml.
    `tree`: for text without & and * (so no anchor or alias: every node is read once): the size check
    is a walk that only measures the depth, as the text's length (at most C_MAX_BYTES) bounds the
    count of values far below MAX_VALUES.  A failed check here sends the text to the pure-Python
    parser, whose full check gives the message."""
    global _C_LOADER, _C_TREE_LOADER
    import yaml

    if _C_LOADER is None and getattr(yaml, "__with_libyaml__", False):
        plain = _loader()

        from yaml._yaml import CParser

        class CConfigLoader(_Checked, CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
            def __init__(self, stream: Any) -> None:
                CParser.__init__(self, stream)
                yaml.constructor.SafeConstructor.__init__(self)
                yaml.resolver.Resolver.__init__(self)

        CConfigLoader.yaml_constructors = plain.yaml_constructors  # type: ignore[attr-defined]
        CConfigLoader.yaml_implicit_resolvers = plain.yaml_implicit_resolvers  # type: ignore[attr-defined]
        _C_LOADER = CConfigLoader

        class CTreeLoader(CConfigLoader):
            _size_check = staticmethod(lambda node: _check_depth(node))

        _C_TREE_LOADER = CTreeLoader
    return _C_TREE_LOADER if tree else _C_LOADER


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_size(root: Any) -> None:
    """Count the values `root` expands to (an alias counts its whole target again) and how deep
    they nest, iteratively; YamlProblem past MAX_VALUES or MAX_DEPTH, or for an alias inside its
    own anchor."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth), capped
    open_nodes: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            below = [done[id(c)] for c in _children(node)]
            values = min(MAX_VALUES + 1, 1 + sum(v for v, _ in below))
            depth = 1 + max((d for _, d in below), default=0)
            if depth > MAX_DEPTH:
                raise YamlProblem(f"{_where(node.start_mark)}values nested more than {MAX_DEPTH} levels deep "
                                  "(aliases included); flatten them")
            done[key] = (values, depth)
            continue
        if key in done:
            continue
        if key in open_nodes:
            raise YamlProblem(f"{_where(node.start_mark)}an alias refers to the anchor it is inside of; "
                              "a config cannot contain itself")
        open_nodes.add(key)
        stack.append((node, True))
        stack += [(c, False) for c in _children(node)]
    if done[id(root)][0] > MAX_VALUES:
        raise YamlProblem(f"anchors and aliases (&name, *name) expand to more than {MAX_VALUES} values; "
                          "write the values out, or use fewer aliases")


def _check_depth(root: Any) -> None:
    """YamlProblem for nesting deeper than MAX_DEPTH: a walk of a tree (no node reached twice: no alias)."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        value = node.value
        if type(value) is not list:  # a scalar
            continue
        if depth >= MAX_DEPTH and value:
            raise YamlProblem(f"{_where(node.start_mark)}values nested more than {MAX_DEPTH} levels deep; flatten them")
        depth += 1
        if value and type(value[0]) is tuple:  # a mapping's (key, value) pairs
            stack += [(child, depth) for pair in value for child in pair]
        else:
            stack += [(child, depth) for child in value]


def _check_keys(node: Any) -> None:
    """Every key of a mapping is text and appears once (merge keys, <<, may be overridden)."""
    import yaml

    seen: dict[str, Any] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        if not isinstance(key_node, yaml.ScalarNode):
            raise YamlProblem(f"{_where(key_node.start_mark)}a key is a list or mapping; names of sections, "
                              "fields and options are words")
        if key_node.tag != _STR:
            shown = key_node.value[:40]
            raise YamlProblem(f"{_where(key_node.start_mark)}the key {shown!r} is not text; names of sections, "
                              f"fields and options are words (quote it if it is meant as text: '{shown}':)")
        if key_node.value in seen:
            first = seen[key_node.value]
            raise YamlProblem(f"{_where(key_node.start_mark)}the key {key_node.value!r} appears twice in one "
                              f"mapping (first at line {first.line + 1}); keep one of them")
        seen[key_node.value] = key_node.start_mark
