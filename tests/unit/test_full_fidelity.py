"""Full-fidelity drawing: a 20,000-step run folder (written as ranks write it, no processes) with a
one-step spike and a high first step, drawn at default settings from the M4 reduction and from every
point: the rasterised loss panels match within anti-aliasing, the spike and the first step are drawn,
and a zoom redraws from the full data."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.config import JobConfig
from workbench.launch.run import Run
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.writer import JsonlWriter

pytestmark = pytest.mark.timeout(300)
STEPS = 20_000
SPIKE_STEP, SPIKE = 12_345, 3.0


def spiky_run(tmp_path: Path, world: int = 2) -> Path:
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 8}, "dist": {"procs_per_node": world},
                               "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "spiky").prepare(cfg, "local", job_id=str(os.getpid()))
    t0 = time.time() - STEPS * 0.1
    rng = np.random.default_rng(0)
    for rank in range(world):
        writer = JsonlWriter(run.metrics(rank))
        noise = rng.normal(0, 0.01, STEPS)
        for i, step in enumerate(range(1, STEPS + 1)):
            loss = 0.08 + 0.5 * np.exp(-step / 400) + noise[i]
            if step == 1:
                loss = 1.26 - 0.1 * rank  # the high first step
            if step == SPIKE_STEP and rank == 1:
                loss = SPIKE  # one step, one rank
            writer.write({"rank": rank, "step": step, "time": t0 + 0.1 * step, "loss": float(loss),
                          "lr": 1e-3, "step_time_s": 0.1 + 0.01 * noise[i], "mem_mb": 800.0 + rank})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": STEPS, "time": time.time()})
    write_json_atomic(run.summary, {"status": "finished"})
    return run.root


def render(fig) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba()).copy()


def panel(image: np.ndarray, ax) -> np.ndarray:
    """The pixels inside the axes' frame (rows from the top, as the image)."""
    box = ax.bbox
    height = image.shape[0]
    return image[int(height - box.y1) + 2:int(height - box.y0) - 2, int(box.x0) + 2:int(box.x1) - 2]


def every_point(monkeypatch) -> None:
    """Draw every point: the reduction keeps all indices, the band all of its points."""
    from workbench.results import m4

    monkeypatch.setattr(m4, "m4_indices", lambda x, y, x0, x1, buckets: np.arange(len(x)))
    monkeypatch.setattr(m4, "band_envelope", lambda x, low, high, x0, x1, buckets: (x, low, high))


def test_reduced_and_full_loss_panels_rasterise_the_same_and_show_the_spike(tmp_path, monkeypatch):
    from workbench.results.plots import plot_run

    folder = spiky_run(tmp_path)
    run = Run.load(folder)
    frame, evals = run.metrics(), run.evals()
    reduced_fig = plot_run(frame, evals=evals)  # default settings: smoothed, raw faint behind, auto log-y
    reduced = render(reduced_fig)
    loss_ax = reduced_fig.axes[0]
    assert loss_ax.get_title(loc="left") == "training loss · loss"
    drawn = max(len(line.get_xdata()) for line in loss_ax.lines)
    assert drawn <= 4 * 2 * loss_ax.bbox.width + 4, drawn  # at most 4 points per bucket, 2 buckets per pixel

    with monkeypatch.context() as patch:
        every_point(patch)
        full_fig = plot_run(frame, evals=evals)
        full = render(full_fig)
        assert max(len(line.get_xdata()) for line in full_fig.axes[0].lines) == STEPS
    assert full.shape == reduced.shape
    a, b = panel(reduced, loss_ax).astype(int), panel(full, full_fig.axes[0]).astype(int)
    differ = np.abs(a - b).max(axis=2)  # 0-255 per pixel: anti-aliasing moves edges by a fraction of a pixel
    assert (differ > 85).mean() < 0.003, (differ > 85).mean()  # measured: 0.13%, faint edge pixels only
    assert (differ > 0).mean() < 0.10, (differ > 0).mean()  # measured: 5%, each by a few levels

    # the spike (rank 1, one step) and the high first step are drawn: pixels of rank 1's colour there
    for step, value in ((SPIKE_STEP, SPIKE), (1, 1.16)):
        x_px, y_px = loss_ax.transData.transform((step, value * 0.97))
        row = reduced.shape[0] - int(round(y_px))
        column = reduced[row - 3:row + 4, int(x_px) - 3:int(x_px) + 4, :3].astype(int)
        orange = np.array([255, 127, 14])  # rank 1's colour, faint (alpha 0.25) over white at least
        assert (np.abs(column - orange).sum(axis=2) < 260).any() or (column.sum(axis=2) < 700).any(), (step, column)


def test_a_zoom_redraws_from_the_full_data(tmp_path):
    from workbench.results.plots import plot_run

    run = Run.load(spiky_run(tmp_path))
    fig = plot_run(run.metrics())
    ax = fig.axes[0]
    render(fig)
    raw_rank_1 = next(line for line in ax.lines if line.get_label() == "_raw rank 1")
    assert SPIKE in raw_rank_1.get_ydata()
    ax.set_xlim(SPIKE_STEP - 50, SPIKE_STEP + 50)  # what the toolbar's zoom does
    render(fig)
    xs = raw_rank_1.get_xdata()
    inside = xs[(xs >= SPIKE_STEP - 50) & (xs <= SPIKE_STEP + 50)]
    assert len(inside) == 101 and SPIKE in raw_rank_1.get_ydata()  # every step in view: none reduced away


def test_m4_keeps_first_last_min_and_max_of_every_bucket():
    from workbench.results.m4 import band_envelope, m4_indices

    rng = np.random.default_rng(1)
    x = np.arange(100_000, dtype=float)
    y = rng.normal(size=x.size)
    y[54_321] = 40.0
    keep = m4_indices(x, y, 0.0, x[-1], 500)
    assert len(keep) <= 4 * 500 and keep[0] == 0 and keep[-1] == x.size - 1
    assert 54_321 in keep and y[keep].min() == y.min()
    bucket = np.minimum((x * 500 / x[-1]).astype(int), 499)
    for b in (0, 17, 499):  # per bucket: its first, last, min and max are kept
        members = np.flatnonzero(bucket == b)
        assert {members[0], members[-1], members[np.argmin(y[members])], members[np.argmax(y[members])]} <= set(keep)
    view = m4_indices(x, y, 1000.0, 2000.0, 500)  # a zoom: the point before and after the view are kept
    assert view[0] == 999 and view[-1] == 2001 and len(view) == 1003
    bx, low, high = band_envelope(x, y - 1, y + 1, 0.0, x[-1], 500)
    assert high.max() == 41.0 and low.min() == y.min() - 1 and len(bx) <= 2 * 502


def test_a_long_runs_per_rank_step_time_reads_as_a_level_per_rank_and_keeps_its_spike():
    """Per-rank step time of a 20,000-step run at default settings (issue 29 item 10: "a solid block").
    Rank 0 runs at 0.10 s, rank 1 at 0.11 s, each with 12 ms of noise per step, and rank 1 has one
    0.4 s step.  With the slider's 0.6 alone (2.5 points) the smoothed lines were as noisy as the raw
    ones: rank 1's covered rank 0's in most pixel columns.  Now each rank's line is its level (an EMA
    over >= 64 steps, said in the title), apart from the other's in every column, over a faint band
    that reaches every raw value: the spike is drawn."""
    import pandas as pd

    from workbench.results.m4 import M4Band, M4Line
    from workbench.results.plots import PlotOptions
    from workbench.ui.render import LiveFigure

    rng = np.random.default_rng(0)
    parts = []
    for rank in range(2):
        step_time = 0.10 + 0.01 * rank + rng.normal(0, 0.012, STEPS)
        if rank == 1:
            step_time[SPIKE_STEP - 1] = 0.4
        parts.append(pd.DataFrame({"rank": rank, "step": np.arange(1, STEPS + 1), "time": np.arange(STEPS) * 0.1,
                                   "step_time_s": step_time}))
    live = LiveFigure(width_px=960)  # the dashboard's figure (its canvas holds the pixels drawn)
    live.update(pd.concat(parts), None, PlotOptions(panels=("step_time_s",), theme="light"), live=False)
    ax, artists = live.axes[0], live.artists[0]
    assert ax.get_title(loc="left") == "step time (s) · EMA ≥64"
    assert [(type(a), a.get_label()) for a in artists.values()] == [
        (M4Band, "_raw rank 0"), (M4Line, "rank 0"), (M4Band, "_raw rank 1"), (M4Line, "rank 1")]
    assert artists["step_time_s/rank 1/raw"].full[2].max() == 0.4  # the band reaches the spike

    pixels = np.asarray(live.canvas.buffer_rgba())[..., :3].astype(int)
    height = pixels.shape[0]
    x0, y0, x1, y1 = (int(v) for v in ax.bbox.extents)
    panel = pixels[height - y1 + 2:height - y0 - 2, x0 + 2:x1 - 2]
    blue, orange = ((np.abs(panel - np.array(c)).sum(axis=2) < 60) for c in ((31, 119, 180), (255, 127, 14)))
    both = [j for j in range(panel.shape[1]) if blue[:, j].any() and orange[:, j].any()]
    assert len(both) > 0.95 * panel.shape[1], len(both)  # measured before: rank 0's line showed in 226 of 822
    assert all(np.flatnonzero(orange[:, j]).max() < np.flatnonzero(blue[:, j]).min() for j in both)  # 0.11 above
    x_px, y_px = ax.transData.transform((SPIKE_STEP, 0.38))
    row = height - int(round(y_px))
    near = pixels[row - 2:row + 3, int(x_px) - 2:int(x_px) + 3]
    tinted = (near[..., 0] > near[..., 1] + 40) & (near[..., 0] > near[..., 2] + 80)  # orange over white: not grey
    assert tinted.any(), near  # rank 1's colour, faint (measured: 255, 203, 158)
