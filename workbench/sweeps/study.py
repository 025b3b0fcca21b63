"""The Optuna side of a sweep: Optuna itself (or one line naming the extra), the study's journal in
the sweep folder, samplers and pruners by name, and the swept task or function kept for a resume."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.errors import ConfigError
from workbench.runfolder.layout import SweepDir
from workbench.sweeps import space as sp

PRUNERS = ("median", "percentile", "hyperband", "none")
SAMPLERS = ("grid", "tpe", "random")
INSTALL = 'pip install "workbench[sweep]"'


def optuna_module() -> Any:
    """Optuna, or one ConfigError line naming the extra that brings it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError([f"sweep: needs Optuna, which is not installed; {INSTALL} (or pip install 'optuna>=4')"]) \
            from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep says what happens, once per trial event
    return optuna


def write_work(folder: SweepDir, task: Any, fn: Any, fn_args: tuple[Any, ...]) -> None:
    if task is None and fn is None:
        return
    from workbench.launch.pickling import dumps
    from workbench.runfolder.private import write_atomic

    write_atomic(folder.task_pickle, dumps({"task": task, "fn": fn, "fn_args": tuple(fn_args)}))


def read_work(folder: SweepDir) -> dict[str, Any]:
    if not folder.task_pickle.exists():
        return {}
    import cloudpickle

    return dict(cloudpickle.loads(folder.task_pickle.read_bytes()))


def label(given: Any, default: str) -> str:
    return default if given is None else given if isinstance(given, str) else type(given).__name__


def storage(folder: SweepDir) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(folder.journal)))


def make_sampler(given: Any, space: Mapping[str, Any]) -> Any:
    """A sampler by name ("grid", "tpe", "random") or as given; default grid for a list space, else TPE."""
    optuna = optuna_module()
    if given is not None and not isinstance(given, str):
        return given
    name = given or ("grid" if sp.is_grid(space) else "tpe")
    if name == "grid":
        if not sp.is_grid(space):
            raise ConfigError(["sampler: 'grid' needs every field given as a list of values"])
        return _grid_sampler(optuna)({f: list(v) for f, v in space.items()}, seed=0)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=0)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=0)
    raise ConfigError([f"sampler: {name!r} is not one of {', '.join(SAMPLERS)}; or pass an Optuna sampler"])


def make_pruner(given: Any) -> Any:
    """A pruner by name ("median", "percentile", "hyperband", "none") or as given; default median."""
    optuna = optuna_module()
    if given is not None and not isinstance(given, str):
        return given
    made = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2),
            "percentile": lambda: optuna.pruners.PercentilePruner(25.0, n_startup_trials=2),
            "hyperband": lambda: optuna.pruners.HyperbandPruner(),
            "none": lambda: optuna.pruners.NopPruner()}
    if (given or "median") not in made:
        raise ConfigError([f"pruner: {given!r} is not one of {', '.join(PRUNERS)}; or pass an Optuna pruner"])
    return made[given or "median"]()


def _grid_sampler(optuna: Any) -> Any:
    """Optuna's GridSampler, except that it does not stop the study when the grid is used up: it calls
    study.stop(), which only works inside study.optimize; the sweep counts its own trials."""

    class AskTellGrid(optuna.samplers.GridSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return AskTellGrid
