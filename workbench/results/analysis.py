"""Where a DDP step's time goes, per rank, and what to do about it.

Pure functions on the metrics DataFrame of ``Run.metrics()`` (one row per logged step per rank);
pandas only, no torch.  Columns used: rank, step, step_time_s, data_time_s, samples_per_s, mem_mb
and, when the engine measured them, comm_wait_s (exposed communication: backward waiting on the
gradient all-reduce after its last bucket was ready) and comm_busy_s (summed duration of the bucket
all-reduces, partly hidden under backward).  A missing column gives NaN ("not measured"), never an
error.

One rank's step splits as  step_time_s = data_time_s + compute_s + comm_wait_s,  compute_s being
the remainder (forward, backward, optimizer step).  The first `skip_steps` steps of each rank are
left out (allocator warm-up, DDP's bucket rebuild after step 1) and every figure is a median over
the rest, which a checkpoint, an epoch boundary or a busy neighbour on a shared machine barely moves.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from workbench.config.scaling import effective_batch, reference_batch
from workbench.runfolder.stragglers import slower_than_others

if TYPE_CHECKING:
    from workbench.config.sections import JobConfig

SKIP_STEPS = 5
COMM_SHARE_LIMIT = 0.10
"""The reference guides: communication overhead "should be <10% of total time"."""
DATA_SHARE_LIMIT = 0.10
MEMORY_IMBALANCE_LIMIT = 1.2

BREAKDOWN_COLUMNS = ["rank", "steps", "step_time_s", "step_time_p90_s", "data_time_s", "compute_s",
                     "comm_wait_s", "comm_busy_s", "data_share", "comm_share", "samples_per_s"]
STRAGGLER_COLUMNS = ["rank", "own_time_s", "others_median_s", "slower_by", "step_share", "basis"]
_MEDIANS = ("step_time_s", "data_time_s", "comm_wait_s", "comm_busy_s", "samples_per_s")


def steady(frame: pd.DataFrame, skip_steps: int = SKIP_STEPS) -> pd.DataFrame:
    """The rows after each rank's first `skip_steps` steps (every row if that would leave none)."""
    if len(frame) == 0 or "step" not in frame:
        return frame
    first = frame.groupby("rank")["step"].transform("min")
    kept = frame[frame["step"] >= first + skip_steps]
    return kept if len(kept) else frame


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column as floats, or NaN everywhere when it was not logged."""
    if name in frame:
        return pd.to_numeric(frame[name], errors="coerce")
    return pd.Series(math.nan, index=frame.index, dtype=float)


def step_breakdown(frame: pd.DataFrame, skip_steps: int = SKIP_STEPS) -> pd.DataFrame:
    """One row per rank: median step time and its split into data wait, compute and communication.

    step_time_s, data_time_s, comm_wait_s, comm_busy_s and samples_per_s are per-rank medians over
    the steady steps; compute_s = step_time_s - data_time_s - comm_wait_s (clipped at 0), so the
    three parts add up to the step time.  Without comm_wait_s, compute_s includes communication and
    comm_share is NaN.  Shares are fractions of step_time_s; step_time_p90_s shows the jitter."""
    data = steady(frame, skip_steps)
    if len(data) == 0 or "step_time_s" not in data:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    parts = pd.DataFrame({name: _column(data, name) for name in _MEDIANS})
    parts["rank"] = data["rank"].astype(int)
    grouped = parts.groupby("rank")
    out = grouped.median()
    out["steps"] = grouped.size()
    out["step_time_p90_s"] = grouped["step_time_s"].quantile(0.9)
    known = out["data_time_s"].fillna(0) + out["comm_wait_s"].fillna(0)
    out["compute_s"] = (out["step_time_s"] - known).clip(lower=0)
    out["data_share"] = out["data_time_s"] / out["step_time_s"]
    out["comm_share"] = out["comm_wait_s"] / out["step_time_s"]
    return out.reset_index()[BREAKDOWN_COLUMNS]


def communication_share(breakdown: pd.DataFrame) -> float:
    """Exposed all-reduce time as a share of the step, on the rank that waited least (NaN if unmeasured).

    A rank that finishes backward early also waits for the slowest rank inside the all-reduce; the
    rank that waited least saw the cost of the communication itself."""
    shares = breakdown["comm_share"].dropna() if "comm_share" in breakdown else pd.Series(dtype=float)
    return float(shares.min()) if len(shares) else math.nan


def stragglers(frame: pd.DataFrame, threshold: float, skip_steps: int = SKIP_STEPS) -> pd.DataFrame:
    """Ranks whose own work per step exceeds the median of the other ranks by more than `threshold`.

    A rank's own work is the median over its steps of each step's time minus that step's all-reduce
    wait (data + compute), as each rank's live check keeps it: not the median step time minus the
    median wait, which on jittery steps is neither (a rank working 1.9 ms a step came out at 4.0
    ms).  DDP's all-reduce synchronises the ranks, so whole step times come out nearly equal: the
    fast ranks absorb a straggler's delay as communication wait.  Without comm_wait_s the step time
    is used (basis "step time").  The reference is the median of the *other* ranks, so that with 2 ranks a
    30% slower rank is flagged (the median of both would sit halfway).  slower_by is a fraction;
    step_share is the extra time as a share of the step: what the other ranks lose waiting for it."""
    b = step_breakdown(frame, skip_steps)
    if len(b) < 2:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    measured = b["comm_wait_s"].notna().all()
    data = steady(frame, skip_steps)
    per_step = _column(data, "step_time_s") - (_column(data, "comm_wait_s") if measured else 0.0)
    own = per_step.groupby(data["rank"].astype(int)).median().reindex(b["rank"].astype(int))
    rows = []
    for i, (others, slower_by) in slower_than_others(own.tolist(), threshold).items():
        extra = (float(own.iloc[i]) - others) / float(b["step_time_s"].median())
        rows.append({"rank": int(b["rank"].iloc[i]), "own_time_s": float(own.iloc[i]), "others_median_s": others,
                     "slower_by": slower_by, "step_share": extra,
                     "basis": "data + compute" if measured else "step time"})
    return pd.DataFrame(rows, columns=STRAGGLER_COLUMNS)


def memory_imbalance(frame: pd.DataFrame) -> dict[str, Any]:
    """Peak memory per rank (mem_mb: peak RSS on CPU, peak allocated on CUDA) and max / min.

    Returns per_rank_mb {rank: MiB}, max_mb, min_mb, max_rank, min_rank and ratio (NaN if not logged)."""
    has = "mem_mb" in frame and len(frame) > 0
    peak = frame.groupby("rank")["mem_mb"].max().dropna() if has else pd.Series(dtype=float)
    if len(peak) == 0:
        return {"per_rank_mb": {}, "max_mb": math.nan, "min_mb": math.nan, "max_rank": None,
                "min_rank": None, "ratio": math.nan}
    low = float(peak.min())
    ranks = [int(r) for r in peak.index]
    values = [float(v) for v in peak.to_numpy()]
    return {"per_rank_mb": dict(zip(ranks, values)), "max_mb": max(values),
            "min_mb": low, "max_rank": ranks[values.index(max(values))], "min_rank": ranks[values.index(low)],
            "ratio": float(peak.max()) / low if low > 0 else math.nan}


def amdahl_gain(share: float, factor: float = 2.0) -> float:
    """Throughput multiplier when a part taking `share` of the step gets `factor` times cheaper per sample.

    The model (Amdahl): one optimizer step of a rank = work + comm.  Work (data wait and compute)
    grows with the samples in the step; comm (the exposed all-reduce wait) is the same per step,
    since the gradient has the same size whatever the batch.  With m = comm / step:
        new throughput / old throughput = 1 / ((1 - m) + m / factor)
    Doubling the samples per step (accumulation or micro-batch) halves comm per sample, and halving
    the bytes all-reduced (fp16/bf16 compression) halves comm per step: both are factor 2."""
    return 1.0 / ((1.0 - share) + share / factor)


def communication_advice(frame: pd.DataFrame, cfg: JobConfig, threshold: float = COMM_SHARE_LIMIT,
                         skip_steps: int = SKIP_STEPS) -> list[str]:
    """Plain-sentence recommendations, with the predicted throughput of each, when the exposed
    all-reduce takes more than `threshold` of the step; empty when it is small or not measured.

    Predictions use amdahl_gain() on the measured share (see there for the model).  They are an
    estimate: on GPUs a larger micro-batch often runs more efficiently too (so gains can be larger),
    and compression also costs a cast per bucket (so its gain can be smaller)."""
    b = step_breakdown(frame, skip_steps)
    share = communication_share(b)
    if not share > threshold:
        return []
    t, rate = cfg.train, float(b["samples_per_s"].sum())
    batch = effective_batch(t.micro_batch_size, t.grad_accum_steps, len(b))
    gain = amdahl_gain(share, 2.0)
    predicted = f"predicted {gain:.2f}x throughput ({rate:,.0f} -> {rate * gain:,.0f} samples/s)"
    advice = [
        f"Double train.grad_accum_steps ({t.grad_accum_steps} -> {2 * t.grad_accum_steps}): one gradient "
        f"all-reduce per twice the samples, {predicted}; the effective batch grows {batch} -> {2 * batch}"
        f"{_lr_note(cfg)}.",
        f"Or double train.micro_batch_size ({t.micro_batch_size} -> {2 * t.micro_batch_size}) if memory "
        f"allows{_memory_note(frame)}: the same {gain:.2f}x by the same model, without extra micro-steps; "
        f"the effective batch also grows {batch} -> {2 * batch}{_lr_note(cfg)}.",
    ]
    if cfg.dist.comm_hook == "none":
        advice.append(f"Compress gradients with dist.comm_hook: fp16 (bf16 on CUDA): it halves the bytes "
                      f"all-reduced; if the exposed wait halves, {predicted}, at a small cost in gradient "
                      f"precision.")
    return advice


def _lr_note(cfg: JobConfig) -> str:
    """What happens to lr when the effective batch doubles by accumulation or micro-batch (config.scaling):
    with train.lr_ref_batch set the rule scales it; unset, the reference batch doubles too and lr stays."""
    t, rule = cfg.train, cfg.scaling.rule
    if t.lr_ref_batch:
        return (f", and scaling.rule {rule} moves lr with it (from train.lr_ref_batch {t.lr_ref_batch})"
                if rule != "none" else ", so retune train.lr (scaling.rule is none)")
    return (f"; lr stays (train.lr_ref_batch is unset, so the reference batch doubles too): set "
            f"train.lr_ref_batch: {reference_batch(t)} to have scaling.rule {rule} scale it, or retune train.lr"
            if rule != "none" else ", so retune train.lr (scaling.rule is none)")


def _memory_note(frame: pd.DataFrame) -> str:
    mem = memory_imbalance(frame)
    return "" if math.isnan(mem["max_mb"]) else f" (peak now {mem['max_mb']:,.0f} MiB per rank)"


def data_advice(frame: pd.DataFrame, cfg: JobConfig, threshold: float = DATA_SHARE_LIMIT,
                skip_steps: int = SKIP_STEPS) -> list[str]:
    """A recommendation when the ranks wait on the DataLoader for more than `threshold` of the step."""
    b = step_breakdown(frame, skip_steps)
    share = float(b["data_share"].median()) if len(b) and b["data_share"].notna().any() else math.nan
    if not share > threshold:
        return []
    return [f"The ranks wait on the DataLoader for {share:.0%} of each step: raise data.num_workers (now "
            f"{cfg.data.num_workers}); hiding that wait entirely would give up to "
            f"{amdahl_gain(share, math.inf):.2f}x throughput."]


def report(frame: pd.DataFrame, cfg: JobConfig, found_stragglers: pd.DataFrame | None = None,
           checks: dict[str, int] | None = None, skip_steps: int = SKIP_STEPS) -> dict[str, Any]:
    """Everything above for one run: breakdown, throughput, shares, stragglers, memory, advice, and
    what the engine's live checks found (`checks`, from workbench.runfolder.events.EventSummary).

    Stragglers use the config's dist.straggler_threshold; pass `found_stragglers` when they were
    already computed for the same frame (Run.stragglers()), so the report and the live line agree."""
    b = step_breakdown(frame, skip_steps)
    threshold = cfg.dist.straggler_threshold
    if found_stragglers is None:
        found_stragglers = stragglers(frame, threshold, skip_steps)
    return {
        "breakdown": b,
        "world_size": len(b),
        "samples_per_s": float(b["samples_per_s"].sum()) if len(b) else math.nan,
        "comm_share": communication_share(b),
        "comm_overlap": _overlap(b),
        "stragglers": found_stragglers,
        "straggler_threshold": threshold,
        "memory": memory_imbalance(frame),
        "advice": communication_advice(frame, cfg, skip_steps=skip_steps) + data_advice(frame, cfg,
                                                                                        skip_steps=skip_steps),
        "events": dict(checks or {}),
        "skip_steps": skip_steps,
        "records": len(frame),
    }


def _overlap(b: pd.DataFrame) -> float:
    """Fraction of the all-reduce time hidden under backward (1 - wait / busy, within [0, 1]), NaN if
    unmeasured.  The wait also holds the hook's own overhead, so with one bucket it can exceed busy."""
    busy, wait = b["comm_busy_s"].median(), b["comm_wait_s"].median()
    return float(min(1.0, max(0.0, 1 - wait / busy))) if busy > 0 and not math.isnan(wait) else math.nan


def format_report(rep: dict[str, Any]) -> str:
    """The report as text for a terminal (`workbench show`)."""
    b = rep["breakdown"]
    if len(b) == 0:
        if rep.get("records"):
            return (f"step analysis: {rep['records']} records logged, none with a step time (step_time_s), "
                    "so there is no time split to show")
        return "step analysis: no metrics logged yet"
    lines = [f"step time per rank (median after the first {rep['skip_steps']} steps; "
             "compute = step - data - comm):", _breakdown_text(b),
             f"throughput: {rep['samples_per_s']:,.0f} samples/s over {rep['world_size']} rank(s)",
             _comm_line(rep), _straggler_line(rep["stragglers"], rep["straggler_threshold"]),
             _memory_line(rep["memory"], rep.get("device", ""))]
    lines += [f"during the run, the ranks' live checks saw: {n} {kind if n != 1 else _SINGULAR.get(kind, kind)}"
              for kind, n in rep["events"].items()]
    lines += rep.get("plan", [])
    if rep["advice"]:
        lines += ["what would help:", *(f"  - {a}" for a in rep["advice"])]
    return "\n".join(lines)


_SINGULAR = {"straggler warnings": "straggler warning", "sync checks out of sync": "sync check out of sync"}


def _breakdown_text(b: pd.DataFrame) -> str:
    shown = b.drop(columns=["comm_busy_s"]).copy()
    for col in ("data_share", "comm_share"):
        shown[col] = shown[col].map(lambda v: "n/a" if pd.isna(v) else f"{v:.1%}")
    for col in ("step_time_s", "step_time_p90_s", "data_time_s", "compute_s", "comm_wait_s"):
        shown[col] = shown[col].map(lambda v: "n/a" if pd.isna(v) else f"{v:.4f}")
    shown["samples_per_s"] = shown["samples_per_s"].map(lambda v: f"{v:,.0f}")
    return shown.to_string(index=False)


def _comm_line(rep: dict[str, Any]) -> str:
    share = rep["comm_share"]
    if math.isnan(share):
        return "communication: not measured (no comm_wait_s); compute includes it"
    verdict = "above" if share > COMM_SHARE_LIMIT else "below"
    hidden = rep["comm_overlap"]
    overlap = "" if math.isnan(hidden) else f"; {hidden:.0%} of the all-reduce time is hidden under backward"
    return (f"communication: {share:.1%} of the step waits on the gradient all-reduce, {verdict} the "
            f"guides' {COMM_SHARE_LIMIT:.0%}{overlap}")


def _straggler_line(found: pd.DataFrame, threshold: float) -> str:
    if len(found) == 0:
        return f"stragglers: none (no rank more than {threshold:.0%} slower than the others)"
    parts = [f"rank {r.rank} {r.slower_by:.0%} slower ({r.basis} {r.own_time_s:.4f} s vs "
             f"{r.others_median_s:.4f} s; the others wait {r.step_share:.0%} of each step for it)"
             for r in found.itertuples()]
    return "stragglers: " + "; ".join(parts)


def _memory_line(mem: dict[str, Any], device: str = "") -> str:
    if not mem["per_rank_mb"]:
        return "memory: not measured"
    flag = " - imbalanced" if mem["ratio"] > MEMORY_IMBALANCE_LIMIT else ""
    what = {"cpu": " (each rank's process, peak RSS)", "cuda": " (max_memory_allocated)"}.get(device.split(":")[0], "")
    return (f"memory{what}: peak {mem['max_mb']:,.0f} MiB (rank {mem['max_rank']}), lowest {mem['min_mb']:,.0f} MiB "
            f"(rank {mem['min_rank']}), max/min {mem['ratio']:.2f}{flag}")
