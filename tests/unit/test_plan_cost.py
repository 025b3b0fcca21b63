"""planning.cost: the step-time model's arithmetic (pure: no torch, no processes)."""

from __future__ import annotations

import pytest

from workbench.planning.cost import (
    Link,
    ddp_buckets,
    ddp_comm_s,
    fit_link,
    fsdp2_comm_s,
    ring_share,
    step_seconds,
)

pytestmark = pytest.mark.timeout(30)
MIB = 2**20


def test_a_ring_sends_twice_the_share_for_all_reduce_and_nothing_at_one_rank():
    assert ring_share("all_reduce", 1) == ring_share("all_gather", 1) == 0.0
    assert ring_share("all_reduce", 2) == 1.0 and ring_share("all_gather", 2) == 0.5
    assert ring_share("all_reduce", 8) == pytest.approx(1.75) and ring_share("reduce_scatter", 8) == 0.875


def test_a_link_is_fitted_through_two_timings_latency_and_bus_bandwidth():
    # 2 ranks: 100 us a call, 1 GB/s bus: an all-reduce of b bytes takes 1e-4 + 1.0 * b / 1e9
    small, large = (4096, 1e-4 + 4096 / 1e9), (8 * MIB, 1e-4 + 8 * MIB / 1e9)
    link = fit_link(2, large, small, overhead_s=0.002)
    assert link.latency_s == pytest.approx(1e-4) and link.bus_gbps == pytest.approx(1.0)
    assert link.overhead_s == 0.002 and link.world_size == 2
    assert link.seconds("all_reduce", 1e9) == pytest.approx(1e-4 + 1.0)
    assert link.seconds("all_gather", 1e9) == pytest.approx(1e-4 + 0.5)


def test_a_fit_never_gives_a_negative_latency_or_divides_by_nothing():
    noisy = fit_link(2, (4096, 5e-3), (8 * MIB, 4e-3))  # the large call measured faster: no slope
    assert noisy.latency_s == pytest.approx(5e-3) and noisy.bus_gbps == 0.0
    assert noisy.seconds("all_reduce", 10 * MIB) == pytest.approx(5e-3)
    steep = fit_link(2, (4096, 1e-6), (8 * MIB, 1e-2))  # the line crosses below zero at 0 bytes
    assert steep.latency_s == 0.0
    one = fit_link(1, (4096, 3e-5), (8 * MIB, 3.1e-5))  # one rank: no wire, the call's latency only
    assert one.bus_gbps == 0.0 and one.seconds("all_reduce", 8 * MIB) == pytest.approx(one.latency_s)
    with pytest.raises(ValueError, match="two different sizes"):
        fit_link(2, (4096, 1e-4), (4096, 2e-4))


def test_a_link_at_another_world_size_scales_the_latency_by_the_ring_hops():
    link = Link(2, 1e-4, 1.0, overhead_s=0.001, source="measured")
    eight = link.at(8)
    assert eight.latency_s == pytest.approx(7e-4) and eight.bus_gbps == 1.0 and eight.overhead_s == 0.001
    assert "scaled from 2 to 8" in eight.source and link.at(2) is link
    assert Link(1, 1e-4, 1.0).at(4).latency_s == pytest.approx(3e-4)


def test_ddp_buckets_are_cut_in_backward_order_at_the_cap():
    mib = [MIB] * 10  # ten 1 MiB gradients
    assert ddp_buckets(mib, 25 * MIB) == [10 * MIB]  # the engine's 25 MiB: one bucket
    assert ddp_buckets(mib, 4 * MIB) == [4 * MIB, 4 * MIB, 2 * MIB]
    assert ddp_buckets(mib, 4 * MIB, first_cap_bytes=MIB) == [MIB, 4 * MIB, 4 * MIB, MIB]  # torch's default
    # backward makes the last parameters' gradients first: a large last layer closes the first bucket
    assert ddp_buckets([MIB, MIB, 30 * MIB], 25 * MIB) == [30 * MIB, 2 * MIB]
    assert ddp_buckets([], 25 * MIB) == []


def test_ddp_pays_one_latency_a_bucket():
    link = Link(2, 1e-3, 1.0)
    one = ddp_comm_s(link, ddp_buckets([MIB] * 8, 25 * MIB))
    four = ddp_comm_s(link, ddp_buckets([MIB] * 8, 2 * MIB))
    assert four - one == pytest.approx(3e-3)  # the same bytes, three more calls
    assert one == pytest.approx(1e-3 + 8 * MIB / 1e9)


def test_fsdp2_gathers_every_micro_batch_and_scatters_once():
    link = Link(2, 1e-3, 1.0)
    units, root = [4 * MIB, 4 * MIB], MIB
    once = fsdp2_comm_s(link, units, root)
    # per unit: 2 gathers + 1 scatter; the root: 1 gather + 1 scatter; the clip's all-reduce
    calls = 2 * 3 + 2 + 1
    wire = 0.5 * (2 * (3 * 4 * MIB) + 2 * MIB) / 1e9 + 1.0 * 8 / 1e9
    assert once == pytest.approx(calls * 1e-3 + wire)
    kept = fsdp2_comm_s(link, units, root, reshard_after_forward=False)
    assert once - kept == pytest.approx(2 * (1e-3 + 0.5 * 4 * MIB / 1e9))  # no gather again in backward
    accum = fsdp2_comm_s(link, units, root, grad_accum_steps=4)
    per_micro = 2 * 2 * (1e-3 + 0.5 * 4 * MIB / 1e9) + (1e-3 + 0.5 * MIB / 1e9)
    assert accum - once == pytest.approx(3 * per_micro)


def test_a_step_is_compute_times_accumulation_plus_collectives_plus_the_engines_work():
    link = Link(2, 1e-3, 1.0, overhead_s=0.002)
    assert step_seconds(0.010, 4, 0.005, link) == pytest.approx(0.040 + 0.005 + 0.002)
