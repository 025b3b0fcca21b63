"""What a task is and how a task name becomes one.

A task factory is any callable ``factory(**options) -> Task`` (or a dict with the same keys).  It
is named in YAML as "package.module:factory", given by a built-in name, or passed as a Python
object (a function defined in a notebook cell is pickled by value and shipped to the ranks).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.config.tasknames import BUILTIN_OPTIONS, BUILTINS, task_name_problem
from workbench.errors import ConfigError

if TYPE_CHECKING:
    from workbench.runfolder.layout import RunDir



@dataclass
class Task:
    """Everything a rank needs to train: datasets must be identical on every rank.

    Batches come in two shapes, and the loss from the model or from `loss_fn`:

    - ``(inputs, target)`` pairs: ``loss_fn(model(inputs), target)``; without a loss_fn the model
      computes its own loss, ``model(inputs, target)`` (nanoGPT's ``GPT(idx, targets)``);
    - dicts (Hugging Face style): ``model(**batch)``; without a loss_fn the loss is the output's
      ``loss`` (``outputs.loss`` or ``outputs["loss"]``), else ``loss_fn(output, batch)``.

    A model's own loss may be a scalar tensor, a tuple/list ending in one (``(logits, loss)``), a
    dict with "loss" or an object with ``.loss``."""

    model: Any
    """A torch.nn.Module; it is moved to the rank's device and wrapped in DDP."""
    train_dataset: Any
    """A map-style dataset of (input, target) pairs or of dicts of tensors."""
    loss_fn: Callable[[Any, Any], Any] | None = None
    """loss_fn(output, target) -> mean loss over the batch; empty when the model returns its loss."""
    val_dataset: Any = None
    """Optional validation dataset, shaped like the training set."""
    metrics: dict[str, Callable[[Any, Any], Any]] = field(default_factory=dict)
    """name -> fn(output, target) (fn(output, batch) for dict batches) giving the batch mean;
    reduced across ranks weighted by count."""


def forward_loss(model: Any, batch: Any, loss_fn: Callable[[Any, Any], Any] | None) -> tuple[Any, Any, int]:
    """(mean loss, model output, samples in the batch) of one forward pass (see Task)."""
    if isinstance(batch, Mapping):
        output = model(**batch)
        loss = loss_fn(output, batch) if loss_fn is not None else model_loss(output)
        return loss, output, _batch_size(batch)
    inputs, target = batch
    if loss_fn is not None:
        output = model(inputs)
        return loss_fn(output, target), output, len(target)
    output = model(inputs, target)
    return model_loss(output), output, len(target)


def model_loss(output: Any) -> Any:
    """The loss a model returned: a scalar tensor, the last element of a tuple/list, ["loss"] or .loss."""
    import torch

    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    if isinstance(output, Mapping) and "loss" in output:
        return output["loss"]
    if getattr(output, "loss", None) is not None:
        return output.loss
    if isinstance(output, (tuple, list)) and output and isinstance(output[-1], torch.Tensor) and output[-1].dim() == 0:
        return output[-1]
    raise TypeError(f"the model returned {type(output).__name__}, which holds no loss; return a scalar loss, "
                    "(logits, loss), a dict with 'loss' or an object with .loss, or give the Task a loss_fn")


def _batch_size(batch: Mapping[str, Any]) -> int:
    for value in batch.values():
        shape = getattr(value, "shape", None)
        if shape:
            return int(shape[0])
    raise TypeError("a dict batch needs at least one tensor with a batch dimension")


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
    """The factory passed as a Python object at submit (the run's payload.pkl), or None.

    cloudpickle ships a function defined in a notebook by value, but one from a module by reference:
    that module must be importable on the ranks too."""
    import pickle

    from workbench.runfolder.private import check_trusted, open_regular

    if not run.payload_pickle.exists():
        return None
    # Written by this run's submitter into its private folder: from another owner's or a folder others
    # can write, a planted pickle would run as the user (UntrustedFileError); a FIFO is not waited on.
    check_trusted(run.root, run.payload_pickle)
    try:
        with open_regular(run.payload_pickle) as fh:
            return pickle.load(fh)  # noqa: S301 - written by this run's own submitter
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{exc} while unpickling the task factory: its module is importable where the job was submitted "
            f"but not on the ranks; add its folder to PYTHONPATH (or install it) before starting the kernel, "
            f"or define the factory in the notebook", name=exc.name) from exc


def build_task(factory: Callable[..., Any], options: dict[str, Any]) -> Task:
    """Call the factory and check what it returned."""
    made = factory(**options)
    name = factory_label(factory).strip("<>")
    if isinstance(made, dict):
        keys = {"model", "train_dataset", "val_dataset", "loss_fn", "metrics"}
        unknown = sorted(map(str, set(made) - keys))
        missing = sorted({"model", "train_dataset", "loss_fn"} - set(made))
        if unknown or missing:
            raise TypeError(f"task factory {name} returned a dict with {_keys(unknown, 'unknown')}"
                            f"{' and ' if unknown and missing else ''}{_keys(missing, 'missing')}; "
                            f"its keys are {', '.join(sorted(keys))}")
        made = Task(**made)
    if not isinstance(made, Task):
        raise TypeError(f"task factory {name} returned {type(made).__name__}; return "
                        "workbench.Task(model=..., train_dataset=..., loss_fn=...) or a dict with those keys")
    return made


def _keys(keys: list[str], what: str) -> str:
    return f"{what} keys {', '.join(keys)}" if keys else ""


def factory_label(factory: Callable[..., Any]) -> str:
    """A readable name for a factory object, stored in the config snapshot and naming the run's
    folder: a functools.partial by the function it wraps, a callable object by its class (never a
    repr, which carries a memory address)."""
    inner = unwrapped(factory)
    return f"<{getattr(inner, '__module__', None) or '?'}.{inner.__qualname__}>"


def unwrapped(fn: Callable[..., Any]) -> Any:
    """What names a callable: the function a functools.partial wraps, a callable object's class."""
    inner: Any = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    return inner if hasattr(inner, "__qualname__") else type(inner)


# --- binding a factory to task.options (checked at submit, before any process starts) ---------------


def options_problem(factory: Callable[..., Any], options: Mapping[str, Any], name: str | None = None) -> str | None:
    """Why ``factory(**options)`` cannot be called, as one "task.options: ..." line naming the options and
    the fix; None when the options bind to the factory's signature (or it has none Python can read)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None  # a callable without a readable signature (a C extension): the ranks will tell
    return _bind_problem(signature, options, name or getattr(factory, "__qualname__", None)
                         or factory_label(factory).strip("<>"))


def named_task_problem(name: str, options: Mapping[str, Any]) -> str | None:
    """The task a config names, against its task.options, as one line (None when it binds): a built-in's
    parameters are known without importing it; a "package.module:factory" is imported (its module's
    code runs here) and its signature bound, so a missing module or attribute is found before any rank."""
    if name.startswith("<"):
        return None  # a Python object given as task= (bound by factory_options) or a script/function job
    if name in BUILTIN_OPTIONS:
        unknown = [key for key in options if key not in BUILTIN_OPTIONS[name]]
        return (f"task.options: the built-in task {name} does not take {', '.join(unknown)}; remove "
                f"{_them(unknown)} (it takes {', '.join(BUILTIN_OPTIONS[name])})") if unknown else None
    try:
        factory = resolve_factory(name)
    except Exception as exc:  # noqa: BLE001 - whatever importing the user's module raised is theirs to fix
        return _import_problem(name, exc)
    if not callable(factory):
        return f"task.name: {name} is {type(factory).__name__}, not a function; name a task factory (module:function)"
    return options_problem(factory, options, name.partition(":")[2])


def _import_problem(name: str, exc: Exception) -> str:
    module, _, attr = name.partition(":")
    if isinstance(exc, ValueError) and str(exc).startswith("task.name:"):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError):
        return (f"task.name: {name}: importing {module} failed: {exc}; install it or add its folder to "
                "PYTHONPATH (the ranks need it too)")
    if isinstance(exc, AttributeError):
        return f"task.name: {name}: module {module} has no {attr}; check the name after the colon"
    return f"task.name: {name}: importing {module} raised {type(exc).__name__}: {exc}; fix the module"


def _bind_problem(signature: inspect.Signature, options: Mapping[str, Any], name: str) -> str | None:
    try:
        signature.bind(**options)
    except TypeError as exc:
        return _unbound(signature, options, name, exc)
    return None


def _unbound(signature: inspect.Signature, options: Mapping[str, Any], name: str, exc: TypeError) -> str:
    params = signature.parameters.values()
    by_name = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    unknown = [] if takes_any else [key for key in options if key not in by_name]
    if unknown:
        takes = f"it takes {', '.join(sorted(by_name))}" if by_name else "it takes no options"
        return (f"task.options: {name}() does not take {', '.join(unknown)} ({takes}); remove {_them(unknown)} "
                f"from task.options, or add {_them(unknown)} to {name}'s parameters")
    missing = [p.name for p in params if p.default is p.empty and p.name in by_name and p.name not in options]
    if missing:
        return (f"task.options: {name}() needs {', '.join(missing)}, which task.options does not set; set "
                f"task.options.{missing[0]}, or give {name}'s parameter a default")
    return f"task.options: {name}() cannot be called with them ({exc}); make task.options match its parameters"


def factory_options(factory: Callable[..., Any], task_name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a factory given as an object (``submit(cfg, task=factory)``) is called with.

    The config's task.options when the factory takes them all.  Options written for the built-in task
    the config names (examples/quickstart.yaml's options for "synthetic") are that task's, not the
    factory's: it is called with its own defaults.  Anything else raises ConfigError naming the
    options the factory does not take."""
    problem = options_problem(factory, options)
    if problem is None:
        return dict(options)
    builtin = BUILTIN_OPTIONS.get(task_name)
    if builtin is not None and set(options) <= set(builtin):
        if options_problem(factory, {}) is None:
            return {}
        name = getattr(factory, "__qualname__", None) or factory_label(factory).strip("<>")
        needed = [p.name for p in inspect.signature(factory).parameters.values() if p.default is p.empty
                  and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        problem = (f"task.options: {name}() needs {', '.join(needed) or 'arguments'}, and the config's task.options "
                   f"({', '.join(options)}) are for the built-in task {task_name}, so they are not passed to a "
                   f"factory given as task=; set task.options to {name}'s own (cfg.replace(task__options="
                   "{...})), or give its parameters defaults")
    raise ConfigError([problem])


def _them(names: list[str]) -> str:
    return "it" if len(names) == 1 else "them"
