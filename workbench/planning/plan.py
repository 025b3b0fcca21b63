"""workbench.plan: before a launch, per world size, the scaled lr and warmup, each rank's memory, whether it
fits, the largest micro-batch that does, and the predicted speed.

Memory comes from one trace of the training step on fake tensors (planning.memory); the same at every
world size under DDP, which replicates the whole step on every rank.  The step's time: on CPU, at each
world size whose ranks share this host, the engine's own step of the model measured with that many ranks
stepping at once (planning.probe.measured_step): on a host of few cores, n ranks share its cores with
each other and with gloo's threads, so one micro-batch timed alone (the model below) came out up to 2.3x
too fast at 2 ranks here.  Elsewhere (beyond a node's ranks, on CUDA: a process a GPU, no cores shared,
or a link given) it is modelled (planning.cost): one micro-batch's compute (from the most ranks measured
at once here, else measured alone by planning.compute: warm-up, then the median of many, with the rank's
thread count), times the accumulation steps, plus the step's collectives on a link, plus the engine's own
work a step.  The link (per-call latency, bus bandwidth) and the engine's work are
measured by a probe of gloo at each world size this host runs (planning.probe: a few seconds once, then
cached per backend, world size, host and settings), scaled from the largest measured to larger sizes;
or given (`link`, `bandwidth_gbps`); NCCL's is assumed (BANDWIDTH_GBPS) until a GPU probe exists.  DDP
all-reduces its gradient buckets (dist.bucket_cap_mb), one call each; fsdp2 all-gathers each unit's
parameters and reduce-scatters its gradients.

fsdp2 rows shard parameters, gradients and optimizer state over the ranks and add what is gathered
whole (StepMemory.sharded)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from workbench.config.scaling import scaling_table
from workbench.errors import ArgumentError
from workbench.planning.compute import micro_batch_seconds
from workbench.planning.cost import Link, ddp_buckets, ddp_comm_s, fsdp2_comm_s, step_seconds
from workbench.planning.memory import MB, StepMemory, step_memory

if TYPE_CHECKING:
    import pandas as pd

    from workbench.config.sections import JobConfig

HEADROOM = 0.85
"""The share of a device's memory a plan fills at most (the guides' max_memory_per_gpu: 0.85)."""
BANDWIDTH_GBPS = {"gloo": 1.0, "nccl": 50.0}
"""All-reduce bus bandwidth assumed when none is given (GB/s): gloo over TCP on one machine; NCCL within
a node (NVLink; PCIe and across nodes are slower: give bandwidth_gbps)."""
STRATEGIES = ("ddp", "fsdp2")
COLUMNS = ["world_size", "strategy", "micro_batch_size", "effective_batch", "lr", "warmup_steps", "steps_per_epoch",
           "params_mb", "grads_mb", "optimizer_mb", "activations_mb", "peak_mb", "device_memory_mb", "fits",
           "max_micro_batch", "step_s", "samples_per_s", "epoch_s"]


def plan(cfg: JobConfig, task: Callable[..., Any] | None = None, world_sizes: Iterable[int] = (1, 2, 4, 8),
         strategies: Iterable[str] | None = None, device_memory_gb: float | None = None, headroom: float = HEADROOM,
         device: str | None = None, bandwidth_gbps: float | None = None, probe: bool = True,
         link: Link | None = None) -> pd.DataFrame:
    """One row per world size and strategy (COLUMNS; per rank): the config's micro-batch, effective batch,
    scaled lr and warmup, steps per epoch; params, grads, optimizer state, activations and peak memory in
    MiB; the device's memory, whether the peak fits within `headroom` of it, and the largest micro-batch
    that does; the predicted step time, samples/s and epoch time (without `probe`, or when the probe
    fails: empty).  `task`: the factory (default: the config's task); `device`: "cuda" or "cpu" (default:
    cuda where there is one); `device_memory_gb`: the memory of the device the job will have (default: this
    machine's GPU, or on CPU its memory shared by the ranks of a node).  `link`: the interconnect's cost
    (latency, bus bandwidth, the engine's work a step) at some world size, scaled to the others;
    `bandwidth_gbps`: only its bus bandwidth (no latency); neither: measured by the probe (gloo) or
    assumed (NCCL).  What was traced, measured or assumed is in the frame's attrs["notes"]."""
    import pandas as pd
    import torch

    from workbench.engine.tasks import resolve_factory

    sizes = sorted({int(n) for n in world_sizes})
    if not sizes or sizes[0] < 1:
        raise ArgumentError(f"world_sizes: {list(world_sizes)!r}; give positive whole numbers, e.g. (1, 2, 4, 8)")
    strategies = tuple(strategies or (cfg.dist.strategy,))
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ArgumentError(f"strategies: {unknown[0]!r} is not one of {', '.join(STRATEGIES)} "
                            "(dist.strategy's values)")
    if not 0 < headroom <= 1:
        raise ArgumentError(f"headroom: {headroom!r}; give the share of the device's memory to fill, e.g. 0.85")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    factory = task or resolve_factory(cfg.task.name)
    memory = step_memory(cfg, factory, device)
    capacity_mb = device_memory_gb * 1024 if device_memory_gb else device_memory_mb(device, cfg)
    notes = [f"memory: {'traced on fake tensors (torch MemTracker)' if memory.traced else memory.note}"]
    room = _available_bytes()
    if probe and memory.traced and room is not None and memory.peak > room / 2:
        probe = False
        notes.append(f"step time: not measured (a real step needs {memory.peak / MB:,.0f} MiB, more than half of "
                     f"this machine's {room / MB:,.0f} MiB available)")
    # On CPU with the link to be measured: the model's own step at each world size whose ranks share this
    # host, its ranks stepping at once (they share its cores, as the run's will)
    shared = probe and link is None and not bandwidth_gbps and not device.startswith("cuda")
    steps = _host_steps(cfg, factory, strategies, sizes, memory, room, notes) if shared else {}
    modelled = any((s, n) not in steps for s in strategies for n in sizes)
    compute_s = _compute_s(cfg, factory, device, steps, notes) if probe and modelled else None
    links = {strategy: _links(cfg.replace(dist__strategy=strategy), sizes, device, link, bandwidth_gbps,
                              probe, notes) for strategy in strategies}
    # batch, lr, warmup and steps per epoch as the scaling table gives them (the factory's own dataset
    # counts when the config does not give its size)
    dataset_size = cfg.task.train_samples or memory.samples
    scaling = scaling_table(cfg, sizes, dataset_size=dataset_size)
    rows = [_row(scale, strategy, memory, capacity_mb, headroom,
                 steps[strategy, scale["world_size"]]["step_s"] if (strategy, scale["world_size"]) in steps
                 else _step_s(cfg, strategy, memory, compute_s, links[strategy][scale["world_size"]]))
            for scale in scaling.to_dict("records") for strategy in strategies]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame.attrs["notes"] = notes
    frame.attrs["train_samples"] = dataset_size
    if "fsdp2" not in strategies and memory.traced:  # where ddp does not fit, what fsdp2 would need
        usable = capacity_mb * headroom
        frame.attrs["fsdp2"] = {n: (memory.sharded(n) / MB, memory.sharded(n) / MB <= usable) for n in sizes}
    return frame


def _step_s(cfg: JobConfig, strategy: str, memory: StepMemory, compute_s: float | None,
            link: Link) -> float | None:
    """The predicted step at the link's world size (planning.cost)."""
    if compute_s is None:
        return None
    accum = cfg.train.grad_accum_steps
    if strategy == "fsdp2":
        comm = fsdp2_comm_s(link, memory.unit_sizes, memory.root_only, accum, cfg.dist.reshard_after_forward)
    else:
        comm = ddp_comm_s(link, ddp_buckets(memory.grad_sizes, int(cfg.dist.bucket_cap_mb * MB)))
    return step_seconds(compute_s, accum, comm, link)


def _links(cfg: JobConfig, sizes: list[int], device: str, link: Link | None, bandwidth_gbps: float | None,
           measure: bool, notes: list[str]) -> dict[int, Link]:
    """The link at each world size: given, else measured here (gloo, up to a node's ranks; the largest
    measured scaled to the sizes beyond), else assumed."""
    if link is None and bandwidth_gbps:
        link = Link(1, 0.0, bandwidth_gbps, source="given")
    backend = "nccl" if device.startswith("cuda") else "gloo"
    found: dict[int, Link] = {}
    if link is None and measure and backend == "gloo":
        found = _measured(cfg, [n for n in sizes if n <= max(1, cfg.dist.procs_per_node)] or [1], notes)
    if found:
        link = found[max(found)]
    elif link is None:
        link = Link(1, 0.0, BANDWIDTH_GBPS[backend], source=f"assumed for {backend}")
    links = {n: found.get(n) or link.at(n) for n in sizes}
    said = [f"{n} ranks {x.latency_s * 1e6:.0f} us a call, {x.bus_gbps:.2f} GB/s, engine {x.overhead_s * 1000:.2f} "
            f"ms a step ({x.source})" for n, x in links.items()]
    notes.append(f"links ({cfg.dist.strategy}): " + "; ".join(said))
    return links


def _measured(cfg: JobConfig, sizes: list[int], notes: list[str]) -> dict[int, Link]:
    """The probe's link at each of `sizes` (cached); nothing when it cannot run, said why."""
    from workbench.planning.probe import cache_path, measured_link, probe_settings

    settings = probe_settings(cfg, _threads(cfg))
    try:
        found = {n: measured_link(n, settings) for n in sizes}
    except Exception as exc:  # noqa: BLE001 - a probe that cannot run leaves the link assumed, said why
        notes.append(f"link: not measured ({type(exc).__name__}: {str(exc)[:160]})")
        return {}
    notes.append(f"link: measured by the probe (cached in {cache_path()})")
    return found


def _row(scale: Mapping[Any, Any], strategy: str, memory: StepMemory, capacity_mb: float, headroom: float,
         step_s: float | None) -> dict[str, Any]:
    """One row: a scaling-table row (`scale`) with this rank's memory, fit and predicted speed."""
    n, batch, steps = scale["world_size"], scale["effective_batch"], scale["steps_per_epoch"]
    steps = None if steps is None or steps != steps else int(steps)
    share = 1 / n if strategy == "fsdp2" else 1.0
    peak = memory.sharded(n) if strategy == "fsdp2" else memory.peak
    usable = capacity_mb * headroom
    return {
        "world_size": n, "strategy": strategy, "micro_batch_size": scale["micro_batch_size"],
        "effective_batch": batch, "lr": scale["lr"], "warmup_steps": scale["warmup_steps"], "steps_per_epoch": steps,
        "params_mb": memory.params * share / MB, "grads_mb": memory.grads * share / MB,
        "optimizer_mb": memory.optimizer * share / MB, "activations_mb": memory.activations / MB, "peak_mb": peak / MB,
        "device_memory_mb": capacity_mb,
        "fits": bool(peak / MB <= usable) if memory.traced else None,
        "max_micro_batch": memory.largest_batch(usable * MB + memory.peak - peak) if memory.traced else None,
        "step_s": step_s, "samples_per_s": batch / step_s if step_s else None,
        "epoch_s": steps * step_s if steps and step_s else None,
    }


def _threads(cfg: JobConfig) -> int:
    """A rank's thread count, as the launcher gives it."""
    return cfg.dist.threads_per_rank or max(1, (os.cpu_count() or 1) // cfg.dist.procs_per_node)


def _host_steps(cfg: JobConfig, factory: Callable[..., Any], strategies: Iterable[str], sizes: list[int],
                memory: StepMemory, room: float | None, notes: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
    """The engine's step of this model measured with n ranks at once on this host (planning.probe.measured_step)
    for each strategy and each size up to a node's ranks whose n real steps fit half the memory available;
    a probe that cannot run leaves the rest to the model of the step, said why."""
    from workbench.planning.probe import measured_step

    found: dict[tuple[str, int], dict[str, Any]] = {}
    host = [n for n in sizes if n <= max(1, cfg.dist.procs_per_node)
            and not (memory.traced and room is not None and n * memory.peak > room / 2)]
    beyond = any(n not in host for n in sizes)  # then the compute of the most ranks at once is needed too
    for strategy in strategies:
        for n in host:
            try:
                found[strategy, n] = measured_step(cfg.replace(dist__strategy=strategy), factory, n, _threads(cfg),
                                                   bare=beyond and n == host[-1])
            except Exception as exc:  # noqa: BLE001 - a probe that cannot run: the step's model instead, said why
                notes.append(f"step time at {n} ranks ({strategy}): not measured with its ranks at once "
                             f"({type(exc).__name__}: {str(exc)[:160]})")
                return found
            r = found[strategy, n]
            notes.append(f"step time at {n} ranks ({strategy}): the engine's step of this model measured with {n} "
                         f"ranks stepping at once on this host ({r['step_s'] * 1000:.1f} ms, rank 0's median of "
                         f"{r['steps']}; load {r['load']:.1f})")
    return found


def _compute_s(cfg: JobConfig, factory: Callable[..., Any], device: str,
               steps: dict[tuple[str, int], dict[str, Any]], notes: list[str]) -> float | None:
    """One micro-batch's compute for the sizes the host steps did not measure: from the most ranks measured
    at once here (a node of the run shares its cores as this host does), else one rank's, measured alone."""
    bare = [(n, r) for (_, n), r in steps.items() if "bare_step_s" in r]
    if bare:
        n, most = bare[0]
        notes.append(f"step time beyond {n} ranks: the micro-batch's compute with {n} ranks stepping at once here "
                     f"({most['bare_step_s'] * 1000:.1f} ms) x {cfg.train.grad_accum_steps} accumulation steps, "
                     "plus the collectives and the engine's work a step")
        return float(most["bare_step_s"])
    compute_s = _probe(cfg, factory, device, notes)
    if compute_s is not None:
        notes.append(f"step time: one micro-batch measured on this machine ({compute_s * 1000:.1f} ms, the median "
                     f"after warm-up) x {cfg.train.grad_accum_steps} accumulation steps, plus the collectives and "
                     "the engine's work a step")
    return compute_s


def _probe(cfg: JobConfig, factory: Callable[..., Any], device: str, notes: list[str]) -> float | None:
    try:
        return micro_batch_seconds(cfg, factory, device, _threads(cfg))
    except Exception as exc:  # noqa: BLE001 - a probe that cannot run leaves the speed unknown, said why
        notes.append(f"step time: not measured ({type(exc).__name__}: {str(exc)[:160]})")
        return None


def _available_bytes() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def device_memory_mb(device: str, cfg: JobConfig) -> float:
    """A rank's device memory: the GPU's own, or on CPU this machine's memory shared by a node's ranks."""
    import torch

    if device.startswith("cuda"):
        index = int(device.split(":")[1]) if ":" in device else 0
        return torch.cuda.get_device_properties(index).total_memory / MB
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return total / MB / max(1, cfg.dist.procs_per_node)


def fit_text(frame: pd.DataFrame, headroom: float = HEADROOM) -> list[str]:
    """One line per row that does not fit, with the ways out: "world size 8 (ddp): 21400 MiB a rank >
    16384 MiB x 0.85: micro-batch <= 6"."""
    lines = []
    sharded = frame.attrs.get("fsdp2", {})
    for _, row in frame.iterrows():
        if row["fits"] is False:
            best = int(row["max_micro_batch"] or 0)
            way = f"micro-batch <= {best}" if best else "a smaller model or a larger device (no micro-batch fits)"
            if row["world_size"] in sharded and sharded[row["world_size"]][1] and row["world_size"] > 1:
                way += f", or dist.strategy: fsdp2 ({_mb(sharded[row['world_size']][0])} MiB a rank: fits)"
            lines.append(f"world size {row['world_size']} ({row['strategy']}): {_mb(row['peak_mb'])} MiB a rank > "
                         f"{_mb(row['device_memory_mb'])} MiB x {headroom:g}: {way}")
    return lines



def _mb(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
