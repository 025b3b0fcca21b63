"""The step-time model: pure arithmetic over a measured (or given) link, no torch.

A collective of `nbytes` on a ring of N ranks costs one call's latency plus its bytes on the wire at the
link's bus bandwidth (nccl-tests' busbw): all-reduce 2(N-1)/N x nbytes, all-gather and reduce-scatter
(N-1)/N x nbytes (the whole, unsharded buffer).  DDP all-reduces its gradient buckets, one call each;
FSDP2 all-gathers each unit's parameters (forward, and backward again where they were resharded) and
reduce-scatters its gradients.  A step is the micro-batches' compute, plus the collectives (DDP overlaps
them with backward: the sum is an upper bound; on CPU with one thread a rank, gloo's work competes with
the compute for the same cores, so it is mostly not hidden), plus the engine's own per-step work
measured by the probe (Link.overhead_s)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace


def ring_share(kind: str, world_size: int) -> float:
    """The share of a collective's buffer each rank sends on a ring: 2(N-1)/N for all_reduce, (N-1)/N for
    all_gather and reduce_scatter."""
    if world_size <= 1:
        return 0.0
    per = (world_size - 1) / world_size
    return 2 * per if kind == "all_reduce" else per


@dataclass(frozen=True)
class Link:
    """What a collective costs at `world_size` ranks: `latency_s` a call plus the bytes on the wire at
    `bus_gbps` GB/s; `overhead_s`: the engine's own work a step (the comm hook, the record, the loss
    reduce) at this world size, beside the model's compute."""

    world_size: int
    latency_s: float
    bus_gbps: float
    overhead_s: float = 0.0
    source: str = "given"
    """How it was had: "given", "assumed for gloo", "measured 2026-11-27 14:00 on host".  """

    def seconds(self, kind: str, nbytes: float) -> float:
        """One collective of `kind` over a buffer of `nbytes` (0 at one rank: DDP then does no
        communication worth counting beyond the latency measured at one rank)."""
        wire = ring_share(kind, self.world_size) * nbytes / (self.bus_gbps * 1e9) if self.bus_gbps > 0 else 0.0
        return self.latency_s + wire

    def at(self, world_size: int) -> Link:
        """This link at another world size: latency grows with the ring's hops, 2(N-1); the bus bandwidth
        and the engine's overhead stay (an extrapolation: the source says from which size)."""
        if world_size == self.world_size:
            return self
        hops = max(1, world_size - 1) / max(1, self.world_size - 1)
        return replace(self, world_size=world_size, latency_s=self.latency_s * hops,
                       source=f"{self.source}, scaled from {self.world_size} to {world_size} ranks")


def fit_link(world_size: int, small: tuple[float, float], large: tuple[float, float], overhead_s: float = 0.0,
             source: str = "measured") -> Link:
    """A Link from two all-reduce timings, (nbytes, seconds) each: the line through them gives the per-call
    latency (its intercept, at least 0) and the bus bandwidth (its slope over the ring's share)."""
    (b1, t1), (b2, t2) = sorted([small, large])
    if b2 <= b1:
        raise ValueError(f"fit_link needs two different sizes, got {b1} and {b2} bytes")
    per_byte = max(t2 - t1, 0.0) / (b2 - b1)
    latency = max(t1 - per_byte * b1, 0.0)
    share = ring_share("all_reduce", world_size)
    bus = share / per_byte / 1e9 if per_byte > 0 and share > 0 else 0.0
    return Link(world_size, latency, bus, overhead_s, source)


def ddp_buckets(grad_bytes: Sequence[int], bucket_cap_bytes: int, first_cap_bytes: int | None = None) -> list[int]:
    """The sizes of DDP's gradient buckets: gradients in the order backward makes them (the reverse of
    the parameters' order, as torch's Reducer rebuilds them after the first step), a bucket closed as
    soon as it reaches its cap; the first bucket's cap is `first_cap_bytes` (torch: 1 MiB when
    bucket_cap_mb is not given; the engine always gives it, so the same cap)."""
    caps = [first_cap_bytes or bucket_cap_bytes, bucket_cap_bytes]
    buckets: list[int] = []
    size = 0
    for nbytes in reversed(grad_bytes):
        size += nbytes
        if size >= caps[min(len(buckets), 1)]:
            buckets.append(size)
            size = 0
    if size:
        buckets.append(size)
    return buckets


def ddp_comm_s(link: Link, buckets: Iterable[int]) -> float:
    """DDP's gradient all-reduces of a step: one call a bucket."""
    return sum(link.seconds("all_reduce", b) for b in buckets)


def fsdp2_comm_s(link: Link, unit_bytes: Sequence[int], root_bytes: int, grad_accum_steps: int = 1,
                 reshard_after_forward: bool = True) -> float:
    """FSDP2's collectives of a step: every micro-batch all-gathers each unit's parameters for forward and,
    when they were resharded after it, again for backward, and the root's once (it keeps them for
    backward); the last micro-batch reduce-scatters every unit's gradients and the root's; the gradient
    clip all-reduces one norm."""
    gathers = 2 if reshard_after_forward else 1
    per_micro = sum(gathers * link.seconds("all_gather", b) for b in unit_bytes)
    scatters = sum(link.seconds("reduce_scatter", b) for b in unit_bytes)
    if root_bytes:
        per_micro += link.seconds("all_gather", root_bytes)
        scatters += link.seconds("reduce_scatter", root_bytes)
    return grad_accum_steps * per_micro + scatters + link.seconds("all_reduce", 8)


def step_seconds(compute_s: float, grad_accum_steps: int, comm_s: float, link: Link) -> float:
    """One optimizer step: the micro-batches' compute, the step's collectives (not hidden: see the
    module's docstring) and the engine's own work."""
    return compute_s * grad_accum_steps + comm_s + link.overhead_s
