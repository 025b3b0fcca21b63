"""Health checks across ranks: parameters in sync, stragglers, and the data shards themselves.

Every `dist.check_every_steps` steps each rank computes a checksum per parameter (and per buffer
that DDP keeps identical) plus its recent median work time; one all_gather compares them.  Rank 0
reports a divergence (which ranks, first differing tensor) and stragglers as events.

Under fsdp2 each rank holds different shards of the parameters: there is no replica to compare,
so shards are checked for non-finite values only (replicated tensors are still compared).

Work time is step time minus the time spent waiting for the gradient all-reduce: in synchronous
DDP every rank's step takes as long as the slowest one's, so only the waiting tells them apart."""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from workbench.engine.env import DistEnv
from workbench.engine.monitor import RankMonitor
from workbench.engine.strategy import local_tensors
from workbench.runfolder import events
from workbench.runfolder.stragglers import slower_than_others

# Updated in every rank's own forward pass (BatchNorm statistics): legitimately rank-local.
RANK_LOCAL_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")
MAX_SHARD_CHECK_SAMPLES = 2_000_000


class HealthCheck:
    def __init__(self, module: torch.nn.Module, monitor: RankMonitor, env: DistEnv, device: str,
                 straggler_threshold: float, window: int = 50):
        self.monitor, self.env, self.device = monitor, env, device
        self.threshold = straggler_threshold
        self.module = module
        self.names, self.sharded = _checked_names(module)
        self.work_times: deque[float] = deque(maxlen=window)

    def record_work_time(self, seconds: float) -> None:
        self.work_times.append(seconds)

    def check(self, step: int) -> dict[str, Any]:
        """One all_gather of [checksums..., median work time]; rank 0 writes the findings."""
        started = time.perf_counter()
        mine = torch.cat([self._checksums(), torch.tensor([self._median_work()], dtype=torch.float64)])
        mine = mine.to(self.device)  # NCCL gathers device tensors only
        everyone = [torch.empty_like(mine) for _ in range(self.env.world_size)]
        dist.all_gather(everyone, mine)
        table = torch.stack([t.cpu() for t in everyone])
        found: dict[str, Any] = {"in_sync": True, "diverged_ranks": [], "first_diverged": None}
        found.update(_divergence(table[:, :-1], self.names, self.sharded))
        self.monitor.run_event(events.SYNC_CHECK, **found, check_s=time.perf_counter() - started)
        self._report_stragglers(table[:, -1].tolist())
        self.monitor.in_sync = found["in_sync"]
        return found

    def _checksums(self) -> torch.Tensor:
        with torch.no_grad():  # sum and sum of squares: cheap, and a difference almost surely shows
            parts = [_sum_and_squares(t.double()) for t in _checked_tensors(self.module)]
        return torch.cat(parts).cpu() if parts else torch.zeros(0, dtype=torch.float64)

    def _median_work(self) -> float:
        return statistics.median(self.work_times) if self.work_times else 0.0

    def _report_stragglers(self, medians: list[float]) -> None:
        for rank, (others, slower_by) in slower_than_others(medians, self.threshold).items():
            self.monitor.run_event(events.STRAGGLER, straggler_rank=rank, median_work_s=medians[rank],
                               others_median_work_s=others, slower_by=slower_by)


def _sum_and_squares(d: torch.Tensor) -> torch.Tensor:
    """[sum, sum of squares] of a float64 tensor, bit for bit what sum() and pow(2).sum() give.
    One conversion to float64 per tensor: converting each tensor twice took 10x longer on CPU
    (2.4 ms vs 0.25 ms per check for the throughput bench's 280k parameters), most of it in the
    kernel: ~900 page faults per check as fresh multi-MB buffers were mapped and unmapped."""
    return torch.stack([d.sum(), (d * d).sum()])


def _checked(module: torch.nn.Module) -> list[tuple[str, torch.Tensor, bool]]:
    """(name, this rank's tensor, is a shard) of every parameter and of the buffers ranks share."""
    return [(n, t, shard) for n, t, shard in local_tensors(module) if not n.endswith(RANK_LOCAL_BUFFERS)]


def _checked_names(module: torch.nn.Module) -> tuple[list[str], list[bool]]:
    found = _checked(module)
    return [n for n, _, _ in found], [shard for _, _, shard in found]


def _checked_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Read at every check: fully_shard swaps a module's parameters between gathered and sharded."""
    return [t for _, t, _ in _checked(module)]


def _divergence(table: torch.Tensor, names: list[str], sharded: list[bool] | None = None) -> dict[str, Any]:
    """Ranks whose checksums differ from rank 0's, the first tensor that differs, and ranks whose
    parameters are not finite (NaN/inf: a numerical problem, not a replica divergence).  Shards
    (`sharded`) differ between ranks by design: they count for finiteness only."""
    nonfinite = [r for r in range(table.shape[0]) if not torch.isfinite(table[r]).all()]
    same = (table == table[0]) | (torch.isnan(table) & torch.isnan(table[0]))
    differs = (~same).view(table.shape[0], -1, 2).any(dim=2)  # [rank, tensor]
    if sharded is not None and any(sharded):
        differs[:, torch.tensor(sharded, dtype=torch.bool)] = False
    ranks = [r for r in range(table.shape[0]) if differs[r].any()]
    found: dict[str, Any] = {"nonfinite_ranks": nonfinite} if nonfinite else {}
    if ranks:
        first = int(differs.any(dim=0).nonzero()[0])
        found.update(in_sync=False, diverged_ranks=ranks, first_diverged=names[first])
    return found


def check_shards(sampler: Any, monitor: RankMonitor, device: str = "cpu") -> dict[str, Any] | None:
    """At start: are the ranks' shards disjoint, what do they cover, does set_epoch reshuffle?

    Each rank's epoch-0 indices travel in one tensor all_gather (shards have equal length); whether
    its own order changes from epoch 0 to 1 rides along as the last element."""
    dataset_size = len(sampler.dataset)
    if dataset_size > MAX_SHARD_CHECK_SAMPLES:
        monitor.run_event(events.SHARD_CHECK, skipped=f"dataset of {dataset_size} samples is too large to check")
        return None
    start, epoch = sampler.start, sampler.epoch
    orders = []
    for e in (0, 1):
        sampler.set_epoch(e)
        orders.append(list(sampler))
    sampler.set_epoch(epoch, start=start)
    mine = torch.tensor(orders[0] + [int(orders[0] != orders[1])], dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    everyone = [t.cpu() for t in everyone]
    result = shard_report([t[:-1].tolist() for t in everyone], [bool(t[-1]) for t in everyone],
                          dataset_size, sampler.shuffle)
    monitor.run_event(events.SHARD_CHECK, **result)
    return result


def shard_report(shards: list[list[int]], reshuffled: list[bool], dataset_size: int,
                 shuffle: bool) -> dict[str, Any]:
    """shards[rank] -> epoch-0 indices: disjoint (but for the sampler's padding), coverage, reshuffling."""
    union = set().union(*map(set, shards))
    total = sum(len(s) for s in shards)
    padding = max(0, total - dataset_size)  # DistributedSampler pads (repeats) when not drop_last
    disjoint = total - len(union) <= padding
    reshuffles = any(reshuffled)
    return {"disjoint": disjoint, "covered_fraction": len(union) / max(1, dataset_size), "padded": padding,
            "reshuffles": reshuffles, "ok": disjoint and (reshuffles or not shuffle)}
