"""Building the user's task without allocating it, the one place that does: the plan's memory trace
(planning.memory) and submit's look at the model's module classes (dist.fsdp_units).

Two ways, by what the caller needs of the tensors:
    fake_tensors()   every tensor is a fake one (shape, dtype, device, no storage) that a training
                     step can be traced through; torch's first fake operation in a process imports
                     torch._dynamo, 8-20 s on this project's loaded 2-core machine
    model_classes()  the model's module classes only: built under the meta device (no storage, no
                     step); most ops have C++ meta kernels, so a model builds in a fraction of a second,
                     unless one of its ops' meta kernels is Python (torch.triu in charlm's causal mask),
                     which costs the same first import
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any


@contextlib.contextmanager
def fake_tensors() -> Iterator[None]:
    """Inside, torch makes fake tensors (FakeTensorMode); real ones made before are accepted as inputs.

    Not FakeCopyMode: it maps a deep copy back to the fake tensor it copies, so the layers a
    TransformerEncoder clones from one were one layer, counted once.  A plain deepcopy of a fake
    parameter is a new fake parameter; torch warns that it reads its (absent) data pointer."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        yield


def model_classes(factory: Callable[..., Any], options: Mapping[str, Any]) -> set[str] | None:
    """The class names of every module of the model `factory(**options)` builds, built under the meta
    device (its code runs; its weights and data are not allocated).  None when it cannot be built that
    way (a factory that reads its tensors' values, a custom op): the ranks, which build it for real,
    say what is wrong then."""
    import torch

    from workbench.engine.tasks import build_task

    try:
        with torch.device("meta"):
            model = build_task(factory, dict(options)).model
    except Exception:  # noqa: BLE001 - any factory: what cannot be built on the meta device is left to the ranks
        return None
    return {type(m).__name__ for m in model.modules()}
