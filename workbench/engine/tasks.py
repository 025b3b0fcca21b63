"""What a task is and how a task name becomes one.

A task factory is any callable ``factory(**options) -> Task`` (or a dict with the same keys).  It
is named in YAML as "package.module:factory", given by a built-in name, or passed as a Python
object (a function defined in a notebook cell is pickled by value and shipped to the ranks).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.config.tasknames import BUILTINS, task_name_problem

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
    """A readable name for a factory object, stored in the config snapshot."""
    return f"<{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}>"
