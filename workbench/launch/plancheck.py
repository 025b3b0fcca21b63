"""run.plan(): the plan of a run next to what its ranks measured, per rank, and what missed.

Predicted: workbench.plan for the run's own config, factory (its payload.pkl, else task.name), world size,
strategy and device kind: the peak a rank holds (traced on fake tensors) and the step time (see
planning.plan).  Computed once, when first asked, and kept in the run folder (plan.json); the step's
prediction waits until the run has ended, since its probe would share the host with the run's ranks.
Measured: each rank's `memory` event (engine.memprobe: the first two steps' peak, by CUDA's
max_memory_allocated or on CPU torch's MemTracker on the real tensors) and its median step time after
the first steps (results.analysis.step_breakdown, the report's own).  A peak more than 10% off, or a step
more than 30% off, is a miss, said in one line each (the issue's goals, bench/plan_bench.py)."""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

from workbench.errors import ArgumentError

if TYPE_CHECKING:
    import pandas as pd

    from workbench.launch.run import Run

PEAK_MISS = 0.10
"""A measured peak further than this from the predicted one is a miss."""
STEP_MISS = 0.30
"""A measured step time further than this from the predicted one is a miss."""
COLUMNS = ["rank", "predicted_peak_mb", "measured_peak_mb", "peak_error", "predicted_step_s", "measured_step_s",
           "step_error"]


def check(run: Run, probe: bool = True, refresh: bool = False) -> pd.DataFrame:
    """One row per rank (COLUMNS; errors are measured / predicted - 1); attrs["misses"]: a line per miss,
    attrs["notes"]: how each side was had.  Computes the prediction when the run folder has none (or
    `refresh`); `probe` False predicts the memory only (no step probe)."""
    return _frame(run, prediction(run, probe, refresh))


def stored_check(run: Run) -> pd.DataFrame:
    """check() from the prediction already in the run folder, computing nothing: without one, the
    measured side only (attrs["predicted"] False)."""
    return _frame(run, _read(run))


def _frame(run: Run, stored: dict[str, Any] | None) -> pd.DataFrame:
    import pandas as pd

    measured = measured_values(run)
    kept = stored or {}
    rows = []
    for rank in range(run.world_size):
        peak, step = measured.get(rank, (None, None))
        rows.append({"rank": rank, "predicted_peak_mb": kept.get("peak_mb"), "measured_peak_mb": peak,
                     "peak_error": _error(peak, kept.get("peak_mb")), "predicted_step_s": kept.get("step_s"),
                     "measured_step_s": step, "step_error": _error(step, kept.get("step_s"))})
    frame = pd.DataFrame(rows, columns=COLUMNS).astype({c: float for c in COLUMNS[1:]})
    frame.attrs["misses"] = misses(frame)
    frame.attrs["notes"] = list(kept.get("notes", []))
    frame.attrs["predicted"] = stored is not None
    return frame


def prediction(run: Run, probe: bool = True, refresh: bool = False) -> dict[str, Any]:
    """The run's plan row ({"peak_mb", "step_s", "notes", "when"}): from plan.json, or computed now and kept
    (the step's part only once the run has ended, and when `probe`)."""
    from workbench.runfolder.private import write_atomic

    kept = _read(run)
    done = run.status().done
    wanted_step = probe and done
    if kept is not None and not refresh and (kept.get("step_s") is not None or not wanted_step
                                             or kept.get("step_said")):
        return kept
    row, notes = _plan_row(run, wanted_step)
    if probe and not done:
        notes.append("step time: predicted once the run has ended (its probe would share this host with the "
                     "run's ranks)")
    found = {"peak_mb": _number(row.get("peak_mb")), "step_s": _number(row.get("step_s")), "notes": notes,
             "when": time.strftime("%Y-%m-%d %H:%M:%S"), "step_said": wanted_step}
    if done or kept is None:
        write_atomic(run.dir.plan, json.dumps(found, indent=1).encode())
    return found


def measured_values(run: Run) -> dict[int, tuple[float | None, float | None]]:
    """{rank: (peak MiB over its first two steps, median step seconds)} of the run's newest attempt."""
    from workbench.results.analysis import step_breakdown

    peaks = {rank: _number(e.get("peak_mb")) for rank, e in run.event_summary().memory.items()}
    steps: dict[int, float] = {}
    frame = run.metrics()
    if len(frame):
        b = step_breakdown(frame)
        steps = {int(r): float(s) for r, s in zip(b["rank"], b["step_time_s"], strict=True) if s == s}
    return {rank: (peaks.get(rank), steps.get(rank)) for rank in {*peaks, *steps}}


def misses(frame: pd.DataFrame) -> list[str]:
    """A line per rank whose peak is more than PEAK_MISS, or step more than STEP_MISS, off the plan."""
    lines = []
    for r in frame.to_dict("records"):
        for what, name, limit, unit in (("peak memory", "peak", PEAK_MISS, "MiB"),
                                        ("step time", "step", STEP_MISS, "s")):
            err = float(r[f"{name}_error"])
            if err == err and abs(err) > limit:
                measured, predicted = r[f"measured_{name}_{_UNIT[name]}"], r[f"predicted_{name}_{_UNIT[name]}"]
                lines.append(f"rank {int(r['rank'])}: {what} {_value(measured, unit)} measured, "
                             f"{_value(predicted, unit)} predicted ({err:+.0%}, more than the plan's {limit:.0%})")
    return lines


_UNIT = {"peak": "mb", "step": "s"}


def lines(frame: pd.DataFrame, world_size: int) -> list[str]:
    """The check as text for the report and `workbench show`: one line per rank (all ranks alike: one),
    then the misses; without a prediction, the measured peaks and how to get one."""
    if not frame.attrs.get("predicted"):
        peaks = frame["measured_peak_mb"].dropna()
        if not len(peaks):
            return []
        spread = _value(peaks.max(), "MiB") if peaks.nunique() == 1 else \
            f"{_value(peaks.min(), 'MiB')} to {_value(peaks.max(), 'MiB')}"
        return [f"peak memory a rank over its first two steps: {spread} (tracked tensors; no plan to check it "
                "against yet: run.plan() or `workbench show RUN --plan` makes one)"]
    shown = [f"peak {_value(r['measured_peak_mb'], 'MiB')} measured / {_value(r['predicted_peak_mb'], 'MiB')} "
             f"predicted, step {_value(r['measured_step_s'], 's')} / {_value(r['predicted_step_s'], 's')}"
             for r in frame.to_dict("records")]
    if len(set(shown)) == 1 and world_size > 1:
        out = [f"plan vs measured (every rank): {shown[0]}"]
    else:
        out = ["plan vs measured:", *(f"  rank {r}: {text}" for r, text in enumerate(shown))]
    found = frame.attrs.get("misses", [])
    out += [f"  missed: {m}" for m in found] if found else ["  within the plan's 10% (memory) and 30% (step)"
                                                            if _any_pair(frame) else "  nothing to compare yet"]
    return out


def engine_run(run: Run) -> bool:
    """The run trained with the engine (workbench.submit), not the user's own script or function."""
    return not (run.meta.get("script") or run.meta.get("function"))


def _any_pair(frame: pd.DataFrame) -> bool:
    return bool((frame["peak_error"].notna() | frame["step_error"].notna()).any())


def _plan_row(run: Run, probe: bool) -> tuple[dict[str, Any], list[str]]:
    """The plan's row for the run as it ran; ArgumentError when it did not run the engine's step."""
    import torch

    from workbench.engine.tasks import load_task_factory, resolve_factory
    from workbench.planning.plan import plan

    if not engine_run(run):
        what = "script" if run.meta.get("script") else "function"
        raise ArgumentError(f"run.plan(): {run.folder.name} ran your own {what}; the plan models the engine's "
                            "training step (workbench.submit with a task), so it has nothing to check here")
    cfg = run.config
    start = run.event_summary().start or {}
    device = str(start.get("device") or ("cuda" if cfg.launch.slurm.gpus_per_node else "cpu")).split(":")[0]
    strategy = str(start.get("strategy") or cfg.dist.strategy)
    notes = []
    here = device == "cpu" or torch.cuda.is_available()
    if probe and not here:
        notes.append("step time: not predicted here (the run had a GPU, this machine has none)")
    factory = load_task_factory(run.dir) or resolve_factory(cfg.task.name)
    frame = plan(cfg, factory, world_sizes=(run.world_size,), strategies=(strategy,), device=device,
                 device_memory_gb=1.0, probe=probe and here)
    return {str(k): v for k, v in frame.iloc[0].items()}, notes + list(frame.attrs.get("notes", []))


def _read(run: Run) -> dict[str, Any] | None:
    from workbench.runfolder.private import read_bounded

    try:
        data = json.loads(read_bounded(run.dir.plan, 1 << 20))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _error(measured: float | None, predicted: float | None) -> float:
    if measured is None or predicted is None or not predicted or measured != measured or predicted != predicted:
        return math.nan
    return measured / predicted - 1


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return float(value)
    return None


def _value(value: Any, unit: str) -> str:
    if value is None or value != value:
        return "n/a"
    value = float(value)
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:,.0f} MiB" if value >= 100 else f"{value:.3g} MiB"
