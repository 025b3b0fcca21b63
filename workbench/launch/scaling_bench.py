"""Measured scaling: short real runs of the user's own job at several world sizes.

benchmark_scaling(cfg, world_sizes=(1, 2)) submits one short job per world size, one after the
other (run together they would compete for the same cores or GPUs), waits for each and turns its
per-rank metrics into one row: throughput, speedup over the smallest world size, scaling
efficiency, the step split into data wait / compute / communication, memory per rank, and the
reference guides' rule-of-thumb speedup beside the measurement.  The runs are ordinary run folders
(``Run.load(row.run_dir).report()`` explains one of them) under ``<run_root>/scaling-<name>-<time>/``,
next to a ``scaling.csv`` of the table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config.scaling import effective_batch
from workbench.errors import ConfigError
from workbench.results import analysis
from workbench.runfolder.layout import ScalingBenchDir, default_run_dir
from workbench.runfolder.private import make_dirs, replacing

if TYPE_CHECKING:
    import pandas as pd

    from workbench.config.sections import JobConfig
    from workbench.launch.run import Run

GUIDE_SPEEDUP = {1: (1.0, 1.0), 2: (1.8, 1.8), 4: (3.2, 3.4), 8: (5.5, 6.4)}
"""Speedup over one GPU in the reference guides (low, high): 2 GPUs 1.8x, 4 GPUs 3.2-3.4x, 8 GPUs 5.5-6.4x."""

COLUMNS = ["world_size", "nodes", "procs_per_node", "effective_batch", "samples_per_s", "speedup",
           "ideal_speedup", "expected_speedup", "expected_low", "expected_high", "efficiency",
           "step_time_s", "data_time_s", "compute_s", "comm_wait_s", "comm_share", "mem_mb_per_rank",
           "mem_imbalance", "steps", "run_dir"]


def guide_speedup(world_size: int) -> tuple[float, float]:
    """The guides' expected speedup over one GPU at `world_size` GPUs, as (low, high).

    1, 2, 4 and 8 are the guides' own numbers.  In between, the efficiency (speedup / n) is
    interpolated linearly in log2(n); beyond 8 the guides say nothing, and the 4 -> 8 loss of
    efficiency per doubling is continued (a guess, not a measurement)."""
    if world_size in GUIDE_SPEEDUP:
        return GUIDE_SPEEDUP[world_size]
    eff = {n: (lo / n, hi / n) for n, (lo, hi) in GUIDE_SPEEDUP.items()}
    x = math.log2(world_size)
    if world_size > 8:
        low, high = (eff[8][i] * (eff[8][i] / eff[4][i]) ** (x - 3) for i in (0, 1))
    else:
        a = 2 ** math.floor(x)
        t = x - math.floor(x)
        low, high = (eff[a][i] + t * (eff[2 * a][i] - eff[a][i]) for i in (0, 1))
    return low * world_size, high * world_size


def layout(cfg: JobConfig, world_size: int) -> tuple[int, int]:
    """(nodes, procs_per_node) of the benchmark run with `world_size` ranks.

    Locally: one node with world_size ranks.  On SLURM dist.procs_per_node is taken as the size of
    a node (one rank per GPU): fewer ranks run on one node, more fill whole nodes."""
    per_node = cfg.dist.procs_per_node
    if cfg.launch.executor != "slurm" or world_size <= per_node:
        return 1, world_size
    if world_size % per_node:
        raise ConfigError([f"world_sizes: {world_size} ranks do not fill whole nodes of dist.procs_per_node="
                           f"{per_node}; use a multiple of {per_node}, or set procs_per_node to the node size"])
    return world_size // per_node, per_node


def bench_config(cfg: JobConfig, world_size: int, steps: int) -> JobConfig:
    """cfg shortened to `steps` logged steps at `world_size` ranks: no evaluation, one checkpoint at the
    end, and the same threads per rank at every size (dist.threads_per_rank, default 1), so a
    1-rank run does not get all the cores a 2-rank run has to share."""
    nodes, procs = layout(cfg, world_size)
    never = steps + 1  # an interval past the last step: no eval or checkpoint inside, none at epoch ends
    # Like for like: every world size gets the threads per rank the largest one can have.
    threads = cfg.dist.threads_per_rank or 1
    return cfg.replace(dist__nodes=nodes, dist__procs_per_node=procs, train__max_steps=steps,
                       dist__threads_per_rank=threads,
                       train__epochs=max(cfg.train.epochs, steps), train__log_every_steps=1,
                       train__eval_every_steps=never, train__checkpoint_every_steps=never)


def benchmark_scaling(cfg: JobConfig, world_sizes: Iterable[int] = (1, 2), steps: int = 30, warmup_steps: int = 5,
                      task: Callable[..., Any] | None = None, run_root: str | Path | None = None) -> pd.DataFrame:
    """Run `cfg` for `steps` steps at each world size and return the measured scaling table.

    One row per world size (COLUMNS).  samples_per_s is the sum over ranks of each rank's median
    throughput after `warmup_steps`; speedup is relative to the smallest world size n0,
    ideal_speedup = n / n0 and efficiency = speedup / ideal_speedup; expected_* are the guides'
    rules of thumb (guide_speedup) rebased to n0.  The step split is the mean over ranks of each
    rank's medians (analysis.step_breakdown); mem_mb_per_rank is the largest peak of any rank."""
    sizes = _check(world_sizes, steps, warmup_steps)
    if run_root is not None:
        cfg = cfg.replace(launch__run_root=str(run_root))
    configs = [bench_config(cfg, n, steps).check() for n in sizes]  # every problem before the first run
    factory = task  # the public keyword is task=; it is a task factory
    bench = _bench_folder(cfg, factory)
    rows = [_measure(_run(c, factory, bench.run(c.world_size)), c, warmup_steps) for c in configs]
    frame = compare(rows)
    with replacing(bench.table, "w", newline="") as fh:
        frame.to_csv(fh, index=False)
    frame.attrs["folder"] = str(bench.root)
    return frame


def _check(world_sizes: Iterable[int], steps: int, warmup_steps: int) -> list[int]:
    sizes = sorted(set(world_sizes))
    problems = [f"world_sizes: {n!r} is not a positive whole number" for n in sizes
                if not isinstance(n, int) or n < 1]
    if not sizes:
        problems.append("world_sizes: give at least one world size, e.g. (1, 2)")
    if not isinstance(steps, int) or not isinstance(warmup_steps, int) or not 0 <= warmup_steps < steps:
        problems.append(f"steps: need 0 <= warmup_steps < steps, got warmup_steps={warmup_steps}, steps={steps}; "
                        "measured steps are those after the warm-up")
    if problems:
        raise ConfigError(problems)
    return sizes


def _bench_folder(cfg: JobConfig, factory: Callable[..., Any] | None) -> ScalingBenchDir:
    from workbench.engine.tasks import factory_label

    named = cfg.replace(task__name=factory_label(factory)) if factory is not None else cfg
    bench = ScalingBenchDir.beside(default_run_dir(named))
    make_dirs(bench.root)
    return bench


def _run(cfg: JobConfig, factory: Callable[..., Any] | None, run_dir: Path) -> Run:
    """Submit, wait, and raise the failing rank's error (RunFailed) if the run did not finish."""
    from workbench.config.validate import parse_time_limit
    from workbench.launch.submit import submit

    run = submit(cfg, task=factory, run_dir=run_dir)
    try:
        status = run.wait(timeout=parse_time_limit(cfg.launch.time_limit) * 60 + 120)
    except BaseException:  # a timeout or Ctrl-C: leave no ranks behind
        run.cancel()
        raise
    if status.state != "finished":
        run.result()  # raises RunFailed naming the rank, or says why there is no result
    return run


def _measure(run: Run, cfg: JobConfig, warmup_steps: int) -> dict[str, Any]:
    frame = run.metrics()
    b = analysis.step_breakdown(frame, skip_steps=warmup_steps)
    split = b[["step_time_s", "data_time_s", "compute_s", "comm_wait_s"]].mean()
    mem = analysis.memory_imbalance(frame)
    t = cfg.train
    return {"world_size": cfg.world_size, "nodes": cfg.dist.nodes, "procs_per_node": cfg.dist.procs_per_node,
            "effective_batch": effective_batch(t.micro_batch_size, t.grad_accum_steps, cfg.world_size),
            "samples_per_s": float(b["samples_per_s"].sum()), **split.to_dict(),
            "comm_share": analysis.communication_share(b), "mem_mb_per_rank": mem["max_mb"],
            "mem_imbalance": mem["ratio"], "steps": int(b["steps"].min()), "run_dir": str(run.folder)}


def compare(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Add speedup, ideal, expected and efficiency columns to measured rows, relative to the smallest world size."""
    import pandas as pd

    frame = pd.DataFrame(rows).sort_values("world_size").reset_index(drop=True)
    base = frame.iloc[0]
    guide = [guide_speedup(int(n)) for n in frame["world_size"]]
    low0, high0 = guide_speedup(int(base["world_size"]))
    frame["speedup"] = frame["samples_per_s"] / base["samples_per_s"]
    frame["ideal_speedup"] = frame["world_size"] / base["world_size"]
    frame["efficiency"] = frame["speedup"] / frame["ideal_speedup"]
    frame["expected_low"] = [lo / low0 for lo, _ in guide]
    frame["expected_high"] = [hi / high0 for _, hi in guide]
    frame["expected_speedup"] = (frame["expected_low"] + frame["expected_high"]) / 2
    return frame[COLUMNS]
