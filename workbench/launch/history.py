"""Run history and comparison: every run folder under a root as one table, and several runs' training
loss and validation metrics on one figure with the config fields that differ between them.

    workbench.runs()                                      # one row per run folder under runs/
    workbench.compare(["runs/a", "runs/b"], x="samples")  # Figure: loss, val metrics, config diff
    workbench.config_diff(["runs/a", "runs/b"])           # the differing config fields, one column per run

Everything is read through ``Run.load`` (status, metrics, events, config), so a run listed here says
what ``workbench show`` and its dashboard say.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from workbench.config.sections import flatten
from workbench.config.tasknames import runs_own_code
from workbench.errors import ArgumentError
from workbench.launch.status import TERMINAL
from workbench.runfolder.layout import RunDir, run_folders_in

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from workbench.launch.run import Run

RunLike = Union["Run", str, os.PathLike]
COLUMNS = ["name", "folder", "status", "start", "end", "duration_s", "world_size", "effective_batch", "lr",
           "lr_from", "base_lr", "scaled_lr", "rule", "steps", "total_steps", "loss_metric", "last_loss", "best_loss"]
WHOLE = ("world_size", "effective_batch", "steps", "total_steps")
"""Columns of whole numbers: integers (pandas' Int64, missing shown as <NA>), never floats."""
LR_NAMES = ("lr", "learning_rate", "train/learning_rate", "lr-SGD", "lr-Adam", "lr-AdamW")
"""The learning rate, by the names jobs log it under (engine, Hugging Face, Lightning's LearningRateMonitor)."""
_ROWS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
"""folder -> (its files' sizes and times, its row): an ended run's row, kept in this process too."""


def default_root() -> Path:
    """WORKBENCH_RUN_ROOT when set (the notebooks and tests use it), else the config default runs/."""
    from workbench.config.sections import JobConfig

    return Path(os.environ.get("WORKBENCH_RUN_ROOT") or JobConfig().launch.run_root).expanduser()


def run_folders(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Run folders (holding run.json) under `root`, two levels deep (benchmark_scaling nests its runs),
    oldest first, as absolute paths (what `Run.folder` is for a submitted run)."""
    base = (Path(root).expanduser() if root is not None else default_root()).resolve()
    found = run_folders_in(base)
    return sorted(found, key=lambda p: (p.stat().st_mtime if p.exists() else 0.0, str(p)))


def runs(root: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """One row per run folder under `root` (default: WORKBENCH_RUN_ROOT or runs/):

    name, folder (absolute, as `Run.folder`), status, start and end (UTC datetimes), duration_s,
    world_size, effective_batch (the job's; empty for a function or script, whose batches are its own),
    lr: the learning rate the job used (lr_from says how it is known: "logged", the highest lr the job
    logged; "scaled", the config's lr scaled to the world size, for a config job that logged none;
    empty for a function or script that logged none, whose lr is its own), base_lr and scaled_lr (the
    config's train.lr and its value after scaling.rule, config jobs only), rule, steps, total_steps,
    loss_metric (the training loss the job logged: loss, train_loss, ...), last_loss and best_loss
    (that metric reduced across ranks), and the last validation metrics (val_* columns).  Whole numbers
    are integers.  An ended run is read once: its row is kept in its folder (row.json) and in this
    process, and read again only when a file it was read from changes (a resume, a restart); a running
    run is read live."""
    import pandas as pd

    rows = cached_rows(run_folders(root))
    frame = pd.DataFrame(rows)
    if not len(frame):
        return pd.DataFrame(columns=COLUMNS)
    val = sorted(c for c in frame.columns if c.startswith("val_"))
    frame = frame.reindex(columns=[*COLUMNS, *val])  # every column, also where no run has a value
    for column in ("start", "end"):
        frame[column] = pd.to_datetime(frame[column], unit="s", utc=True, errors="coerce")
    for column in WHOLE:
        frame[column] = frame[column].astype("Int64")
    return frame


ROW_VERSION = 1
"""The layout of a cached row file (RunDir.row_cache): another version is read as absent and rewritten."""
ROW_FILE = RunDir(".").row_cache.name
READ_FROM = ("metrics", "events", "status", "errors", "results", "procs", "stacks")
"""The folders whose files a row is read from (beside the run folder's own files): the signature a
cached row is valid for."""


READ_TOGETHER = 100
"""Run folders read afresh at a time, their small metrics files in one columnar read (reader.read_cold)."""
READ_TOGETHER_MIN = 16
"""Fewer fresh folders are read by their own polls unless polars is imported already (~0.2 s)."""


def cached_row(folder: Path) -> dict[str, Any]:
    """run_row(folder), or the row kept for an ended run while none of the files it was read from
    changed: from this process's memory, else from the run folder's row file (RunDir.row_cache), which
    is written when an ended run's row is read.  A run resumed or restarted in the folder changes
    run.json and its statuses, so its row is read again; a damaged row file is warned about once
    (DamagedFileWarning) and rewritten."""
    return cached_rows([folder])[0]


def cached_rows(folders: Sequence[Path]) -> list[dict[str, Any]]:
    """cached_row of each folder; those read afresh are loaded READ_TOGETHER at a time and their
    metrics files read together (what a first listing of many small runs costs)."""
    from workbench.runfolder.reader import read_cold

    found = [_kept_row(folder) for folder in folders]
    fresh = [i for i, (_, row) in enumerate(found) if row is None]
    for start in range(0, len(fresh), READ_TOGETHER):
        group = fresh[start:start + READ_TOGETHER]
        loaded = [_load(folders[i]) for i in group]
        if len(group) >= READ_TOGETHER_MIN or "polars" in sys.modules:  # a few folders: not worth importing polars
            read_cold([run.metric_frames for run in loaded if not isinstance(run, Exception)])
        for i, run in zip(group, loaded):
            signature = found[i][0]
            found[i] = (signature, _keep_row(folders[i], signature, run_row(folders[i], run)))
    return [row for _, row in found]  # type: ignore[misc]


def _kept_row(folder: Path) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
    """(the folder's signature, its kept row or None)."""
    key, signature = str(folder), _signature(folder)
    found = _ROWS.get(key)
    if found is not None and found[0] == signature:
        return signature, dict(found[1])
    row = _row_from_file(folder, signature)
    if row is not None and row.get("status") in TERMINAL:
        _ROWS[key] = (signature, dict(row))
    return signature, row


def _keep_row(folder: Path, signature: tuple[Any, ...], row: dict[str, Any]) -> dict[str, Any]:
    """An ended run's fresh row, kept in its folder and in this process."""
    if row.get("status") in TERMINAL:
        _write_row(folder, signature, row)
        _ROWS[str(folder)] = (signature, dict(row))
    return row


def _load(folder: Path) -> Run | Exception:
    from workbench.launch.run import Run

    try:
        return Run.load(folder, snapshot=True)  # the row is read once: run.json once, not at every look
    except Exception as exc:  # noqa: BLE001 - one unreadable folder must not hide the others (run_row says it)
        return exc


def _row_from_file(folder: Path, signature: tuple[Any, ...]) -> dict[str, Any] | None:
    """The row in the folder's row file if it was written for these very files (None: absent, for
    other files, or damaged: warned about once)."""
    from workbench.runfolder.records import read_object, warn_damaged

    path = RunDir(folder).row_cache
    if not path.exists():
        return None
    found = read_object(path)
    if found is None:
        return None  # damaged: read_object warned
    row, kept, version = found.get("row"), found.get("signature"), found.get("version")
    if type(version) is int and version != ROW_VERSION:
        return None  # another version's layout: read afresh, rewritten
    if version != ROW_VERSION or not isinstance(row, dict) or not isinstance(kept, list) or \
            not all(isinstance(entry, list) for entry in kept):
        warn_damaged(path, [(0, "not a run row (version, signature, row)")], once_key=(str(path), *_stat_of(path)))
        return None
    if tuple(tuple(entry) for entry in kept) != signature or row.get("status") not in TERMINAL:
        return None  # written for other files: the run went on, or was resumed
    return {**row, "folder": str(folder), "name": folder.name}  # the folder may have been moved or copied


def _write_row(folder: Path, signature: tuple[Any, ...], row: dict[str, Any]) -> None:
    """Keep an ended run's row in its folder (private, written atomically); a folder this user may
    not write (another's run on a shared filesystem) keeps none."""
    import contextlib

    from workbench.runfolder.layout import write_json_atomic

    with contextlib.suppress(OSError):
        write_json_atomic(RunDir(folder).row_cache,
                          {"version": ROW_VERSION, "signature": [list(e) for e in signature], "row": row})


def _signature(folder: Path) -> tuple[Any, ...]:
    """Name, size and change time of every file a row is read from: the run folder's own files (not
    its hidden temp and lock files, nor the row file) and those of its READ_FROM folders."""
    out: list[tuple[str, str, int, int]] = []
    for entry in _entries(folder):
        if entry.name.startswith(".") or entry.name == ROW_FILE:
            continue
        if entry.is_file(follow_symlinks=False):
            out.append(("", entry.name, *_stat(entry)))
        elif entry.name in READ_FROM and entry.is_dir(follow_symlinks=False):
            out.extend((entry.name, e.name, *_stat(e)) for e in _entries(entry) if e.is_file(follow_symlinks=False))
    return tuple(sorted(out))


def _stat_of(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


def _entries(folder: Path | os.DirEntry[str]) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            return list(found)
    except OSError:
        return []


def _stat(entry: os.DirEntry[str]) -> tuple[int, int]:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


def run_row(folder: Path, loaded: Run | Exception | None = None) -> dict[str, Any]:
    """The facts of one run folder (`loaded`: its Run, or why it could not be loaded, when the
    caller loaded it); a folder that cannot be read says why in `status`."""
    try:
        run = _load(folder) if loaded is None else loaded
        if isinstance(run, Exception):
            raise run
        status, _ = run.live_status()  # SLURM not answering: the run folder's state (the dashboard says why)
    except Exception as exc:  # noqa: BLE001 - one unreadable folder must not hide the others
        return {"name": folder.name, "folder": str(folder), "status": f"unreadable: {type(exc).__name__}: {exc}"}
    table = Columns(run.metric_frames.merged())
    times = table.numbers("time")
    times = times[~np.isnan(times)]
    created = run.meta.get("created")
    found = [float(t) for t in (created if isinstance(created, (int, float)) else None,
                                times.min() if len(times) else None) if t is not None]
    start = min(found) if found else None  # the folder's birth, or an earlier first record (a copied run)
    row: dict[str, Any] = {"name": folder.name, "folder": str(folder), "status": status.state, "start": start,
                           "steps": status.step, "total_steps": status.total_steps, "world_size": run.world_size,
                           **_plan(run, table), **_losses(table)}
    if len(times) and start is not None:
        row["end"] = float(times.max())
        row["duration_s"] = row["end"] - start
    row.update(_last_eval(run))
    return row


class Columns:
    """A run's metrics as RankFrames.merged() gives them (name -> numpy array, sorted by step then
    rank), read as the row needs them: the same answers as the DataFrame of those columns (missing
    is NaN or None), which is built only for a column of text or mixed values."""

    def __init__(self, columns: dict[str, Any]):
        self.columns = columns
        self._frame: pd.DataFrame | None = None

    def __len__(self) -> int:
        step = self.columns.get("step")
        return 0 if step is None else len(step)

    def names(self) -> list[str]:
        return [str(name) for name in self.columns]

    def frame(self) -> pd.DataFrame:
        if self._frame is None:
            import pandas as pd

            self._frame = pd.DataFrame(self.columns, copy=False)
        return self._frame

    def has(self, name: str) -> bool:
        """The column holds a value (pandas' notna().any())."""
        values = self.columns.get(name)
        if values is None or not len(values):
            return False
        if values.dtype.kind == "f":
            return not bool(np.isnan(values).all())
        if values.dtype.kind in "iub":
            return True
        return bool(self.frame()[name].notna().any())

    def numbers(self, name: str) -> Any:
        """The column as float64, missing or not a number NaN (pd_numbers); empty if there is none."""
        values = self.columns.get(name)
        if values is None:
            return np.empty(0)
        if values.dtype.kind in "fiub":
            return values.astype(np.float64)
        return pd_numbers(self.frame()[name])

    def max(self, name: str) -> float:
        """The column's largest value (pandas' max, missing skipped); has(name) must hold."""
        values = self.columns[name]
        if values.dtype.kind in "fiub":
            return float(np.nanmax(values.astype(np.float64)))
        return float(self.frame()[name].max())


def _last_eval(run: Run) -> dict[str, float]:
    """The val_* numbers of the run's last eval event (by time, as run.events() orders them), from the
    records themselves: a frame of every event per folder was a sixth of a first listing."""
    run.event_summary()
    evals = [r for r in run._events.records if r.get("event") == "eval"]
    if not evals:
        return {}
    untimed = [r for r in evals if not _is_time(r.get("time"))]  # sorted last, as pandas puts NaN
    last = untimed[-1] if untimed else max(reversed(evals), key=lambda r: r["time"])  # ties: the later one
    return {c: float(v) for c, v in last.items()
            if c.startswith("val_") and isinstance(v, (int, float)) and not isinstance(v, bool) and v == v}


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def own_code(run: Run) -> bool:
    """A function or script run (submit_fn, submit_script, workbench launch): its lr, batch and
    schedule are its own, not the config's."""
    if run.meta.get("function") or run.meta.get("script"):
        return True
    try:
        return runs_own_code(run.config.task.name)
    except (OSError, ValueError):
        return False


def _plan(run: Run, table: Columns) -> dict[str, Any]:
    """Effective batch and lr as the job used them: the logged lr where there is one, else the
    config's (base and scaled, labelled); nothing of the config for a function or script."""
    from workbench.config.scaling import scaled

    start = run.event_summary().start or {}
    logged = _logged_lr(table)
    row: dict[str, Any] = {"effective_batch": start.get("effective_batch"), "lr": logged,
                           "lr_from": "logged" if logged is not None else None}
    if own_code(run):
        return row
    try:
        cfg = run.config
    except (OSError, ValueError):
        return row
    plan = scaled(cfg, run.world_size)
    scaled_lr = start.get("lr", plan.lr)
    row.update(effective_batch=start.get("effective_batch", plan.effective_batch), base_lr=cfg.train.lr,
               scaled_lr=scaled_lr, rule=cfg.scaling.rule)
    if logged is None:
        row.update(lr=scaled_lr, lr_from="scaled")
    return row


def logged_lr(frame: pd.DataFrame) -> float | None:
    """The highest learning rate the job logged (its schedule's peak), None if it logged none."""
    return _logged_lr(Columns({str(c): frame[c].to_numpy() for c in frame.columns}))


def _logged_lr(table: Columns) -> float | None:
    for name in LR_NAMES:
        if table.has(name):
            return table.max(name)
    return None


def loss_metric(frame: pd.DataFrame) -> str | None:
    """The training loss the job logged: loss, train_loss, ... (workbench.results.panels.pick_loss,
    the rule the dashboard names its loss panel by)."""
    from workbench.results.panels import pick_loss

    return pick_loss([str(c) for c in frame.columns], lambda name: bool(frame[name].notna().any()))


def _losses(table: Columns) -> dict[str, Any]:
    """loss_metric, last_loss and best_loss: reduced_loss's series, read with numpy where the engine
    logged loss_reduced (boolean indexing of the frame was a quarter of a first listing)."""
    from workbench.results.metricview import reduced_loss
    from workbench.results.panels import pick_loss

    metric = pick_loss(table.names(), table.has) if len(table) else None
    if metric is None:
        return {}
    if metric == "loss" and "loss_reduced" in table.columns and "rank" in table.columns:
        values = table.numbers("loss_reduced")
        ranks = table.numbers("rank")
        kept = values[(ranks == np.nanmin(ranks)) & ~np.isnan(values)] if np.isfinite(ranks).any() else values[:0]
        if len(kept):
            return {"loss_metric": metric, "last_loss": float(kept[-1]), "best_loss": float(kept.min())}
    loss = reduced_loss(table.frame(), "step", metric)["loss"]
    if not len(loss):
        return {"loss_metric": metric}
    return {"loss_metric": metric, "last_loss": float(loss.iloc[-1]), "best_loss": float(loss.min())}


def pd_numbers(column: Any) -> Any:
    """A frame column as float64 numbers, missing ones NaN."""
    import pandas as pd

    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


# --- comparison ------------------------------------------------------------------------------------
def as_runs(items: RunLike | Iterable[RunLike]) -> list[Run]:
    from workbench.launch.run import Run

    if isinstance(items, (str, os.PathLike, Run)):
        items = [items]
    return [item if isinstance(item, Run) else Run.load(Path(item)) for item in items]


def config_diff(items: RunLike | Iterable[RunLike]) -> pd.DataFrame:
    """The config fields whose values differ between the runs (plus the world size and lr_used, the lr
    each job used as runs() gives it: the peak it logged, or train.lr scaled to its ranks), one column per
    run (named by its folder).  train.lr is the base lr, before the scaling rule."""
    import pandas as pd

    found = as_runs(items)
    flat = {run.folder.name: {**flatten(run.config.to_dict()), "world_size": run.world_size,
                              "lr_used": cached_row(run.folder).get("lr")} for run in found}
    table = pd.DataFrame(flat)
    differs = table.astype(str).nunique(axis=1) > 1
    return table[differs & ~table.index.isin(["launch.name", "launch.run_root"])]


def compare(items: RunLike | Iterable[RunLike], x: str = "samples", smooth: float = 0.6,
            labels: Sequence[str] | None = None, theme: str = "light",
            metrics: Sequence[str] | None = None) -> Figure:
    """Several runs on one figure: each run's training loss (the metric it logged: loss, train_loss,
    ..., reduced across ranks) and the validation metrics against `x` ("samples" seen, "step" or
    "elapsed_s"), smoothed (raw faint behind), and under them the config fields that differ.
    `metrics`: the eval metrics to draw (default: the first three any run logged, from its eval
    events or its records).  Comparing by samples seen asks the scaling guides' question: does the
    run at 4 ranks (and 4x the batch) converge like the 1-rank run per sample?"""
    from workbench.results.plots import RANK_COLOURS, PlotOptions, ShownFigure, theme_rc

    found = as_runs(items)
    names = list(labels) if labels is not None else [run.folder.name for run in found]
    data = [_compared(run) for run in found]
    evals = _eval_metrics(data, metrics)
    losses = [loss_metric(frame) if len(frame) else None for frame, _ in data]
    diff = config_diff(found)
    opts = PlotOptions(smooth=smooth, theme=theme)
    with theme_rc(theme):
        fig = ShownFigure(figsize=(11.0, 3.4 + 0.22 * (len(diff) + 2)), layout="constrained")  # shows itself
        grid = fig.add_gridspec(2, 1 + len(evals), height_ratios=[3.4, 0.22 * (len(diff) + 2)])
        loss_ax = fig.add_subplot(grid[0, 0])
        named = len({m for m in losses if m}) > 1  # runs logged different names: the legend says whose
        for i, (name, (frame, _), metric) in enumerate(zip(names, data, losses)):
            if metric is not None:
                label = f"{name} ({metric})" if named else name
                _compare_loss(loss_ax, frame, x, metric, RANK_COLOURS[i % len(RANK_COLOURS)], label, opts)
        shown = sorted({m for m in losses if m}, key=losses.index)
        _axis(loss_ax, "training loss (reduced)" + (" · " + ", ".join(shown) if shown else ""), x)
        for j, metric in enumerate(evals, start=1):
            ax = fig.add_subplot(grid[0, j])
            for i, (name, (_, points)) in enumerate(zip(names, data)):
                if metric in _evals_of(points):
                    spec = _eval_points(points, metric, x)
                    ax.plot(spec.x, spec.y, "o-", ms=3, color=RANK_COLOURS[i % len(RANK_COLOURS)], label=name)
            _axis(ax, metric, x)
        _diff_table(fig.add_subplot(grid[1, :]), diff, names)
    return fig


def _compared(run: Run) -> tuple[pd.DataFrame, Any]:
    """A run's metrics frame, and its metrics with its eval events as the dashboard's panels read them."""
    from workbench.results.series import MetricData

    frame = run.metrics()
    return frame, MetricData.from_frame(frame, run.evals())


def _evals_of(data: Any) -> list[str]:
    """The eval metrics one run logged: in its eval events, then eval-like columns of its records."""
    from workbench.results.panels import eval_columns

    events, records = eval_columns(data)
    return [*sorted(events), *records]


def _eval_metrics(data: list[tuple[pd.DataFrame, Any]], wanted: Sequence[str] | None) -> list[str]:
    """The eval metrics to draw: those asked for (each logged by some run, else one ValueError), or
    the first three (by name) the runs logged, in eval events or as eval-like columns of the records."""
    logged = sorted({c for _, points in data for c in _evals_of(points)})
    if wanted is None:
        return logged[:3]
    if isinstance(wanted, str):
        raise ArgumentError(f"metrics: give a list of eval metric names, e.g. [{wanted!r}]")
    missing = [m for m in wanted if m not in logged]
    if missing:
        raise ArgumentError(f"metrics: {missing[0]!r} was logged by none of the runs; "
                         f"they logged {', '.join(logged) or 'no eval metric'}")
    return list(wanted)


def _eval_points(data: Any, metric: str, x: str) -> Any:
    """The metric's points as the dashboard's validation panel draws them (eval events, else the
    lowest rank's records)."""
    from workbench.results.panels import Panel, _eval_specs

    return _eval_specs(Panel("val", (metric,), metric), data, data.axis(x))[0]


def _compare_loss(ax: Any, frame: pd.DataFrame, x: str, metric: str, colour: str, name: str, opts: Any) -> None:
    from workbench.results.metricview import reduced_loss
    from workbench.results.plots import _line

    column = x if x in frame else "step"
    loss = reduced_loss(frame, column, metric)
    _line(ax, loss[column].to_numpy(float), loss["loss"].to_numpy(float), colour, name, opts)


def _axis(ax: Any, title: str, x: str) -> None:
    from workbench.results.metricview import X_AXES

    ax.set_title(title, loc="left")
    ax.set_xlabel(X_AXES.get(x, x))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best")


DIFF_LABELS = {"train.lr": "train.lr (base)", "lr_used": "lr used (scaled)"}
"""The compare figure's words for the two lrs of its config table, as the runs and sweep views label them."""


def _diff_table(ax: Any, diff: pd.DataFrame, names: Sequence[str]) -> None:
    ax.axis("off")
    if not len(diff):
        ax.set_title("config: no field differs", loc="left")
        return
    cells = [[_short(v) for v in row] for row in diff.to_numpy()]
    headers = [wrap_name(n, max(12, 90 // max(1, len(names)))) for n in names]  # whole names, never cut
    rows = [DIFF_LABELS.get(str(name), str(name)) for name in diff.index]
    table = ax.table(cellText=cells, rowLabels=rows, colLabels=headers,
                     loc="upper center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    lines = max(h.count("\n") + 1 for h in headers)
    for col in range(len(headers)):  # a header of several lines gets their height
        table[0, col].set_height(table[0, col].get_height() * lines)
    ax.set_title("config fields that differ", loc="left")


def wrap_name(name: str, width: int) -> str:
    """`name` on lines of at most `width` characters, broken after a '-', '_' or '.' only (a part
    longer than `width` keeps its own line whole): a run name is never cut."""
    lines = [""]
    for part in re.findall(r"[^-_.]+[-_.]?|[-_.]", name):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def _short(value: Any, width: int = 18) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"
