"""A sweep's figure: the metric against each swept field (one point per trial, pruned ones faint),
and every trial's curve by samples seen."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

FAINT = 0.25
"""Alpha of a pruned (or failed) trial's points and curve."""


def plot_sweep(frame: pd.DataFrame, curves: Mapping[int, list[tuple[float, float]]], metric: str,
               space: Mapping[str, Any], theme: str = "light") -> Any:
    """One panel per swept field (the metric's best value of each trial against the field's value)
    and one panel of the trials' curves (metric by samples seen)."""
    from matplotlib.figure import Figure

    fields = list(space)
    fig = Figure(figsize=(4.2 * (len(fields) + 1), 3.4), layout="constrained")
    axes = fig.subplots(1, len(fields) + 1, squeeze=False)[0]
    best = f"{metric}_best"
    for ax, field in zip(axes, fields):
        _field_panel(ax, frame, field, best, space[field])
    _curves_panel(axes[-1], frame, curves, metric)
    if theme == "dark":
        fig.set_facecolor("#1e1e1e")
    return fig


def _field_panel(ax: Any, frame: pd.DataFrame, field: str, best: str, values: Any) -> None:
    for state, alpha, marker in (("finished", 1.0, "o"), ("pruned", FAINT, "x"), ("failed", FAINT, "x")):
        rows = frame[(frame["state"] == state) & frame[best].notna()] if len(frame) else frame
        if len(rows):
            x = rows[field]
            if not pd.api.types.is_numeric_dtype(x):
                x = x.astype(str)
            ax.scatter(x, rows[best], alpha=alpha, marker=marker, label=state)
    numbers = pd.to_numeric(frame[field], errors="coerce").dropna() if len(frame) else pd.Series(dtype=float)
    wide = len(numbers) and (numbers > 0).all() and numbers.max() / numbers.min() >= 10
    if getattr(values, "kind", "") == "loguniform" or wide:
        ax.set_xscale("log")
    ax.set_xlabel(field)
    ax.set_ylabel(best)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a trial with a value drawn (none before the first one ends)
        ax.legend(fontsize="small")


def _curves_panel(ax: Any, frame: pd.DataFrame, curves: Mapping[int, list[tuple[float, float]]],
                  metric: str) -> None:
    states = dict(zip(frame["number"], frame["state"])) if len(frame) else {}
    for number, points in sorted(curves.items()):
        finite = [(x, y) for x, y in points if math.isfinite(y)]
        if not finite:
            continue
        faint = states.get(number) in ("pruned", "failed", "cancelled", "requeued")
        xs, ys = [x for x, _ in finite], [y for _, y in finite]
        ax.plot(xs, ys, alpha=FAINT if faint else 0.9, linewidth=1.0 if faint else 1.6, marker="." if len(xs) < 4
                else None, label=f"trial {number}" + (" (pruned)" if states.get(number) == "pruned" else ""))
    ax.set_xlabel("samples seen")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    every = [y for points in curves.values() for _, y in points if math.isfinite(y) and y > 0]
    if every and max(every) / min(every) > 100:
        ax.set_yscale("log")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", ncol=2)
