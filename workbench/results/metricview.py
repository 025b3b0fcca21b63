"""Views of a metrics frame for reading and plotting: time and samples columns, smoothing, and the
reduction of many ranks to a median with a min-max band plus the ranks that stray from it.

Pure pandas/numpy over the frame ``Run.metrics()`` returns (one row per rank and logged step); the
dashboard, ``run.plot()``, ``workbench.compare`` and the exporters share these, so a smoothed curve
or an outlier rank is the same wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

X_AXES = {"step": "step", "samples": "samples seen", "elapsed_s": "elapsed time (s)"}
"""The x axes a metrics plot offers: column -> axis label."""
BAND_ABOVE_RANKS = 8
"""With more ranks than this, plots draw the median and a min-max band, plus the outlier ranks."""
OUTLIER_MAD = 4.0
"""A rank is an outlier when its mean distance from the median exceeds this many median distances."""


def add_derived(frame: pd.DataFrame, started: float | None, samples_per_step: int | None) -> pd.DataFrame:
    """Add `wall_time` (timezone-aware datetime of `time`, which stays Unix seconds), `elapsed_s`
    (seconds since `started`, else since the first record) and `samples` (samples seen by all ranks
    together: step x effective batch)."""
    import pandas as pd

    if not len(frame) or "time" not in frame:
        return frame
    frame = frame.copy(deep=False)  # new columns on a shallow copy: the caller's frame is untouched, nothing copied
    seconds = frame["time"].astype(float)
    frame["wall_time"] = pd.to_datetime(seconds, unit="s", utc=True, errors="coerce")  # a time past 2262: NaT
    origin = started if started is not None else float(seconds.min())
    frame["elapsed_s"] = seconds - origin
    if samples_per_step and "step" in frame:
        frame["samples"] = frame["step"].astype("int64") * int(samples_per_step)
    return frame


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Exponential moving average as TensorBoard smooths (weight 0: none, 0.99: heavy), debiased so
    the first points are not pulled towards 0 (pandas' ewm with adjust=True); NaNs are skipped."""
    import pandas as pd

    values = np.asarray(values, dtype=float)
    if weight <= 0 or len(values) == 0:
        return values
    return pd.Series(values).ewm(alpha=1 - weight, adjust=True, ignore_na=True).mean().to_numpy()


@dataclass
class Band:
    """Many ranks as one picture: x, the median across ranks, min and max of the ranks that agree, and
    the ranks that stray (drawn on their own)."""

    x: np.ndarray
    median: np.ndarray
    low: np.ndarray
    high: np.ndarray
    outliers: list[int]


def wide(frame: pd.DataFrame, column: str, x: str = "step") -> tuple[np.ndarray, list[int], np.ndarray]:
    """(grid, ranks, table): one row per x of the grid (the x values of the rank with the most rows),
    one column per rank; another rank's value goes to the grid point at or after its x (NaN where a
    rank logged nothing).  Plain numpy: 64 ranks x 2,000 points take a few ms."""
    xs = frame[x].to_numpy(float)
    rank_of = frame["rank"].to_numpy()
    ranks, column_of = np.unique(rank_of, return_inverse=True)
    longest = np.bincount(column_of).argmax()
    grid = np.unique(xs[column_of == longest])
    table = np.full((len(grid), len(ranks)), np.nan)
    row = np.minimum(np.searchsorted(grid, xs), len(grid) - 1)
    table[row, column_of] = frame[column].to_numpy(float)
    return grid, [int(r) for r in ranks], table


def band(frame: pd.DataFrame, column: str, x: str = "step") -> Band:
    """Median, min and max across ranks at each x, and the outlier ranks (by OUTLIER_MAD)."""
    import warnings

    grid, ranks, values = wide(frame, column, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: steps no rank logged yet
        full = not np.isnan(values).any()  # the usual case: np.median, not the slow masked nanmedian
        median = np.median(values, axis=1) if full else np.nanmedian(values, axis=1)
        distance = np.nanmean(np.abs(values - median[:, None]), axis=0)
        typical = float(np.nanmedian(distance)) if len(distance) else 0.0
        # when the ranks agree exactly (a constant column), any rank that differs at all strays
        limit = OUTLIER_MAD * typical if typical > 0 else 1e-9 * (float(np.nanmean(np.abs(median))) + 1e-12)
        stray = np.isfinite(distance) & (distance > limit)
        inliers = values[:, ~stray] if (~stray).any() else values
        low, high = np.nanmin(inliers, axis=1), np.nanmax(inliers, axis=1)  # the band: the ranks that agree
    return Band(grid, median, low, high, [r for r, s in zip(ranks, stray) if s])


def reduced_loss(frame: pd.DataFrame, x: str = "step") -> pd.DataFrame:
    """The loss reduced across ranks per logged step: loss_reduced as the lowest rank logged it (every
    rank logs the same value), else the mean of the ranks' losses."""
    if "loss_reduced" in frame and frame["loss_reduced"].notna().any():
        first = frame[frame["rank"] == frame["rank"].min()]
        return first[[x, "loss_reduced"]].dropna().rename(columns={"loss_reduced": "loss"})
    return frame.groupby(x)["loss"].mean().reset_index()
