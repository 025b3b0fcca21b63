"""Sweeps' public names: `workbench.sweeps.loguniform(1e-4, 1e-2)`, `uniform`, `choice`, `int_range`
for a sampled field, and `Sweep` (`Sweep.load(folder)`).  `workbench.sweep(cfg, space, ...)` starts
one; `workbench.sweeps()` called on the package lists them.  Optuna comes with the `sweep` extra:
pip install "workbench[sweep]"."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from workbench.launch.sweepspace import Distribution, choice, int_range, loguniform, uniform

__all__ = ["Distribution", "Sweep", "choice", "int_range", "loguniform", "uniform", "sweep", "list_sweeps"]

if TYPE_CHECKING:
    from workbench.launch.sweep import Sweep, sweep
    from workbench.launch.sweepviews import sweeps as list_sweeps


def __getattr__(name: str) -> Any:
    if name in ("Sweep", "sweep"):
        from workbench.launch import sweep as module

        return getattr(module, name)
    if name == "list_sweeps":
        from workbench.launch.sweepviews import sweeps

        return sweeps
    raise AttributeError(f"module 'workbench.sweeps' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """`workbench.sweeps` is this module (its names above) and, called, lists the sweeps:
    `workbench.sweeps(root=None)` is workbench.launch.sweep.sweeps (one row per sweep folder)."""

    def __call__(self, root: Any = None) -> Any:
        from workbench.launch.sweepviews import sweeps

        return sweeps(root)


sys.modules[__name__].__class__ = _CallableModule
