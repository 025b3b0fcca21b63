"""What a task is and how a task name becomes one.

A task factory is any callable ``factory(**options) -> Task`` (or a dict with the same keys).  It
is named in YAML as "package.module:factory", given by a built-in name, or passed as a Python
object (a function defined in a notebook cell is pickled by value and shipped to the ranks).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.rundir import RunDir

BUILTINS = {
    "synthetic": "workbench.engine.builtin_tasks:synthetic_classification",
    "charlm": "workbench.engine.builtin_tasks:char_lm",
}


@dataclass
class Task:
    """Everything a rank needs to train: datasets must be identical on every rank."""

    model: Any
    """A torch.nn.Module; it is moved to the rank's device and wrapped in DDP."""
    train_dataset: Any
    """A map-style dataset of (input, target) pairs."""
    loss_fn: Callable[[Any, Any], Any]
    """loss_fn(output, target) -> mean loss over the batch."""
    val_dataset: Any = None
    """Optional validation dataset of (input, target) pairs."""
    metrics: dict[str, Callable[[Any, Any], Any]] = field(default_factory=dict)
    """name -> fn(output, target) giving the batch mean; reduced across ranks weighted by count."""


def task_name_problem(name: str) -> str | None:
    """Why `name` cannot name a task (None when it looks usable); imports nothing."""
    if name in BUILTINS or name.startswith("<"):
        return None
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr.isidentifier():
        return (f"unknown task {name!r}; use a built-in ({', '.join(BUILTINS)}) "
                "or a factory as package.module:function")
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        return f"module {module!r} is not importable; install it or add it to PYTHONPATH"
    return None


def resolve_factory(name: str) -> Callable[..., Any]:
    """The factory callable named by a built-in name or "module:attr"."""
    target = BUILTINS.get(name, name)
    problem = task_name_problem(target)
    if problem:
        raise ValueError(f"task.name: {problem}")
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]


def load_task_factory(run: RunDir) -> Callable[..., Any] | None:
    """The factory passed as a Python object at submit (the run's task.pkl), or None.

    cloudpickle ships a function defined in a notebook by value, but one from a module by reference:
    that module must be importable on the ranks too."""
    import pickle

    if not run.task_pickle.exists():
        return None
    try:
        with open(run.task_pickle, "rb") as fh:
            return pickle.load(fh)  # noqa: S301 - written by this run's own submitter
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{exc} while unpickling the task factory: its module is importable where the job was submitted "
            f"but not on the ranks; add its folder to PYTHONPATH (or install it) before starting the kernel, "
            f"or define the factory in the notebook", name=exc.name) from exc


def build_task(factory: Callable[..., Any], options: dict[str, Any]) -> Task:
    """Call the factory and check what it returned."""
    made = factory(**options)
    if isinstance(made, dict):
        unknown = set(made) - {"model", "train_dataset", "val_dataset", "loss_fn", "metrics"}
        if unknown:
            raise TypeError(f"task factory returned unknown keys {sorted(unknown)}")
        made = Task(**made)
    if not isinstance(made, Task):
        raise TypeError(f"task factory must return workbench.Task or a dict, got {type(made).__name__}")
    return made


def factory_label(factory: Callable[..., Any]) -> str:
    """A readable name for a factory object, stored in the config snapshot."""
    return f"<{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}>"
