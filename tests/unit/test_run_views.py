"""One state shown everywhere (progress line, rate, ETA, "starting"), the derived metric columns and
the views plots share (smoothing, median band, outliers).  Run folders are written by hand, as the
ranks write them; no rank processes."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
import pandas as pd
import pytest

from tests.support import REPO
from tests.support.runs import run_folder
from workbench.launch.run import Run
from workbench.launch.status import RankStatus, RunStatus, step_rate
from workbench.runfolder.layout import write_json_atomic
from workbench.runfolder.writer import JsonlWriter

pytestmark = pytest.mark.timeout(60)




def test_one_progress_line_for_dashboard_show_and_run(tmp_path, capsys):
    from workbench.cli import main
    from workbench.ui.dashboard import progress_text
    from workbench.ui.state import read_state

    run = run_folder(tmp_path)
    JsonlWriter(run.events(0)).write({"event": "start", "rank": 0, "time": time.time(), "total_steps": 200,
                                      "effective_batch": 16})
    handle = Run.load(run.root)
    status = handle.status()
    line = status.progress_line()
    assert line.startswith("running · step 50/200 (25%) · 10 steps/s · ETA 0:00:15"), line
    state = read_state(handle, max_points=100)
    assert state.line == line
    assert "running</b> · step 50/200 (25%) · 10 steps/s · ETA 0:00:15" in progress_text(state)
    main(["show", str(run.root)])
    assert line in capsys.readouterr().out


def test_rate_is_steady_with_one_late_rank_and_bursty_writes():
    base = pd.DataFrame({"step": range(10, 2010, 10), "time": [100.0 + i for i in range(200)]})
    frames = {0: base, 1: base.assign(time=base["time"] + 0.3), 2: base.iloc[:-3]}  # rank 2 a bit behind
    assert step_rate(frames) == pytest.approx(10.0)
    # records written in bursts (two at once every 2 s): the window keeps the rate at 10 steps/s
    bursty = base.assign(time=[100.0 + 2 * (i // 2) for i in range(200)])
    rates = [step_rate({0: bursty.iloc[:n]}) for n in range(20, 200)]
    assert min(rates) > 8.5 and max(rates) < 11.5, (min(rates), max(rates))


def test_eta_is_unknown_before_a_rate_and_zero_when_done():
    ranks = [RankStatus(0, "starting")]
    assert RunStatus("running", ranks, 0, 100).progress_line() == "running · step 0/100 (0%) · ETA unknown"
    assert RunStatus("finished", ranks, 0, None).progress_line() == "finished · no step logged"  # a script's
    assert RunStatus("finished", ranks, 80, 100, steps_per_s=3.0).progress_line() == \
        "finished · step 80/100 (100%) · 3 steps/s"




def test_a_stalled_run_says_how_long_at_which_step_and_who_holds_it_up_never_a_rate():
    """Issue 28: a run whose ranks stalled read "running · ... · 44.4 steps/s · ETA 0:12:00" for
    minutes.  Its line says the stall instead: the longest time without progress, the step, and the
    ranks that hold the others up (stuck outside a collective, or silent), with where they are."""
    stuck = RankStatus(1, "running", 9, 1.0, stalled=True, stalled_s=44.2, where="train.py:42 in loss_fn")
    waiting = RankStatus(0, "running", 9, 1.0, stalled=True, stalled_s=45.3, where="train.py:80 in step",
                         waiting=True)
    status = RunStatus("running", [waiting, stuck], 9, 32000, steps_per_s=44.4)
    line = "stalled 45 s at step 9/32000 (0%): rank 1 at train.py:42 in loss_fn; rank 0 waits in a collective"
    assert status.stalled and status.stall_line() == line and status.progress_line() == line
    assert "steps/s" not in line and "ETA" not in line

    # only waiting ranks (the one they wait for is not stalled yet): each named where it waits
    both = RunStatus("running", [waiting, dataclasses.replace(stuck, waiting=True)], 9, None, steps_per_s=44.4)
    assert both.progress_line() == ("stalled 45 s at step 9: rank 0 waiting in a collective at train.py:80 in step; "
                                    "rank 1 waiting in a collective at train.py:42 in loss_fn")
    # a silent rank (no heartbeat: SIGSTOP, or hung with all its threads) holds up the others too
    silent = RankStatus(1, "running", 9, 35.4, silent=True)
    assert RunStatus("running", [waiting, silent], 9, 32000, steps_per_s=44.4).progress_line() == (
        "stalled 45 s at step 9/32000 (0%): rank 1 not answering (no heartbeat for 35 s: stopped or hung); "
        "rank 0 waits in a collective")
    assert RunStatus("running", [RankStatus(0, "running", 9, 1.0), silent], 9, 100).progress_line() == (
        "stalled 35 s at step 9/100 (9%): rank 1 not answering (no heartbeat for 35 s: stopped or hung)")
    # the flight recorder's collective, where the waiting ranks' statuses have it
    recorded = dataclasses.replace(waiting, collective="all_reduce #19")
    assert RunStatus("running", [recorded, stuck], 9, None).progress_line() == (
        "stalled 45 s at step 9: rank 1 at train.py:42 in loss_fn; rank 0 waits in all_reduce #19")
    assert RunStatus("running", [recorded, dataclasses.replace(stuck, waiting=True, collective="barrier #19")], 9,
                     None).progress_line() == ("stalled 45 s at step 9: rank 0 waiting in all_reduce #19 at "
                                               "train.py:80 in step; rank 1 waiting in barrier #19 at train.py:42 "
                                               "in loss_fn")
    # moving again, or over: the usual line
    assert not RunStatus("running", [RankStatus(0, "running", 9, 1.0)], 9, 100).stall_line()
    ended = RunStatus("failed", [waiting, stuck], 9, 32000, steps_per_s=44.4)
    assert not ended.stalled and ended.progress_line() == "failed · step 9/32000 (0%) · 44.4 steps/s"


def test_the_stall_a_rank_writes_is_the_one_every_view_shows(tmp_path, capsys):
    """The rank's heartbeat writes that it stalled, since when and where (its status file); the status
    computes the seconds and the line once; `workbench show`, the dashboard and `workbench run`'s
    follow loop print that line."""
    from workbench.cli import main
    from workbench.cli.printing import ProgressPrinter
    from workbench.engine.monitor import RankMonitor
    from workbench.ui.dashboard import progress_text
    from workbench.ui.state import read_state

    run = run_folder(tmp_path, steps=9)
    monitor = RankMonitor(run, 1, 2, stall_after_s=5)
    monitor.state, monitor.step, monitor._heartbeat_s = "running", 9, 1e9  # no CPU use counts as work here
    began = time.time() - 40  # its last step, 40 s ago
    monitor._watch_progress(began)  # seen at a heartbeat then
    monitor._watch_hang(began)
    monitor._watch_progress(began + 30)
    monitor._watch_hang(began + 30)  # where it stands: this test's own frame (the user's code here)
    monitor.write_status()
    monitor.close()
    assert monitor.stalled and run.stacks(1).exists()

    handle = Run.load(run.root)
    status = handle.status()
    rank = status.ranks[1]
    assert rank.stalled and not rank.waiting and rank.stalled_s >= 30
    assert rank.where.endswith("in test_the_stall_a_rank_writes_is_the_one_every_view_shows"), rank.where
    line = status.progress_line()
    assert line.startswith("stalled ") and f" s at step 9: rank 1 at {rank.where}" in line, line
    assert "steps/s" not in line and "ETA" not in line

    state = read_state(handle)
    assert state.line.startswith("stalled ") and state.stall == state.line
    assert "<b>‖ stalled " in progress_text(state) and "rank 1 at " in progress_text(state)
    main(["show", str(run.root)])
    assert "rank 1 at " in capsys.readouterr().out

    printer = ProgressPrinter()
    printer.say_stall(status, 100.0)
    printer.say_stall(status, 110.0)  # said when it starts, not every poll
    printer.say_stall(status, 100.0 + printer.STALL_EVERY_S)
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 2 and all(text.startswith("[workbench] stalled ") for text in said), said
    printer.say_stall(dataclasses.replace(status, ranks=[]), 200.0)  # moving again: nothing to say
    assert capsys.readouterr().out == "" and printer.stall_said_at is None


def test_metrics_give_wall_time_elapsed_and_samples_and_keep_time(tmp_path):
    run = run_folder(tmp_path, world=2, steps=20, grad_accum_steps=3)
    frame = Run(run.root).metrics()
    assert {"time", "wall_time", "elapsed_s", "samples"} <= set(frame.columns)
    assert frame["time"].dtype == float  # Unix seconds, as before
    assert str(frame["wall_time"].dtype).startswith("datetime64") and str(frame["wall_time"].dt.tz) == "UTC"
    assert (frame["wall_time"].astype("int64") // 10**9 == frame["time"].astype("int64")).all()
    created = json.loads(run.meta.read_text())["created"]  # the run folder's birth
    assert np.allclose(frame["elapsed_s"], frame["time"] - created)
    assert frame.loc[frame["step"] == 10, "samples"].tolist() == [10 * 8 * 3 * 2] * 2


def test_ema_band_and_outliers():
    from workbench.results.metricview import band, ema

    values = np.array([1.0, 3.0, np.nan, 3.0])
    smoothed = ema(values, 0.5)
    assert smoothed[0] == 1.0 and np.isfinite(smoothed).all() and smoothed[-1] < 3.0
    assert (ema(values, 0.0)[[0, 1, 3]] == values[[0, 1, 3]]).all()
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"rank": np.repeat(range(16), 100), "step": np.tile(range(100), 16),
                          "loss": rng.random(1600)})
    frame.loc[frame["rank"] == 11, "loss"] += 3.0
    found = band(frame, "loss")
    assert found.outliers == [11] and len(found.x) == 100
    assert (found.low <= found.median).all() and (found.median <= found.high).all()


def tensorboard_ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing as its frontend computes it (debiased EMA, the weight per point,
    non-finite values skipped: their output repeats the last smoothed value)."""
    last, debias, out = 0.0, 0.0, []
    for value in values:
        if np.isfinite(value):
            last, debias = last * weight + (1 - weight) * value, debias * weight + (1 - weight)
        out.append(last / debias if debias else float("nan"))
    return out


def test_smoothing_is_tensorboards_ema_per_point_whatever_the_length_and_however_it_grows():
    """One rule: the weight applies per logged point (TensorBoard's); the value at a step depends only
    on the values up to it, so it is the same for a 200- or 20,000-step series and a live curve
    smoothed a refresh at a time equals the whole series smoothed at once."""
    from workbench.results.metricview import ema
    from workbench.results.panels import Views, _line_specs
    from workbench.results.series import Smoother

    rng = np.random.default_rng(1)
    values = rng.normal(1.0, 0.3, 20_000)
    values[[5, 700, 12_345]] = np.nan
    for weight in (0.6, 0.9, 0.99):
        whole = ema(values, weight)
        assert np.allclose(whole, tensorboard_ema(values.tolist(), weight), rtol=1e-9, atol=1e-12, equal_nan=True)
        assert np.allclose(ema(values[:200], weight), whole[:200], rtol=1e-12)  # the length does not matter
        smoother, grown = Smoother(), None
        for end in (3, 64, 65, 1000, 1010, 5000, 20_000):  # refreshes: a few points, then many
            grown = smoother("loss", values[:end], weight)
        assert np.allclose(grown, whole, rtol=1e-9, equal_nan=True)
    specs = _line_specs("loss", np.arange(20_000.0), values, "rank 0", {}, 0.6, Views())  # what a plot draws
    assert np.allclose(specs[1].y, tensorboard_ema(values.tolist(), 0.6), rtol=1e-9, equal_nan=True)


# --- plots ---------------------------------------------------------------------------------------
def sixteen_ranks(steps: int = 600, ranks: int = 16) -> pd.DataFrame:
    step = np.tile(np.arange(1, steps + 1), ranks)
    rank = np.repeat(np.arange(ranks), steps)
    loss = 0.3 + 2.2 * np.exp(-step / 200) + 0.05 * np.sin(step * 12.9 + rank * 78.2) + 1.5 * (rank == 13)
    return pd.DataFrame({"rank": rank, "step": step, "time": 1e9 + 0.1 * step, "loss": loss,
                         "loss_reduced": 0.3 + 2.2 * np.exp(-step / 200), "lr": 1e-3, "step_time_s": 0.1,
                         "samples_per_s": 320.0, "mem_mb": 800.0 + rank, "samples": step * 256,
                         "elapsed_s": 0.1 * step})


def test_many_ranks_draw_a_median_band_and_the_outlier_not_one_line_each():
    from workbench.results.plots import plot_run, rank_colour

    fig = plot_run(sixteen_ranks(), x="samples")
    loss_ax = fig.axes[0]
    assert loss_ax.get_legend_handles_labels()[1] == ["min-max of 16 ranks", "median", "reduced (all ranks)"]
    outlier = [line for line in loss_ax.lines if line.get_gid() == "rank 13"]
    assert len(outlier) == 1 and outlier[0].get_color() == rank_colour(13)
    assert [t.get_text() for t in loss_ax.texts] == ["rank 13"]  # named at its line's end
    assert {ax.get_xlabel() for ax in fig.axes} == {"", "samples seen"}  # on the bottom row; x is shared
    assert all(ax.get_shared_x_axes().joined(ax, loss_ax) for ax in fig.axes)
    assert max(line.full_x.max() for line in loss_ax.lines) == 600 * 256
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == ["training loss · loss", "learning rate (lr)", "step time (s)", "samples/s per rank",
                      "peak memory (MiB)"]  # only panels with data: no evals, no validation panel
    assert [text.get_text() for text in fig.legends[0].get_texts()][:3] == ["min-max of 16 ranks", "median",
                                                                           "reduced (all ranks)"]
    few = plot_run(sixteen_ranks(ranks=3), ranks=(0, 2))
    shown = [line.get_label() for line in few.axes[0].lines if not line.get_label().startswith("_")]
    assert shown == ["rank 0", "rank 2", "reduced (all ranks)"]


def test_smoothing_keeps_the_raw_series_faint_behind_and_log_y_applies_to_loss():
    from workbench.results.plots import plot_run

    frame = sixteen_ranks(ranks=2)
    evals = pd.DataFrame({"step": [200, 400, 600], "val_loss": [1.0, 0.6, 0.5], "val_accuracy": [0.5, 0.7, 0.8]})
    fig = plot_run(frame, evals=evals, smooth=0.9, log_y=True)
    loss_ax, val_ax = fig.axes[:2]
    raw, smooth = loss_ax.lines[0], loss_ax.lines[1]
    assert raw.get_alpha() == 0.25 and raw.get_label().startswith("_") and smooth.get_label() == "rank 0"
    assert np.std(np.diff(smooth.get_ydata())) < np.std(np.diff(raw.get_ydata()))
    assert loss_ax.get_yscale() == "log" and fig.axes[3].get_yscale() == "linear"
    assert [line.get_label() for line in val_ax.lines] == ["val_loss", "val_accuracy"]
    assert val_ax.get_title(loc="left") == "validation · val_loss, val_accuracy"


def test_defaults_are_readable_smoothed_loss_log_y_past_a_decade_and_only_logged_panels():
    """A function or script run logs train_loss (and maybe its own metrics): the panels are named
    after them; the loss is smoothed at TensorBoard's 0.6 with the raw series behind; log-y is on
    when the loss spans more than a decade and off when it does not."""
    from workbench.results.plots import plot_run

    step = np.arange(1, 3001)
    frame = pd.DataFrame({"rank": 0, "step": step, "train_loss": 2.5 * np.exp(-step / 300) + 0.01,
                          "accuracy": 1 - np.exp(-step / 500)})
    fig = plot_run(frame)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == ["training loss · train_loss", "accuracy"]
    loss_ax = fig.axes[0]
    assert loss_ax.get_yscale() == "log"  # 2.5 -> 0.01: more than a decade
    assert [line.get_label() for line in loss_ax.lines] == ["_raw rank 0", "rank 0"]
    assert loss_ax.lines[0].get_alpha() == 0.25 and loss_ax.lines[1].get_alpha() is None
    flat = plot_run(frame.assign(train_loss=0.5 + 0.01 * np.sin(step)))
    assert flat.axes[0].get_yscale() == "linear"
    assert plot_run(frame, log_y=False).axes[0].get_yscale() == "linear"  # asked: linear
    nothing = plot_run(pd.DataFrame())
    assert nothing.axes == [] and nothing.texts[0].get_text() == "no metrics logged yet"


def test_one_loss_of_zero_leaves_log_y_on_and_is_said_not_drawn():
    """A 20,000-step run logged loss == 0.0 once (step 6366): log-y went off for the whole run, even with
    "y: log" picked (issue 29).  Now the choice is made on the positive values and the 0 is left out,
    counted in a note inside the panel (a figure drawn once; in the title it ran into the next panel's)
    and on the dashboard's range line (a live one)."""
    from workbench.results.plots import options, plot_run
    from workbench.ui.plotview import range_html
    from workbench.ui.render import LiveFigure

    step = np.arange(1, 20_001)
    loss = 2.5 * np.exp(-step / 3000) + 0.01
    loss[6365] = 0.0
    frame = pd.DataFrame({"rank": 0, "step": step, "loss": loss})
    for log_y in (None, True):
        ax = plot_run(frame, log_y=log_y).axes[0]
        assert ax.get_yscale() == "log", log_y
        notes = [t.get_text() for t in ax.texts if t.get_gid() == "wb-not-drawn"]
        assert notes == ["1 value <= 0 not drawn on log y"] and ax.get_title(loc="left") == "training loss · loss"
        assert ax.get_ylim()[0] > 0
    linear = plot_run(frame, log_y=False).axes[0]
    assert linear.get_yscale() == "linear" and not linear.texts
    assert plot_run(frame.assign(loss=0.0)).axes[0].get_yscale() == "linear"  # nothing positive: nothing to log
    live = LiveFigure()
    live.update(frame, None, options())
    found = live.view_range()
    assert live.axes[0].get_yscale() == "log" and found.not_drawn == ((live.panels[0].title, 1),)
    assert "1 value &lt;= 0 not drawn on log y" in range_html(found)
    live.update(frame.assign(loss=np.abs(loss) + 0.01), None, options())  # the data without it: no note
    assert live.view_range().not_drawn == () and "not drawn" not in range_html(live.view_range())


def test_a_figure_shows_itself_in_a_fresh_notebook_without_pyplot():
    from workbench.results.plots import plot_run

    fig = plot_run(sixteen_ranks(ranks=2, steps=50))
    assert fig._repr_png_().startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_options_name_the_field_and_the_fix():
    from workbench.results.plots import plot_run

    frame = sixteen_ranks(ranks=2, steps=50)
    with pytest.raises(ValueError, match="smooth: 1.5 is not an EMA weight; give 0 .raw. to 0.999"):
        plot_run(frame, smooth=1.5)
    with pytest.raises(ValueError, match="x: 'epochs' is not one of step, samples, elapsed_s"):
        plot_run(frame, x="epochs")
    with pytest.raises(ValueError, match="plot option 'colour' is not one of"):
        plot_run(frame, colour="red")


def test_dark_theme_figure_has_dark_background_and_light_text():
    from workbench.results.plots import plot_run

    fig = plot_run(sixteen_ranks(ranks=2), theme="dark")
    assert fig.get_facecolor()[:3] < (0.2, 0.2, 0.2)
    title = fig.axes[0].title if fig.axes[0].get_title() else fig.axes[0]._left_title
    assert sum(matplotlib_rgb(title.get_color())) > 2.4
    with pytest.raises(ValueError, match="theme: 'blue' is not one of light, dark"):
        plot_run(sixteen_ranks(ranks=2), theme="blue")


def matplotlib_rgb(colour):
    from matplotlib.colors import to_rgb

    return to_rgb(colour)


def test_metrics_plot_controls_hover_and_remembered_choices(tmp_path, monkeypatch):
    from workbench.ui.plotview import MetricsPlot, parse_ranks

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert parse_ranks("all") is None and parse_ranks("0-2, 7") == (0, 1, 2, 7)
    with pytest.raises(ValueError, match="ranks: 'x' is not a rank or a range"):
        parse_ranks("1,x")
    plot = MetricsPlot(frame=sixteen_ranks(ranks=2))
    assert plot.live.full_draws == 1 and plot.opts.smooth == 0.6 and plot.opts.log_y is None  # the defaults
    plot.x.value = "elapsed_s"
    assert plot.live.fig.axes[-1].get_xlabel() == "elapsed time (s)"
    plot.ranks.value = "1,x"
    assert "not a rank" in plot.note.value
    plot.ranks.value = "1"
    ax = plot.live.fig.axes[0]
    assert [line.get_label() for line in ax.lines if not line.get_label().startswith("_")] == \
        ["rank 1", "reduced (all ranks)"]

    class Event:  # the pointer over the loss panel at elapsed 30 s (step 300)
        inaxes, xdata = ax, 30.0

    plot._on_hover(Event)
    hover = plot.hover.value
    assert "training loss · loss at elapsed time (s) 30" in hover, hover
    assert "rank 1 <b>" in hover and "reduced (all ranks) <b>" in hover and "(raw " in hover  # every series
    ax.set_xlim(10, 20)  # a zoom: the values read were under the pointer before it (issue 29 item 10)
    assert "<b>" not in plot.hover.value
    plot._on_hover(Event)
    assert "<b>" in plot.hover.value
    plot.live.axes[0].set_xlim(*plot.live.axes[0].get_xlim())  # no change: it stays
    assert "<b>" in plot.hover.value
    plot.ranks.value = "0,1"  # another rank filter: so is rank 1's value
    assert "<b>" not in plot.hover.value
    plot.smooth.value = 0.8
    plot.log_y.value = "linear"
    saved = tmp_path / "config" / "workbench" / "plot.json"
    assert json.loads(saved.read_text()) == {"x": "elapsed_s", "log_y": False, "smooth": 0.8}  # no run: no ranks
    assert saved.stat().st_mode & 0o777 == 0o600 and saved.parent.stat().st_mode & 0o777 == 0o700
    again = MetricsPlot(frame=sixteen_ranks(ranks=2))  # the next dashboard starts from them, every rank shown
    assert (again.opts.x, again.opts.log_y, again.opts.smooth, again.opts.ranks) == ("elapsed_s", False, 0.8, None)
    assert again.ranks.value == "all" and again.log_y.value == "linear" and again.shown.value == ""
    saved.write_text("{not json")
    assert MetricsPlot(frame=sixteen_ranks(ranks=2)).opts.smooth == 0.6  # a damaged file: the defaults


def test_the_memory_axis_starts_at_zero_so_one_mib_is_no_leak():
    """Peak memory 500 MiB that grows by 1 MiB filled the panel's height like a leak (issue 29 item 10):
    its axis starts at 0, in the figure drawn once and in the live one; the loss panel still fits its data."""
    from workbench.results.plots import options, plot_run
    from workbench.ui.render import LiveFigure

    step = np.arange(1, 2001)
    frame = pd.DataFrame({"rank": 0, "step": step, "loss": 2.0 - step / 2000, "mem_mb": 500.0 + (step > 1000)})
    fig = plot_run(frame)
    live = LiveFigure()
    live.update(frame, None, options())
    for axes in (fig.axes, live.axes):
        memory = next(ax for ax in axes if ax.get_title(loc="left") == "peak memory (MiB)")
        low, high = memory.get_ylim()
        assert low <= 0 and 501 <= high < 600, (low, high)
        assert axes[0].get_ylim()[0] > 0.5  # the loss is not drawn from zero


def test_a_flat_memory_series_is_drawn_inside_its_panel():
    """Every step at about the same peak (315 MiB, a small model on CPU): run.plot() autoscaled the axis to a
    sliver around 315 before it was stretched down to 0, so the line lay on the panel's top edge, unseen (a
    fresh-clone walk of notebook 01); both figures leave room above it."""
    from workbench.results.plots import options, plot_run
    from workbench.ui.render import LiveFigure

    frame = pd.DataFrame({"rank": np.repeat([0, 1], 40), "step": np.tile(np.arange(1, 41), 2),
                          "loss": 1.0, "mem_mb": np.repeat([315.08, 314.66], 40)})
    live = LiveFigure()
    live.update(frame, None, options())
    for axes in (plot_run(frame).axes, live.axes):
        memory = next(ax for ax in axes if ax.get_title(loc="left") == "peak memory (MiB)")
        low, high = memory.get_ylim()
        assert low <= 0 and 315 * 1.03 <= high < 400, (low, high)


def test_the_live_legend_keeps_left_of_the_toolbar():
    """ipympl's toolbar (228 px at the top right, shown while the pointer is on the figure) covered the
    legend's last entry (issue 29 item 10): the live figure's legend ends left of it, at any width."""
    from workbench.ui.plotview import MetricsPlot
    from workbench.ui.render import TOOLBAR_PX

    for ranks, width in ((2, 960), (16, 960), (2, 700)):
        plot = MetricsPlot(frame=sixteen_ranks(ranks=ranks), remember=False)
        plot.live.set_width(width)
        fig = plot.live.fig
        legend = fig.legends[0].get_window_extent(fig.canvas.get_renderer())
        assert fig.bbox.width == width and legend.x0 >= 0 and legend.x1 <= width - TOOLBAR_PX, (ranks, legend)
        top = max(ax.get_position().y1 for ax in fig.axes) * fig.bbox.height
        assert legend.y0 >= top, "the legend's rows stay above the panels"


def test_a_rank_filter_and_a_smoothing_stay_with_the_run_they_were_chosen_on(tmp_path, monkeypatch):
    """A rank filter typed once hid rank 1 in every later dashboard of every run, with nothing saying so;
    smoothing 0.97 carried onto a 23-step run (issue 29)."""
    from workbench.ui.plotview import MetricsPlot

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    first = MetricsPlot(frame=sixteen_ranks(ranks=2, steps=900), key="/runs/a")
    first.ranks.value = "0"
    first.smooth.value = 0.97
    assert first.opts.ranks == (0,) and "showing rank 0 of 2" in first.shown.value  # said beside the figure
    other = MetricsPlot(frame=sixteen_ranks(ranks=2, steps=900), key="/runs/b")
    assert other.opts.ranks is None and other.ranks.value == "all" and other.shown.value == ""
    assert other.opts.smooth == 0.97  # taste: a long run gets the smoothing last chosen
    short = MetricsPlot(frame=sixteen_ranks(ranks=2, steps=23), key="/runs/c")
    assert short.opts.smooth == 0.6 and short.smooth.value == 0.6
    assert "smoothing 0.97 (remembered) averages over more points than this run has (23): 0.6 here" in \
        short.shown.value
    live = MetricsPlot(frame=pd.DataFrame(), key="/runs/d")  # a live run at step 0 of 20,000: its total counts
    live.show(sixteen_ranks(ranks=2, steps=30), total_steps=20_000)
    assert live.opts.smooth == 0.97 and live.shown.value == ""
    back = MetricsPlot(frame=sixteen_ranks(ranks=2, steps=23), key="/runs/a")  # its own choices come back
    assert (back.opts.ranks, back.opts.smooth, back.ranks.value) == ((0,), 0.97, "0")


def test_the_range_line_says_what_data_is_shown_never_axis_limits():
    from workbench.results.series import MetricData
    from workbench.ui.plotview import MetricsPlot, range_html

    plot = MetricsPlot(frame=pd.DataFrame(), remember=False)
    assert "no data yet" in plot.view.value and "0 – 1" not in plot.view.value
    plot.show(sixteen_ranks(ranks=2, steps=900))
    assert "step 1 – 900: all data (x is linked across panels)" in plot.view.value
    plot.live.axes[0].set_xlim(-500, 300)  # a pan past the start: the line says the data, not -500
    assert "step 1 – 300 of 1 – 900 (zoomed" in plot.view.value and "-500" not in plot.view.value
    assert all(ax.get_xlim() == (-500, 300) for ax in plot.live.axes)  # linked across panels
    assert "no data yet" in range_html(plot.live.view_range().__class__("step", None, None, False))
    assert MetricData({}).extent("step") is None


def test_a_6000_step_and_a_16_rank_run_are_readable_at_1100_px():
    """Saved for a person to look at (test-artifacts/); asserted: loss still visible after 3% of the
    run with log-y and smoothing, and the figure is 1100 px wide."""
    from workbench.results.plots import plot_run

    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    long = sixteen_ranks(steps=6000, ranks=2)
    long["loss"] = 0.05 + 3.0 * np.exp(-long["step"] / 150) + 0.02 * np.sin(long["step"] * 0.37 + long["rank"])
    for name, frame, options in (("plot-6000-steps.png", long, {"log_y": True, "smooth": 0.9}),
                                 ("plot-16-ranks.png", sixteen_ranks(steps=2000), {"smooth": 0.6}),
                                 ("plot-16-ranks-dark.png", sixteen_ranks(steps=2000), {"theme": "dark"})):
        fig = plot_run(frame, **options)
        fig.savefig(artifacts / name, dpi=100)
        assert fig.get_figwidth() * 100 <= 1110
    low, high = fig.axes[0].get_ylim()
    assert high / max(low, 1e-9) > 1


def test_the_plot_follows_jupyterlabs_saved_theme(tmp_path, monkeypatch):
    from workbench.ui.plotview import lab_theme

    monkeypatch.setenv("JUPYTERLAB_SETTINGS_DIR", str(tmp_path))
    assert lab_theme() == "light"  # nothing saved: JupyterLab's default
    path = tmp_path / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    path.parent.mkdir(parents=True)
    path.write_text('{\n  // the user picked it in Settings > Theme\n  "theme": "JupyterLab Dark"\n}')
    assert lab_theme() == "dark"
    path.write_text("{not json")
    assert lab_theme() == "light"


def test_a_rank_that_differs_from_ranks_in_exact_agreement_is_an_outlier():
    from workbench.results.metricview import band

    frame = pd.DataFrame({"rank": np.repeat(range(12), 50), "step": np.tile(range(50), 12), "step_time_s": 0.1})
    frame.loc[frame["rank"] == 5, "step_time_s"] = 0.12
    found = band(frame, "step_time_s")
    assert found.outliers == [5] and (found.high == 0.1).all()
    assert band(frame[frame["rank"] != 5], "step_time_s").outliers == []


def test_the_live_straggler_verdict_and_the_finished_runs_verdict_agree(tmp_path):
    from workbench.launch.status import RunStatus

    run = run_folder(tmp_path, world=2, steps=60)
    for rank, comm in ((0, 0.04), (1, 0.001)):  # rank 1 does more work per step; rank 0 waits for it
        writer = JsonlWriter(run.metrics(rank))
        for step in range(61, 3000):
            writer.write({"rank": rank, "step": step, "time": 2e9 + step, "loss": 1.0, "step_time_s": 0.1,
                          "comm_wait_s": comm, "data_time_s": 0.0})
        writer.close()
    handle = Run.load(run.root)
    live = handle.health(RunStatus("running"))["stragglers"]  # over 2,000 evenly spaced steps per rank
    final = handle.health(RunStatus("finished"))["stragglers"]  # over every record
    assert list(live) == list(final) == [1] == Run.load(run.root).stragglers()["rank"].tolist()
    assert handle.report()["stragglers"]["rank"].tolist() == [1]


# --- one clock, downloads, figures that show themselves ---------------------------------------------
def test_one_refresh_shows_one_snapshot_progress_badges_range_and_curves_agree(tmp_path, monkeypatch):
    """Heartbeats run ahead of the records (rank 0 says step 1018, its last record is 1014): the
    progress line, the badges, the range line and the curves all give the snapshot's logged steps."""
    from workbench.ui.dashboard import Dashboard, badges_html

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    run = run_folder(tmp_path, world=2, steps=1000)
    for rank, last in ((0, 1014), (1, 1010)):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1001, last + 1):
            writer.write({"rank": rank, "step": step, "time": time.time(), "loss": 0.01, "lr": 1e-3})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "running", "step": last + 8, "time": time.time()})
    JsonlWriter(run.events(0)).write({"event": "start", "rank": 0, "time": time.time(), "total_steps": 2000,
                                      "effective_batch": 16})
    dash = Dashboard(Run.load(run.root), autostart=False)
    state = dash.refresh()
    assert [(b.rank, b.step) for b in state.badges] == [(0, 1014), (1, 1010)]
    assert state.step == 1010 and state.line.startswith("running · step 1010/2000 (50%)")
    assert "rank 0: running @ 1014" in badges_html(state) and "step 1010/2000" in dash.eta.value
    assert "step 1 – 1,014: all data" in dash.plot.view.value
    last = dash.plot.live.last_x()
    assert last["loss/rank 0"] == 1014 and last["loss/rank 1"] == 1010 and max(last.values()) == 1014


def test_a_refresh_sends_its_figure_before_the_lines_that_describe_it(tmp_path, monkeypatch):
    """A draw takes seconds on a loaded machine.  In Chromium, two dashboards at load 6, the first one's
    lines said "finished · step 128/128" and "step 1 – 128: all data" over a figure that still showed one
    point of rank 1 (issue 29 item 9): the lines went to the page before the figure they describe.  Now the
    figure's image is sent first, then the progress line, the badges and the range line."""
    from ipympl.backend_nbagg import Canvas

    from workbench.ui.dashboard import Dashboard

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    sent: list[str] = []
    monkeypatch.setattr(Canvas, "send_binary", lambda self, data: sent.append("figure"))
    run = run_folder(tmp_path, world=2, steps=40)
    dash = Dashboard(Run.load(run.root), autostart=False)
    dash.refresh()
    for name, widget in (("progress", dash.eta), ("badges", dash.badges), ("range", dash.plot.view)):
        widget.observe(lambda _, name=name: sent.append(name), names="value")
    for last in (60, 80):  # a full draw (the limits grow), then whatever the next refresh draws
        for rank in range(2):
            writer = JsonlWriter(run.metrics(rank))
            for step in range(last - 19, last + 1):
                writer.write({"rank": rank, "step": step, "time": time.time(), "loss": 0.05, "lr": 1e-3})
            writer.close()
        sent.clear()
        dash.refresh()
        assert {"figure", "progress", "badges", "range"} <= set(sent), sent
        assert sent.index("figure") < min(sent.index(n) for n in ("progress", "badges", "range")), sent
        assert f"step 1 – {last}: all data" in dash.plot.view.value and f"step {last}" in dash.eta.value


def test_two_dashboards_of_one_handle_each_draw_one_snapshot_while_the_files_grow(tmp_path, monkeypatch):
    """Two dashboards open on one Run (issue 29 item 9: the second's range line read step 23 while its
    progress line read 146).  Mid-way through the first one's read, the ranks append records and the
    second dashboard refreshes from its own thread: it waits for the first snapshot to end, and neither
    dashboard draws curves of one read under the progress line of another."""
    import threading

    from workbench.results.series import MetricData
    from workbench.ui.dashboard import Dashboard

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    run = run_folder(tmp_path, world=2, steps=40)
    handle = Run.load(run.root)
    first, second = Dashboard(handle, autostart=False), Dashboard(handle, autostart=False)
    polled = threading.Event()
    original = handle.metric_frames.poll
    handle.metric_frames.poll = lambda: (original(), polled.set())[0]
    grown, read = [], MetricData.from_run

    def read_while_the_files_grow(run_, evals=None):  # inside the first dashboard's snapshot, once
        if not grown:
            grown.append(threading.Thread(target=second.refresh))
            for rank in range(2):
                writer = JsonlWriter(run.metrics(rank))
                for step in range(41, 61):
                    writer.write({"rank": rank, "step": step, "time": time.time(), "loss": 0.05, "lr": 1e-3})
                writer.close()
            polled.clear()
            grown[0].start()
            polled.wait(1.0)  # the second dashboard's poll: not before this snapshot ends
        return read(run_, evals)

    monkeypatch.setattr(MetricData, "from_run", staticmethod(read_while_the_files_grow))
    state = first.refresh()
    grown[0].join(timeout=30)
    assert state.step == 40 and "step 40" in first.eta.value and "step 1 – 40: all data" in first.plot.view.value
    later = second.state
    assert later.step == 60 and "step 60" in second.eta.value and "step 1 – 60: all data" in second.plot.view.value
    state = first.refresh()  # nothing new to read (the second took it): the first still draws what it shows
    assert state.step == 60 and "step 60" in first.eta.value and "step 1 – 60: all data" in first.plot.view.value
    assert first.plot.live.last_x()["loss/rank 0"] == second.plot.live.last_x()["loss/rank 0"] == 60


def test_a_dashboard_whose_kernel_is_gone_says_so_from_the_page_alone(tmp_path, monkeypatch):
    """After a kernel restart the old dashboard stayed at "running · ETA 0:01:28" with "0s ago" badges and a
    live-looking Cancel (issue 29 item 3).  The page has no kernel to ask then: the note and the hidden
    Cancel hang on the class ipywidgets gives every view of a restarting kernel (the browser test
    restarts one)."""
    from workbench.ui.dashboard import GONE_CSS, Dashboard, gone_html

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    run = run_folder(tmp_path, world=2, steps=50)
    dash = Dashboard(Run.load(run.root), autostart=False)
    assert "wb-dashboard" in dash.widget._dom_classes and "wb-cancel" in dash.cancel_button._dom_classes
    assert dash.widget.children[1] is dash.gone  # under the progress line it freezes
    assert "it never read the run" in dash.gone.value
    before = time.time()
    dash.refresh()
    note = dash.gone.value
    assert note.startswith(GONE_CSS) and "<div class='wb-gone'" in note
    assert ".wb-gone{display:none}" in GONE_CSS and ".jupyter-widgets-disconnected .wb-gone{display:block}" in GONE_CSS
    assert ".wb-dashboard.jupyter-widgets-disconnected .wb-cancel" in GONE_CSS
    shown = [time.strftime("%H:%M:%S", time.localtime(t)) for t in range(int(before), int(time.time()) + 1)]
    assert any(f"from its last refresh at {t}" in note for t in shown), (shown, note)  # that refresh's time
    assert f"workbench.Run.load(&#x27;{run.root}&#x27;).dashboard()" in note
    assert f"workbench follow {run.root}" in note and "the run itself goes on without the kernel" in note
    assert "ends with the kernel that made the pool" in gone_html(run.root, None, pool=True)
    ended = gone_html(run.root, time.time(), ended="finished")  # a finished run's dashboard: no "goes on"
    assert "the run had ended (finished)" in ended and "goes on" not in ended and f"workbench show {run.root}" in ended


def test_downloads_are_served_by_the_jupyter_server_not_carried_in_the_page(tmp_path, monkeypatch):
    from workbench.ui.dashboard import Dashboard, download_html, files_url

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    run = run_folder(tmp_path, world=2, steps=50)
    exported = Run.load(run.root).export_metrics()
    assert files_url(exported) is None  # no Jupyter server known: the path is said instead
    assert "outside the folder the Jupyter server serves" in download_html(exported)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "jpserver-1.json").write_text(json.dumps(
        {"root_dir": str(tmp_path), "base_url": "/lab-base/", "pid": os.getppid(), "url": "http://127.0.0.1:1/"}))
    dash = Dashboard(Run.load(run.root), autostart=False)
    dash.download("csv")
    link = dash.download_link.value
    assert "href='/lab-base/files/run/exports/metrics.csv'" in link and "data:" not in link
    assert "download='metrics.csv'" in link and str(exported) in link
    dash.download("csv")  # again, the same file: a new link, which the page follows once (one click)
    assert dash.download_link.value != link and "data-wb-n='2'" in dash.download_link.value
    assert all("wb-download-button" in button._dom_classes for button in dash.downloads.values())


def test_compare_and_plot_show_themselves_in_a_fresh_notebook(tmp_path):
    """In a kernel where pyplot was never imported, IPython shows a bare Figure as `<Figure size ...>`;
    these figures give a PNG."""
    from IPython.core.formatters import DisplayFormatter

    import workbench
    from tests.support.runs import write_run

    first = write_run(tmp_path, "a", 1, "none")
    second = write_run(tmp_path, "b", 2, "linear")
    shown = DisplayFormatter().format(workbench.compare([first, second]))[0]
    assert shown["image/png"].startswith(b"\x89PNG") if isinstance(shown["image/png"], bytes) else shown["image/png"]
    assert "image/png" in DisplayFormatter().format(Run.load(first).plot())[0]


def test_the_cli_plot_draws_the_evals(tmp_path, capsys):
    """`workbench follow` of a finished run writes plots/loss.png with its validation panel."""
    from PIL import Image

    from tests.support.runs import write_run
    from workbench.cli import main
    from workbench.results.panels import EVAL_COLOURS

    folder = write_run(tmp_path, "evals", 2, "none")
    main(["follow", str(folder)])
    assert "per-rank plot" in capsys.readouterr().out
    image = np.asarray(Image.open(folder / "plots" / "loss.png").convert("RGB")).astype(int)
    teal = np.array([int(EVAL_COLOURS[0][i:i + 2], 16) for i in (1, 3, 5)])  # val_accuracy's colour
    assert (np.abs(image - teal).sum(axis=2) < 30).sum() > 20


def test_wall_time_is_exactly_pandas_to_datetime_on_the_fast_path_and_beside_it():
    from workbench.results.metricview import utc_datetimes

    rng = np.random.default_rng(3)
    usual = pd.Series(np.r_[1.7e9 + rng.random(50_000) * 5e4, 0.0, -5.5, -1e9 - 0.123456789, 1.999999999999,
                            9.1e9, -9.1e9, 123.4567891234])
    odd = pd.Series([1.7e9, np.nan, 1e11, -np.inf, 1.7e9 + 0.5])  # NaN, past 2262, -inf: NaT (pandas' own path)
    whole = pd.Series([1.7e9, 0.0, -3.0])  # whole seconds: pandas gives microseconds
    for seconds in (usual, odd, whole, usual.iloc[:0]):
        expected = pd.to_datetime(seconds, unit="s", utc=True, errors="coerce")
        pd.testing.assert_series_equal(utc_datetimes(seconds), expected)


def test_the_end_plot_is_drawn_from_the_follow_loops_reader_with_fixed_margins_nothing_cut_or_overlapping(tmp_path):
    """The CLI's plots/loss.png: drawn in the background from the records the follow loop read (no
    second read of the metrics), laid out with fixed margins: every panel's tick labels and title
    inside the figure and clear of the other panels."""
    import threading

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    from tests.support.runs import write_run
    from workbench.cli.printing import EndPlot
    from workbench.results.plots import plot_run
    from workbench.runfolder.reader import MetricTail

    folder = write_run(tmp_path, "ended", 2, "none", steps=300)
    run = Run.load(folder)
    status = run.latest_status = run.status(True)  # the follow loop's poll: every record read
    reads = []
    real = MetricTail.read_batches
    MetricTail.read_batches = lambda tail: reads.append(threading.current_thread().name) or real(tail)
    try:
        plot = EndPlot(run)
        plot.when_ready(status)
        plot._drawing.join(timeout=60)
    finally:
        MetricTail.read_batches = real
    assert plot.drawn == str(run.dir.loss_plot) and "workbench-end-plot" not in reads
    assert plot.result(run, run.metrics()) == plot.drawn  # nothing came after it: not drawn again
    assert Image.open(plot.drawn).size[0] == 1100 and (os.stat(plot.drawn).st_mode & 0o777) == 0o600
    wide = sixteen_ranks(ranks=2).assign(samples_per_s=123456.7, lr=lambda f: 1e-5 * f["step"], mem_mb=81234.5)
    for frame in (sixteen_ranks(ranks=2), sixteen_ranks(ranks=16), wide):
        fig = plot_run(frame, evals=run.evals(), fixed_layout=True)
        FigureCanvasAgg(fig).draw()
        assert fig.get_layout_engine() is None and len(fig.axes) == 6
        assert_laid_out(fig)


def assert_laid_out(fig) -> None:
    """Every panel's tick labels and title inside the figure and clear of the other panels, the
    legend inside the figure above them, a title clear of its axis' offset text ("1e5")."""
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]
    for i, (ax, box) in enumerate(zip(fig.axes, boxes)):
        title = ax.get_title(loc="left")
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, title
        for other in fig.axes[:i] + fig.axes[i + 1:]:
            assert not box.overlaps(other.bbox), (title, other.get_title(loc="left"))
        offset = ax.yaxis.offsetText
        if offset.get_text():
            assert not ax._left_title.get_window_extent(renderer).overlaps(offset.get_window_extent(renderer))
    legend = fig.legends[0].get_window_extent(renderer)
    assert not any(legend.overlaps(box) for box in boxes), legend
    assert page.x0 <= legend.x0 and legend.x1 <= page.x1 and legend.y1 <= page.y1, legend


def test_the_live_figure_fits_its_panels_and_legend_at_any_width():
    """The dashboard's figure (fixed margins, no constrained layout): 8 ranks' legend of 11 entries
    wraps to the width; nothing is cut or drawn over another panel, at 600 and 1000 px."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    from workbench.results.plots import PlotOptions
    from workbench.ui.render import LiveFigure

    frame = sixteen_ranks(ranks=8).assign(val_loss=lambda f: np.where(f["step"] % 100 == 0, 1 / f["step"], np.nan))
    for width in (600, 1000):
        live = LiveFigure(width_px=width)
        live.update(frame, None, PlotOptions())
        assert not isinstance(live.fig.get_layout_engine(), ConstrainedLayoutEngine)
        assert len(live.fig.legends[0].get_texts()) == 11
        assert_laid_out(live.fig)


def test_the_widgets_pictures_are_the_figures_pixels_full_then_the_changed_ones():
    """The ipympl canvas sends the figure as a PNG (zlib level 1): whole at first, then only the pixels
    a refresh changed; decoded, they rebuild exactly what the figure drew."""
    import io

    from PIL import Image

    from workbench.results.plots import PlotOptions
    from workbench.ui.render import LiveFigure

    frame = sixteen_ranks(steps=600, ranks=2)
    live = LiveFigure(interactive=True, width_px=800)
    live.update(frame[frame["step"] <= 300], None, PlotOptions())  # the canvas now has the figure's size
    sent: list[tuple[str, bytes]] = []
    live.canvas.send_binary = lambda data: sent.append((live.canvas._current_image_mode, data))  # what goes out
    live.canvas._force_full = True  # as a view that (re)connects asks
    live._full_draw()
    mode, data = sent[-1]
    first = np.asarray(Image.open(io.BytesIO(data)))
    assert mode == "full" and np.array_equal(first, np.asarray(live.canvas.get_renderer().buffer_rgba()))
    assert live.update(frame[frame["step"] <= 320], None, PlotOptions()) == "lines"
    mode, data = sent[-1]
    diff = np.asarray(Image.open(io.BytesIO(data)))
    now = np.asarray(live.canvas.get_renderer().buffer_rgba())
    changed = diff.view(np.uint32).squeeze(2) != 0
    assert mode == "diff" and changed.any() and np.array_equal(np.where(changed[..., None], diff, first), now)


@pytest.mark.timeout(60)
def test_two_dashboards_drawing_at_once_each_draw_in_their_own_theme_and_leave_the_kernels_settings_alone():
    """Two dashboards' poll threads draw at once, one light and one dark: matplotlib's rcParams are one
    global, so each themed draw holds it whole (without that, 396 of 400 draws here saw the other's colours)."""
    import threading
    import time

    import matplotlib

    from workbench.results.plots import THEMES, theme_rc

    key = "figure.facecolor"
    before = matplotlib.rcParams[key]
    wrong: list[str] = []

    def draw(theme: str) -> None:
        for _ in range(100):
            with theme_rc(theme):
                time.sleep(0.0005)  # the draw
                if matplotlib.rcParams[key] != THEMES[theme][key]:
                    wrong.append(theme)

    threads = [threading.Thread(target=draw, args=(theme,)) for theme in THEMES]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and matplotlib.rcParams[key] == before
