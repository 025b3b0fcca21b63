"""Sweeps: search a config space with DDP trials, each an ordinary run, from the submitting process.

The public names: `loguniform(1e-4, 1e-2)`, `uniform`, `choice`, `int_range` for a sampled field;
`sweep(cfg, space, payload=..., ...)` (also `workbench.sweep`) starts one, `payload` saying what each
trial runs (None: the engine on cfg; a task factory; `Fn(fn, *args)`; `Script(path, *args)`);
`Sweep` (also `workbench.Sweep`; `Sweep.load(folder)` reopens one); `list_sweeps(root)` lists them.
Optuna comes with the `sweep` extra: pip install "workbench[sweep]".

The package sits above workbench.launch (a trial is a run submitted as any other) and below the
front doors (workbench.ui's sweep form and view, `workbench sweep`):

    driver.py   Sweep and sweep(): Optuna's ask and tell, one run per trial
    payload.py  what a trial runs, as one argument: a task factory, Fn, Script
    array.py    on SLURM: the trials as the elements of job arrays, bound late
    space.py    the space: lists, distributions, fields checked against the config
    script.py   a swept script's arguments (args.* fields)
    study.py    Optuna itself, the journal, samplers and pruners, the swept work kept for a resume
    views.py    a sweep read back: its trial table, reopening and following it, list_sweeps()
    plot.py     the sweep's figure

What runs inside an array element's ranks is workbench.engine.sweep_element."""

from __future__ import annotations

import sys
import types
import warnings
from typing import TYPE_CHECKING, Any

from workbench.sweeps.payload import Fn, Script
from workbench.sweeps.space import Distribution, choice, int_range, loguniform, uniform

__all__ = ["Distribution", "Fn", "Script", "Sweep", "choice", "int_range", "list_sweeps", "loguniform", "sweep",
           "uniform"]

if TYPE_CHECKING:
    from workbench.sweeps.driver import Sweep, sweep
    from workbench.sweeps.views import list_sweeps


def __getattr__(name: str) -> Any:
    """Sweep, sweep and list_sweeps load pandas and the launch side: imported when first used."""
    if name in ("Sweep", "sweep"):
        from workbench.sweeps import driver

        return getattr(driver, name)
    if name == "list_sweeps":
        from workbench.sweeps.views import list_sweeps

        return list_sweeps
    raise AttributeError(f"module 'workbench.sweeps' has no attribute {name!r}")


class _DeprecatedCall(types.ModuleType):
    """Deprecated, to be removed in the next release with this class: `workbench.sweeps(root)` called
    the package to list the sweeps; `workbench.sweeps.list_sweeps(root)` is the name for that now."""

    def __call__(self, root: Any = None) -> Any:
        warnings.warn("calling workbench.sweeps(root) is deprecated and goes in the next release; "
                      "use workbench.sweeps.list_sweeps(root)", DeprecationWarning, stacklevel=2)
        from workbench.sweeps.views import list_sweeps

        return list_sweeps(root)


sys.modules[__name__].__class__ = _DeprecatedCall
