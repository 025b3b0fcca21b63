"""The user's plot choices (x axis, log-y, smoothing, ranks), remembered across dashboards and plots.

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


def load() -> dict[str, Any]:
    """The saved choices that are still valid: x, log_y (True, False or None: auto), smooth, ranks."""
    try:
        saved = json.loads(settings_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(saved, dict):
        return {}
    found: dict[str, Any] = {}
    if saved.get("x") in X_AXES:
        found["x"] = saved["x"]
    if saved.get("log_y") in (True, False, None) and "log_y" in saved:
        found["log_y"] = saved["log_y"]
    smooth = saved.get("smooth")
    if isinstance(smooth, (int, float)) and not isinstance(smooth, bool) and 0.0 <= smooth < 1.0:
        found["smooth"] = float(smooth)
    if isinstance(saved.get("ranks"), str) and len(saved["ranks"]) < 200:
        found["ranks"] = saved["ranks"]
    return found


def save(choices: dict[str, Any]) -> bool:
    """Write the choices (merged into what is saved); False if the file cannot be written."""
    from workbench.runfolder.private import make_dirs, write_atomic

    path = settings_path()
    merged = {**load(), **{k: v for k, v in choices.items() if k in ("x", "log_y", "smooth", "ranks")}}
    try:
        make_dirs(path.parent)
        write_atomic(path, (json.dumps(merged, indent=1) + "\n").encode())
    except OSError:
        return False
    return True
