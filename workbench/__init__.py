"""workbench: configure, submit and watch PyTorch DDP jobs from a notebook, a terminal or torchrun.

``import workbench`` is light: torch, submitit and ipywidgets load only when used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.config.scaling import scaling_table
from workbench.config.sections import JobConfig
from workbench.errors import (
    ArgumentError,
    ConfigError,
    ConfigFileError,
    DamagedFileWarning,
    NotSignalledWarning,
    NotWrittenError,
    ResizeWarning,
    RunFailed,
    RunFolderError,
    SubmitError,
    UntrustedFileError,
    show_traceback,
)

__version__ = "0.1.0"

_LAZY = {
    "submit": "workbench.launch.submit",
    "Run": "workbench.launch.run",
    "Task": "workbench.engine.tasks",
    "log": "workbench.engine.script",
    "submit_script": "workbench.launch.submit",
    "submit_fn": "workbench.launch.submit",
    "Pool": "workbench.launch.pool",
    "pools": "workbench.launch.pool",
    "presets": "workbench.config.presets",
    "benchmark_scaling": "workbench.launch.scaling_bench",
    "analysis": "workbench.results.analysis",
    "runs": "workbench.launch.history",
    "compare": "workbench.launch.history",
    "config_diff": "workbench.launch.history",
    "plan": "workbench.planning.plan",
    "sweep": "workbench.sweeps.driver",
    "Sweep": "workbench.sweeps.driver",
    "sweeps": "workbench.sweeps",
}
_MODULES = ("presets", "analysis", "sweeps")

__all__ = ["JobConfig", "ArgumentError", "ConfigError", "ConfigFileError", "RunFolderError", "RunFailed", "SubmitError",
           "UntrustedFileError", "NotWrittenError", "DamagedFileWarning", "NotSignalledWarning", "ResizeWarning",
           "scaling_table", "show_traceback", *_LAZY]

if TYPE_CHECKING:
    from workbench import sweeps
    from workbench.engine.script import log
    from workbench.engine.tasks import Task
    from workbench.launch.history import compare, config_diff, runs
    from workbench.launch.pool import Pool, pools
    from workbench.launch.run import Run
    from workbench.launch.scaling_bench import benchmark_scaling
    from workbench.launch.submit import submit, submit_fn, submit_script
    from workbench.sweeps.driver import Sweep, sweep


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext workbench`: the %%ranks cell magic (workbench.ui.magic)."""
    from workbench.ui.magic import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        return module if name in _MODULES else getattr(module, name)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
