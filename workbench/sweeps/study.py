"""The Optuna side of a sweep: Optuna itself (or one line naming the extra), the study's journal in
the sweep folder, samplers and pruners by name, and the swept task or function kept for a resume."""

from __future__ import annotations

import json
import math
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError, DamagedFileWarning, NotWrittenError, RunFolderError
from workbench.runfolder.layout import SweepDir
from workbench.sweeps import space as sp

PRUNERS = ("median", "percentile", "hyperband", "none")
STARTUP_TRIALS = 5
"""Trials that must have finished before "median" or "percentile" prunes one: Optuna's own default
(MedianPruner's n_startup_trials); each trial is then judged from its first report (n_warmup_steps=0,
Optuna's default too)."""
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

    write_atomic(folder.payload_pickle, dumps({"task": task, "fn": fn, "fn_args": tuple(fn_args)}))


def read_work(folder: SweepDir, trust: bool = False) -> dict[str, Any]:
    """The swept task or function (payload.pkl): unpickled only from a folder that is the user's own and
    private, else UntrustedFileError naming the file and why (`trust` reads it anyway)."""
    if not folder.payload_pickle.exists():
        return {}
    import cloudpickle

    from workbench.runfolder.private import check_trusted, open_regular

    check_trusted(folder.root, folder.payload_pickle, trust)
    try:
        with open_regular(folder.payload_pickle) as fh:
            work = cloudpickle.load(fh)
    except (OSError, EOFError, ImportError, AttributeError, pickle.UnpicklingError, ValueError, TypeError) as exc:
        raise damaged(folder, folder.payload_pickle, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(work, dict):
        raise damaged(folder, folder.payload_pickle, f"it holds a {type(work).__name__}, not the sweep's work")
    return work


def damaged(folder: SweepDir, path: Path, why: str) -> RunFolderError:
    """The one line for a sweep file that cannot be read back: which, why, and what to do."""
    return RunFolderError(f"{path}: the sweep's {path.name} is damaged ({why}); the sweep cannot be resumed from "
                          f"{folder.root.name}: its trials' run folders stay readable (workbench.runs), and "
                          "workbench.sweep(...) with the same space starts it again")


JOURNAL_MAX_BYTES = 1 << 30
"""A study journal larger than this is not read (a sweep's reports take kilobytes per trial)."""


def check_journal(folder: SweepDir, repair: bool) -> None:
    """The study's journal, checked before Optuna reads it: one JSON object a line.  A torn last line
    (what a writer killed mid-line leaves) is dropped with `repair` (a DamagedFileWarning says so):
    Optuna would append the next line to it and never read either again.  A missing or empty
    journal, a line that is not JSON before the last, or no study left: one RunFolderError line."""
    from workbench.runfolder.private import open_private, read_bounded
    path = folder.journal
    if repair and path.is_symlink():  # Optuna appends with open(): it would write through the link
        raise NotWrittenError(f"{path}: a symbolic link, not the sweep's own journal: the workbench does not write "
                              "through it; resume a copy of the sweep folder whose journal is a file")
    try:
        data = read_bounded(path, JOURNAL_MAX_BYTES + 1)
    except FileNotFoundError:
        raise damaged(folder, path, "it is missing: the study's trials were recorded there") from None
    except OSError as exc:
        raise damaged(folder, path, exc.strerror or str(exc)) from None
    if len(data) > JOURNAL_MAX_BYTES:
        raise damaged(folder, path, f"over {JOURNAL_MAX_BYTES >> 20} MiB")
    lines = data.splitlines(keepends=True)
    bad = [n for n, line in enumerate(lines, 1) if not _journal_line(line)]
    torn = bad == [len(lines)]
    if (bad and not torn) or len(lines) - len(bad) == 0:
        why = "it is empty" if not data.strip() else f"line {bad[0]} is not a JSON record" if bad and not torn \
            else "its only line is torn"
        raise damaged(folder, path, why)
    if torn and repair:
        keep = len(data) - len(lines[-1])
        with open_private(path, "r+b") as fh:  # O_NOFOLLOW, a regular file: nothing written through a link
            fh.truncate(keep)
        warnings.warn(f"{path}: its last line was torn (a driver killed while writing it) and is dropped; "
                      "the sweep goes on from the line before", DamagedFileWarning, stacklevel=2)


def _journal_line(line: bytes) -> bool:
    if not line.endswith(b"\n"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


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


def default_pruner(sampler: Any) -> str:
    """The pruner a sweep gets when none is named, by the kind of its sampler: "none" for a grid
    (Optuna's GridSampler: each point is one the user asked for, and runs to its end), "median"
    for a sampled search (TPE, random, or another sampler given)."""
    import optuna

    return "none" if isinstance(sampler, optuna.samplers.GridSampler) else "median"


def make_pruner(given: Any, sampler: Any) -> Any:
    """A pruner by name ("median", "percentile", "hyperband", "none") or as given; by default
    (`given` None) the one default_pruner(sampler) names.  "median" and "percentile" prune
    nothing before STARTUP_TRIALS trials finished."""
    optuna = optuna_module()
    if given is not None and not isinstance(given, str):
        return given
    name = given or default_pruner(sampler)
    made = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=STARTUP_TRIALS),
            "percentile": lambda: optuna.pruners.PercentilePruner(25.0, n_startup_trials=STARTUP_TRIALS),
            "hyperband": lambda: optuna.pruners.HyperbandPruner(),
            "none": lambda: optuna.pruners.NopPruner()}
    if name not in made:
        raise ConfigError([f"pruner: {given!r} is not one of {', '.join(PRUNERS)}; or pass an Optuna pruner"])
    return made[name]()


def pruner_text(pruner: Any) -> str:
    """What the sweep's pruner does, in a few words (the sweep view's title, `workbench sweep`):
    "none (every trial runs to its end)", "median, once 5 trials finished", or the pruner's class."""
    import optuna

    if isinstance(pruner, optuna.pruners.NopPruner):
        return "none (every trial runs to its end)"
    if isinstance(pruner, optuna.pruners.PercentilePruner):
        startup = getattr(pruner, "_n_startup_trials", None)
        after = f", once {startup} trials finished" if isinstance(startup, int) and startup > 0 else ""
        return f"{_percentile_name(pruner)}{after}"
    return type(pruner).__name__


def why_pruned(study: Any, number: int, metric: str) -> str:
    """Why the study's pruner stopped trial `number` at its last report, in the pruner's own terms:
    "pruned at step 40: val_loss 1.23 worse than the median 0.98 of 5 finished trials at that step
    (MedianPruner)".  Said for Optuna's percentile, median and threshold pruners; for another
    pruner, the step, the value and the pruner's name."""
    import optuna

    pruner, trial = study.pruner, next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    step = trial.last_step
    value = trial.intermediate_values.get(step, math.nan) if step is not None else math.nan
    reason = f"{metric} {value:.4g}"
    if math.isnan(value):
        reason = f"{metric} is NaN"
    elif isinstance(pruner, optuna.pruners.PercentilePruner):
        reason = _against_percentile(study, pruner, trial, step, metric) or reason
    elif isinstance(pruner, optuna.pruners.ThresholdPruner):
        lower, upper = getattr(pruner, "_lower", -math.inf), getattr(pruner, "_upper", math.inf)
        reason += f" above the upper bound {upper:g}" if value > upper else \
            f" below the lower bound {lower:g}" if value < lower else ""
    return f"pruned at step {step}: {reason} ({type(pruner).__name__})"


def _against_percentile(study: Any, pruner: Any, trial: Any, step: int, metric: str) -> str | None:
    """The comparison Optuna's PercentilePruner made: the trial's best value so far against the
    percentile of the finished trials' values at this step (None if it cannot be read back)."""
    import numpy as np
    from optuna.trial import TrialState

    percentile = getattr(pruner, "_percentile", None)
    if not isinstance(percentile, (int, float)):
        return None
    maximize = study.direction.name == "MAXIMIZE"
    done = [t.intermediate_values[step] for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if step in t.intermediate_values]
    if not done:
        return None
    mark = float(np.nanpercentile(np.array(done, dtype=float), 100 - percentile if maximize else percentile))
    values = np.array(list(trial.intermediate_values.values()), dtype=float)
    best = float(np.nanmax(values) if maximize else np.nanmin(values))
    latest = trial.intermediate_values[step]
    shown = f"{metric} {latest:.4g}" + (f", its best {best:.4g}," if best != latest else "")
    q = 100 - percentile if maximize else percentile
    named = "median" if q == 50 else f"{q:g}th percentile"
    return (f"{shown} worse than the {named} {mark:.4g} of {len(done)} finished "
            f"trial{'s' if len(done) != 1 else ''} at that step")


def _percentile_name(pruner: Any) -> str:
    percentile = getattr(pruner, "_percentile", None)
    if percentile == 50.0:
        return "median"
    return f"percentile {percentile:g}" if isinstance(percentile, (int, float)) else "percentile"


def _grid_sampler(optuna: Any) -> Any:
    """Optuna's GridSampler, except that it does not stop the study when the grid is used up: it calls
    study.stop(), which only works inside study.optimize; the sweep counts its own trials."""

    class AskTellGrid(optuna.samplers.GridSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return AskTellGrid
