"""Views of a metrics frame for reading and plotting: time and samples columns, smoothing, and the
reduction of many ranks to a median with a min-max band plus the ranks that stray from it.

Pure pandas/numpy over the frame ``Run.metrics()`` returns (one row per rank and logged step); the
dashboard, ``run.plot()``, ``workbench.compare`` and the exporters share these, so a smoothed curve
or an outlier rank is the same wherever it is shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from workbench.results.series import OUTLIER_MAD, Band, samples_seen  # noqa: F401 - re-exported

if TYPE_CHECKING:
    import pandas as pd

X_AXES = {"step": "step", "samples": "samples seen", "elapsed_s": "elapsed time (s)"}
"""The x axes a metrics plot offers: column -> axis label."""
BAND_ABOVE_RANKS = 8
"""With more ranks than this, plots draw the median and a min-max band, plus the outlier ranks."""


def add_derived(frame: pd.DataFrame, started: float | None, samples_per_step: int | None,
                batches: Sequence[tuple[int, int]] = ()) -> pd.DataFrame:
    """Add `wall_time` (timezone-aware datetime of `time`, which stays Unix seconds), `elapsed_s`
    (seconds since `started`, else since the first record) and `samples` (samples seen by all ranks
    together: step x effective batch, or by each stretch's batch where `batches` has a continue's
    change of it: series.samples_seen)."""
    if not len(frame) or "time" not in frame:
        return frame
    frame = frame.copy(deep=False)  # new columns on a shallow copy: the caller's frame is untouched, nothing copied
    seconds = frame["time"].astype(float)
    frame["wall_time"] = utc_datetimes(seconds)
    origin = started if started is not None else float(seconds.min())
    frame["elapsed_s"] = seconds - origin
    if batches and "step" in frame:
        frame["samples"] = samples_seen(frame["step"].to_numpy(), batches).astype("int64")
    elif samples_per_step and "step" in frame:
        frame["samples"] = frame["step"].astype("int64") * int(samples_per_step)
    return frame


SAFE_SECONDS = 9.2e9
"""Unix seconds within which every time has a datetime64[ns] (1678 to 2261)."""


def utc_datetimes(seconds: pd.Series) -> pd.Series:
    """Unix seconds as UTC datetimes, exactly as ``pd.to_datetime(seconds, unit="s", utc=True,
    errors="coerce")`` gives them (NaN and times past 2262: NaT), in a third of its time when every
    time is finite, in range and some has a fraction of a second (the engine's records: a million
    rows of them in a large run)."""
    import pandas as pd

    values = seconds.to_numpy(dtype=float)
    usual = np.isfinite(values).all() and (np.abs(values) < SAFE_SECONDS).all()
    whole = values.astype(np.int64) if usual else values  # toward zero, then the fraction to the ns: pandas' steps
    if not usual or (whole == values).all():  # NaN, out of range, or whole seconds only (pandas then gives us)
        return pd.to_datetime(seconds, unit="s", utc=True, errors="coerce")
    nanoseconds = whole * 1_000_000_000 + (np.round(values - whole, 9) * 1e9).astype(np.int64)
    return pd.Series(pd.DatetimeIndex(nanoseconds.view("M8[ns]")).tz_localize("UTC"), index=seconds.index)


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Exponential moving average as TensorBoard smooths (weight 0: none, 0.99: heavy), debiased so
    the first points are not pulled towards 0; NaNs are skipped (workbench.results.series.ema_from,
    which plots use on the full series)."""
    from workbench.results.series import ema_from

    values = np.asarray(values, dtype=float)
    if weight <= 0 or len(values) == 0:
        return values
    return ema_from(values, weight)[0]


def band(frame: pd.DataFrame, column: str, x: str = "step") -> Band:
    """Median, mean, min and max across ranks at each step (x: its value on axis `x`), and the
    outlier ranks (workbench.results.series.OUTLIER_MAD): the rule every plot of many ranks uses."""
    from workbench.results.series import BandCache, MetricData

    return BandCache()(MetricData.from_frame(frame), column, x)


def reduced_loss(frame: pd.DataFrame, x: str = "step", metric: str = "loss") -> pd.DataFrame:
    """The training loss `metric` reduced across ranks per logged step, as columns [x, "loss"]:
    loss_reduced as the lowest rank logged it (the engine's all-reduced `loss`: every rank logs the
    same value), else the mean of the ranks' values of `metric`."""
    if metric == "loss" and "loss_reduced" in frame and frame["loss_reduced"].notna().any():
        first = frame[frame["rank"] == frame["rank"].min()]
        return first[[x, "loss_reduced"]].dropna().rename(columns={"loss_reduced": "loss"})
    return frame.groupby(x)[metric].mean().dropna().rename("loss").reset_index()
