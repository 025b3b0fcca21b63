"""matplotlib figures from metrics DataFrames (no widgets)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PANELS = ("loss", "step_time_s", "samples_per_s", "mem_mb")
TITLES = {"loss": "loss per rank (dashed: reduced)", "step_time_s": "step time (s)",
          "samples_per_s": "samples/s per rank", "mem_mb": "memory (MiB)"}


def thin(frame: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most max_points evenly spaced rows of one rank's frame, always with the last."""
    n = len(frame)
    if n <= max_points:
        return frame
    stride = -(-n // max(1, max_points - 1))
    return frame.iloc[list(range(0, n - 1, stride)) + [n - 1]]


def downsample(frame: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most max_points rows per rank, evenly spaced, each rank's last row kept."""
    if len(frame) == 0 or "rank" not in frame or frame.groupby("rank").size().max() <= max_points:
        return frame
    import pandas as pd

    return pd.concat([thin(part, max_points) for _, part in frame.groupby("rank")]).sort_index()


def plot_loss(frame: pd.DataFrame, ax: Axes) -> None:
    for rank, part in frame.groupby("rank"):
        ax.plot(part["step"], part["loss"], lw=1, label=f"rank {rank}")
    if "loss_reduced" in frame:
        first = frame[frame["rank"] == frame["rank"].min()]
        ax.plot(first["step"], first["loss_reduced"], "k--", lw=1.5, label="reduced")
    ax.set_xlabel("step")
    ax.set_title(TITLES["loss"])
    ax.legend(fontsize="small")


def plot_per_rank(frame: pd.DataFrame, column: str, ax: Axes) -> None:
    for rank, part in frame.groupby("rank"):
        ax.plot(part["step"], part[column], lw=1, label=f"rank {rank}")
    ax.set_xlabel("step")
    ax.set_title(TITLES.get(column, column))


def plot_run(frame: pd.DataFrame, panels: Sequence[str] = PANELS, max_points: int = 2000,
             figsize: tuple[float, float] | None = None, fig: Figure | None = None, **_: Any) -> Figure:
    """Loss per rank with the reduced loss, then step time, throughput and memory per rank."""
    from matplotlib.figure import Figure

    fig = fig or Figure(figsize=figsize or (4.2 * len(panels), 3.2), layout="constrained")
    fig.clear()
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    data = downsample(frame, max_points)
    for ax, column in zip(axes, panels):
        if len(data) == 0 or column not in data:
            ax.set_title(f"{TITLES.get(column, column)}: no data yet")
        elif column == "loss":
            plot_loss(data, ax)
        else:
            plot_per_rank(data, column, ax)
    return fig


def save_run_plot(frame: pd.DataFrame, path: str, **kwargs: Any) -> str:
    save_figure(plot_run(frame, **kwargs), path)
    return path


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write `fig` as a private file (0600, workbench.private), in the format its suffix names."""
    from workbench.private import open_private

    with open_private(path, "wb") as fh:
        fig.savefig(fh, dpi=100, format=Path(path).suffix.lstrip(".") or "png")


SPLIT = (("data_time_s", "data wait"), ("compute_s", "compute"), ("comm_wait_s", "communication"))


def plot_scaling(frame: pd.DataFrame, figsize: tuple[float, float] = (10.0, 3.6)) -> Figure:
    """Measured scaling (from benchmark_scaling): speedup measured vs ideal vs the guides' expectation,
    and per world size the step split into data wait, compute and communication, efficiency on top."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    speed_ax, split_ax = fig.subplots(1, 2)
    _plot_speedup(frame, speed_ax)
    _plot_split(frame, split_ax)
    return fig


def _plot_speedup(frame: pd.DataFrame, ax: Axes) -> None:
    n = frame["world_size"]
    ax.plot(n, frame["ideal_speedup"], "k--", lw=1, label="ideal")
    ax.fill_between(n, frame["expected_low"], frame["expected_high"], color="tab:green", alpha=0.2)
    ax.plot(n, frame["expected_speedup"], "-", color="tab:green", lw=1, label="guides' rule of thumb")
    ax.plot(n, frame["speedup"], "o-", color="tab:blue", lw=2, label="measured")
    ax.set_xticks(list(n))
    ax.set_xlabel("world size (ranks)")
    ax.set_title(f"speedup over {int(n.iloc[0])} rank(s)")
    ax.legend(fontsize="small")


def _plot_split(frame: pd.DataFrame, ax: Axes) -> None:
    labels = [str(int(n)) for n in frame["world_size"]]
    bottom = [0.0] * len(frame)
    for column, name in SPLIT:
        values = frame[column].fillna(0).tolist() if column in frame else [0.0] * len(frame)
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, top, eff in zip(labels, bottom, frame["efficiency"]):
        ax.annotate(f"{eff:.0%}", (x, top), ha="center", va="bottom", fontsize="small")
    ax.set_xlabel("world size (ranks); label: scaling efficiency")
    ax.set_title("median step time (s)")
    ax.legend(fontsize="small")
