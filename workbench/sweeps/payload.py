"""What a sweep runs in each trial, given as one argument: `workbench.sweep(cfg, space, payload=...)`.

    payload=None                                  the engine on cfg (cfg.task.name); fields: any config field
    payload=make_task                             a task factory, as workbench.submit(cfg, task=make_task)
    payload=Fn(train, 100)                        a function, as workbench.submit_fn(train, 100); fields fn.<keyword>
    payload=Script("train.py", "--epochs", "1")   a script, as workbench.submit_script; fields args.<name>
    payload=Script(module="pkg.train")            a module, as python -m pkg.train
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError


@dataclass(frozen=True, init=False)
class Fn:
    """A function a sweep runs on every rank, as workbench.submit_fn does: fn(*args, **swept) where
    the swept fields are fn.<keyword>."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]

    def __init__(self, fn: Callable[..., Any], *args: Any):
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "args", tuple(args))


@dataclass(frozen=True, init=False)
class Script:
    """A torchrun-style script (or `module=`, as python -m) a sweep runs on every rank, as
    workbench.submit_script does, with its base arguments; the swept fields args.<name> are its options."""

    path: str | Path | None
    args: tuple[str, ...]
    module: str | None

    def __init__(self, path: str | Path | None = None, *args: str, module: str | None = None):
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "args", args)  # checked where the script is found (sweeps.script)
        object.__setattr__(self, "module", module)

    @classmethod
    def of(cls, path: str | Path | None, args: Any, module: str | None) -> Script:
        """From the arguments as one value (a list, or what a caller passed as one), kept as given so
        that the check names what is wrong with it."""
        made = cls(path, module=module)
        object.__setattr__(made, "args", args)
        return made


OLD_NAMES = ("task", "fn", "fn_args", "script", "script_args", "module")
"""sweep()'s keywords before `payload` (deprecated; they still work for a release, with a warning)."""


def unpack(payload: Any) -> dict[str, Any]:
    """The payload as the driver keeps it: task, fn, fn_args, script, script_args, module."""
    parts: dict[str, Any] = {"task": None, "fn": None, "fn_args": (), "script": None, "script_args": (),
                             "module": None}
    if payload is None:
        return parts
    if isinstance(payload, Fn):
        return {**parts, "fn": payload.fn, "fn_args": payload.args}
    if isinstance(payload, Script):
        return {**parts, "script": payload.path, "script_args": payload.args, "module": payload.module}
    if isinstance(payload, (str, Path)):
        raise ConfigError([f"payload: {str(payload)!r} is a path; a script is payload=workbench.sweeps.Script("
                           f"{str(payload)!r}, *its_arguments)"])
    if callable(payload):
        return {**parts, "task": payload}
    raise ConfigError([f"payload: {payload!r} is not something a sweep runs; give a task factory, "
                       "workbench.sweeps.Fn(fn, *args) or workbench.sweeps.Script('train.py', *args)"])


def from_old_names(payload: Any, old: dict[str, Any]) -> Any:
    """sweep(task=/fn=/fn_args=/script=/script_args=/module=) as one payload; the old keywords are
    deprecated.  Unknown keywords are a TypeError, as Python's own."""
    unknown = sorted(set(old) - set(OLD_NAMES))
    if unknown:
        raise TypeError(f"sweep() got an unexpected keyword argument {unknown[0]!r}")
    given = {k: v for k, v in old.items() if v is not None and v != ()}
    if not given:
        return payload
    if payload is not None:
        raise ConfigError([f"payload: given with {', '.join(k + '=' for k in sorted(given))}; give payload= alone"])
    import warnings

    warnings.warn(f"sweep({', '.join(k + '=' for k in sorted(given))}) is deprecated and goes in the next release: "
                  "pass what is swept as payload= (a task factory, workbench.sweeps.Fn(fn, *args) or "
                  "workbench.sweeps.Script(path, *args, module=...))", DeprecationWarning, stacklevel=3)
    kinds = [k for k in ("task", "fn", "script") if k in given or (k == "script" and "module" in given)]
    if len(kinds) > 1:
        raise ConfigError([f"sweep: {' and '.join(k + '=' for k in kinds)} given; sweep one thing: a task factory, "
                           "a function or a script"])
    if "fn" in given:
        return Fn(given["fn"], *given.get("fn_args", ()))
    if "fn_args" in given:
        raise ConfigError([f"fn_args: {given['fn_args']!r} given without fn=; pass "
                           "payload=workbench.sweeps.Fn(fn, *args)"])
    if "script" in given or "module" in given:
        return Script.of(given.get("script"), given.get("script_args", ()), given.get("module"))
    if "script_args" in given:
        raise ConfigError([f"script_args: {given['script_args']!r} given without script=; pass "
                           "payload=workbench.sweeps.Script('train.py', *args), or leave them out"])
    return given["task"]
