"""A run's metrics out to the tools people already use, after the fact: TensorBoard event files (per
rank, readable by TensorBoard's own reader) and CSV or Parquet tables.  The live copies made while
training are the ranks' business (workbench.engine.mirrors, the `log` config section).

    run.to_tensorboard("tb/")             # tb/rank0, tb/rank1, ...: `tensorboard --logdir tb/`
    run.export_metrics("metrics.parquet") # or .csv
    workbench export RUN_DIR --tensorboard tb/
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import ArgumentError, NotWrittenError
from workbench.runfolder.layout import tensorboard_rank
from workbench.runfolder.private import make_dirs, own_folder, private_umask, replacing

if TYPE_CHECKING:
    from workbench.launch.run import Run

FORMATS = ("csv", "parquet")


def to_tensorboard(run: Run, logdir: str | Path) -> Path:
    """Write every rank's scalars (loss, loss_reduced, lr, timings, memory, ...) at their steps and
    wall times into `logdir`/rank{R}, and each rank's eval results into its own folder; returns `logdir`."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError("exporting to TensorBoard needs the tensorboard package: pip install tensorboard "
                          '(or pip install "workbench[tensorboard]")') from None
    logdir = make_dirs(logdir)  # 0700 where made, like a run folder; the files 0600 (private_umask)
    frame = run.metrics()
    with private_umask():
        _write_ranks(SummaryWriter, logdir, frame, run.evals())
    return logdir


def _write_ranks(writer_class: Any, logdir: Path, frame: Any, evals: Any) -> None:
    """Each rank's metrics and its own eval events into `logdir`/rank{R}, one writer a rank.  Every
    rank records an eval event (the all-reduced results, the same on each), as its live mirror logs
    them into its own folder; an event without a rank is rank 0's."""
    records: dict[int, list[dict[Any, Any]]] = {}
    for rank, part in (frame.groupby("rank") if len(frame) else []):
        rows = part.drop(columns=["wall_time", "elapsed_s", "samples"], errors="ignore").to_dict("records")
        records.setdefault(int(rank), []).extend(rows)
    if len(evals):
        columns = ["step", "time", *(str(c) for c in evals.columns if str(c).startswith("val_"))]
        ranks = evals["rank"].fillna(0).astype(int) if "rank" in evals else [0] * len(evals)
        for rank, part in evals.groupby(ranks):
            records.setdefault(int(rank), []).extend(part[columns].to_dict("records"))
    for rank, rows in records.items():
        folder = own_folder(logdir, tensorboard_rank(logdir, rank))  # no link followed
        _write(writer_class(log_dir=str(folder)), rows)


def _write(writer: Any, records: list[dict[Any, Any]]) -> None:
    from workbench.runfolder.records import scalars

    for record in records:
        step, walltime = int(record["step"]), float(record.get("time") or 0) or None
        for key, value in scalars({str(k): v for k, v in record.items()}).items():
            writer.add_scalar(key, value, step, walltime=walltime)
    writer.close()


def export_metrics(run: Run, path: str | Path | None = None, format: str | None = None) -> Path:
    """Every rank's metrics (Run.metrics(): with wall_time, elapsed_s, samples) as CSV or Parquet;
    the format follows the file name's suffix (default: <run>/exports/metrics.csv)."""
    fmt = (format or (Path(path).suffix.lstrip(".") if path else "csv")).lower()
    if fmt not in FORMATS:
        raise ArgumentError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}; name the file .csv or .parquet")
    target = Path(path) if path else run.dir.export(fmt)
    if not path and target.parent.is_symlink():  # the run's own exports/ leads elsewhere: not written there
        raise NotWrittenError(f"{target.parent}: a symbolic link, not the run's own folder: the workbench does "
                              "not write through it; remove it and try again")
    frame = run.metrics()
    if fmt != "csv":
        try:
            import pyarrow  # type: ignore[import-untyped]  # noqa: F401
        except ImportError:
            raise ImportError('Parquet needs pyarrow: pip install pyarrow (or pip install "workbench[parquet]"); '
                              "CSV needs nothing") from None
    # written beside the target and renamed over it (0600, its folder 0700 where made): a link in its
    # place is replaced, never written through (runfolder.private.replacing)
    try:
        with replacing(target, "w", newline="") if fmt == "csv" else replacing(target) as fh:
            if fmt == "csv":
                frame.to_csv(fh, index=False)
            else:
                frame.to_parquet(fh, index=False)
    except NotWrittenError:
        raise
    except OSError as exc:  # a read-only or full folder, a file in a folder's place: one line, not a traceback
        raise NotWrittenError(f"{target}: the metrics cannot be written there ({exc.strerror or exc}); give "
                              f"another path, e.g. run.export_metrics('metrics.{fmt}')") from exc
    return target
