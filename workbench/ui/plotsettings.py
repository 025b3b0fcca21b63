"""The user's plot choices, remembered across dashboards and plots.

The x axis, log-y and smoothing are the user's taste: remembered for every plot.  The rank filter belongs
to the run it was typed for (a rank hidden in one run's dashboard stayed hidden in every later run's), and
so does the smoothing chosen on a run: both are kept per run folder (the last KEPT_RUNS runs).

One small JSON file, private like everything the workbench writes (0600, folder 0700):
``$XDG_CONFIG_HOME/workbench/plot.json`` (``~/.config/workbench/plot.json`` when that is not set).
A value that is missing, damaged or not one the controls offer is ignored (the default applies); a
settings file that cannot be written leaves the choice for this session only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from workbench.results.metricview import X_AXES

FILE_NAME = "plot.json"


def settings_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "workbench" / FILE_NAME


GLOBAL = ("x", "log_y", "smooth")
PER_RUN = ("ranks", "smooth")
KEPT_RUNS = 200


MAX_BYTES = 1 << 20
"""A settings file larger than this is not the workbench's: ignored, as a damaged one."""


def _read() -> dict[str, Any]:
    from workbench.runfolder.private import read_bounded

    try:  # a regular file only (a FIFO there is not waited on), bounded; nested too deeply is damaged
        data = read_bounded(settings_path(), MAX_BYTES + 1)
        saved = json.loads(data) if len(data) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _valid(saved: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if "x" in names and saved.get("x") in X_AXES:
        found["x"] = saved["x"]
    if "log_y" in names and saved.get("log_y") in (True, False, None) and "log_y" in saved:
        found["log_y"] = saved["log_y"]
    smooth = saved.get("smooth")
    if "smooth" in names and isinstance(smooth, (int, float)) and not isinstance(smooth, bool) and 0.0 <= smooth < 1:
        found["smooth"] = float(smooth)
    if "ranks" in names and isinstance(saved.get("ranks"), str) and len(saved["ranks"]) < 200:
        found["ranks"] = saved["ranks"]
    return found


def load() -> dict[str, Any]:
    """The saved choices for every plot that are still valid: x, log_y (True, False or None: auto), smooth."""
    return _valid(_read(), GLOBAL)


def load_run(run: str) -> dict[str, Any]:
    """Only the choices made on the run `run` (its folder): ranks, smooth."""
    runs = _read().get("runs")
    return _valid(runs[run], PER_RUN) if isinstance(runs, dict) and isinstance(runs.get(run), dict) else {}


def save(choices: dict[str, Any], run: str | None = None) -> bool:
    """Write the choices (merged into what is saved): x, log_y and smooth for every plot; with `run`, ranks
    and smooth for that run as well.  False if the file cannot be written."""
    from workbench.runfolder.private import make_dirs, write_atomic

    path = settings_path()
    saved = _read()
    merged: dict[str, Any] = {**_valid(saved, GLOBAL), **{k: v for k, v in choices.items() if k in GLOBAL}}
    runs = {k: v for k, v in saved.get("runs", {}).items() if isinstance(v, dict)} \
        if isinstance(saved.get("runs"), dict) else {}
    if run is not None:
        runs.pop(run, None)  # to the end: the most recently used are kept
        runs[run] = {k: v for k, v in choices.items() if k in PER_RUN}
    if runs:
        merged["runs"] = dict(list(runs.items())[-KEPT_RUNS:])
    try:
        make_dirs(path.parent)
        write_atomic(path, (json.dumps(merged, indent=1) + "\n").encode())
    except OSError:
        return False
    return True
