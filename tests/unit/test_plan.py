"""workbench.plan: one rank's memory traced on fake tensors (torch's MemTracker, nothing allocated) and checked
against the same tracker on real tensors (CPU keeps no allocator statistics), fit and the largest micro-batch,
the predicted speed, and what it says when it cannot trace or measure."""

from __future__ import annotations

import resource

import pytest

import workbench
from workbench.config import JobConfig
from workbench.engine.tasks import resolve_factory
from workbench.errors import ArgumentError
from workbench.planning.cost import Link
from workbench.planning.memory import MB, step_memory
from workbench.planning.plan import COLUMNS, fit_text, plan

pytestmark = pytest.mark.timeout(180)

SHAPES = {  # task name -> options: the built-in MLP and transformer, small
    "synthetic": {"n_train": 512, "n_val": 64},
    "charlm": {"block_size": 32, "d_model": 64, "n_head": 2, "n_layer": 2},
}


def _cfg(task: str, micro: int = 8, **sections) -> JobConfig:
    data = {"task": {"name": task, "options": SHAPES.get(task, {})}, "train": {"micro_batch_size": micro},
            "dist": {"procs_per_node": 2, "threads_per_rank": 1}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return JobConfig.from_dict(data)


@pytest.mark.parametrize("task", sorted(SHAPES))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_fake_trace_is_the_real_steps_memory(task, precision):
    """Within 10% (the plan's goal).  charlm's fake trace holds a constant ~0.33 MiB more activations than its
    real step on CPU (the attention's saved tensors: a different kernel's), 11% at micro-batch 8, 7% at 16."""
    cfg = _cfg(task, micro=16, train={"precision": precision})
    fake = step_memory(cfg, resolve_factory(task), "cpu")
    real = step_memory(cfg, resolve_factory(task), "cpu", fake=False)
    assert fake.traced and real.traced, (fake.note, real.note)
    assert (fake.params, fake.grads, fake.optimizer) == (real.params, real.grads, real.optimizer)
    assert fake.optimizer == 2 * fake.params  # AdamW: two moments per parameter
    assert fake.peak == pytest.approx(real.peak, rel=0.10) and fake.activations == pytest.approx(real.activations,
                                                                                                  rel=0.10)
    assert fake.peak >= fake.params + fake.grads + fake.optimizer


def test_a_plan_has_a_row_per_world_size_with_memory_fit_and_speed():
    """The link given (the probe's processes are tests/ddp/test_plan_probe.py's): one bucket's all-reduce
    a step, its latency scaled by the ring's hops, plus the engine's work."""
    cfg = _cfg("synthetic", micro=16, train={"grad_accum_steps": 2, "lr": 1e-3}, scaling={"rule": "linear"})
    link = Link(2, 1e-3, 1.0, overhead_s=0.002)
    frame = workbench.plan(cfg, world_sizes=(1, 2, 4), link=link)
    assert list(frame.columns) == COLUMNS and frame["world_size"].tolist() == [1, 2, 4]
    assert frame["effective_batch"].tolist() == [32, 64, 128]
    assert frame["lr"].tolist() == pytest.approx([1e-3, 2e-3, 4e-3])  # tuned at 16 x 2 x 1
    assert frame["steps_per_epoch"].tolist() == [16, 8, 4]  # 512 samples: the factory's own dataset
    assert frame["fits"].all() and (frame["max_micro_batch"] > 16).all()
    assert frame["peak_mb"].nunique() == 1 and frame["peak_mb"].iloc[0] > frame["params_mb"].iloc[0] * 3
    assert (frame["step_s"] > 0).all() and frame["samples_per_s"].is_monotonic_increasing
    assert frame["epoch_s"].iloc[0] == pytest.approx(16 * frame["step_s"].iloc[0])
    assert any("measured on this machine" in n for n in frame.attrs["notes"])
    grads = frame["grads_mb"].iloc[0] * MB  # 0.56 MiB: one bucket of the engine's 25 MiB
    assert frame["step_s"].iloc[2] - frame["step_s"].iloc[1] == pytest.approx(
        link.at(4).seconds("all_reduce", grads) - link.seconds("all_reduce", grads))
    assert any("2 ranks 1000 us a call, 1.00 GB/s, engine 2.00 ms a step (given)" in n for n in frame.attrs["notes"])
    quiet = workbench.plan(cfg, world_sizes=(2,), probe=False)
    assert quiet["step_s"].isna().all() and quiet["peak_mb"].iloc[0] == frame["peak_mb"].iloc[0]


def test_a_config_that_does_not_fit_says_the_largest_micro_batch_that_does():
    cfg = _cfg("charlm", micro=32)
    full = plan(cfg, world_sizes=(8,), probe=False, device_memory_gb=1000)
    peak = full["peak_mb"].iloc[0]
    fixed = peak - full["activations_mb"].iloc[0]
    device_gb = (fixed + 0.5 * (peak - fixed)) / 0.85 / 1024  # room for about half the activations
    tight = plan(cfg, world_sizes=(8,), probe=False, device_memory_gb=device_gb)
    best = int(tight["max_micro_batch"].iloc[0])
    assert tight["fits"].tolist() == [False] and 8 <= best < 32, tight
    line = fit_text(tight)[0]
    assert line.startswith("world size 8 (ddp): ") and line.endswith(f"MiB x 0.85: micro-batch <= {best}")
    at_best = step_memory(_cfg("charlm", micro=best), resolve_factory("charlm"), "cpu", fake=False)
    assert at_best.peak / MB <= device_gb * 1024 * 0.85 * 1.05, "the largest micro-batch it names fits (within 5%)"


def test_a_model_it_cannot_trace_gets_its_weights_and_a_note_not_a_traceback():
    cfg = _cfg("tests.support.tasks_for_tests:data_dependent")
    frame = plan(cfg, world_sizes=(1, 2), probe=False)
    assert frame["fits"].isna().all() and frame["peak_mb"].isna().all() and (frame["params_mb"] > 0).all()
    note = frame.attrs["notes"][0]
    assert "could not be traced on fake tensors" in note and "weights, gradients and optimizer state only" in note


def test_a_billion_parameter_model_is_planned_without_allocating_it():
    """1.34 B parameters (5.4 GB of fp32 weights, 21 GB with AdamW and gradients) on fake tensors: the process
    grows by far less than the model, and no real step is tried on this machine."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    frame = plan(_cfg("tests.support.tasks_for_tests:billion", micro=4), world_sizes=(1, 8))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert frame["params_mb"].iloc[0] == pytest.approx(1_342_337_028 * 4 / MB, rel=0.01)
    assert frame["peak_mb"].iloc[0] > 4 * frame["params_mb"].iloc[0]  # weights, grads, two moments, activations
    assert grown_mb < 1024, f"the plan grew the process by {grown_mb:.0f} MiB"
    assert frame["step_s"].isna().all() and any("not measured" in n for n in frame.attrs["notes"])


@pytest.mark.parametrize("kwargs, message", [
    ({"strategies": ("fsdp",)}, "strategies: 'fsdp' is not one of ddp, fsdp2"),
    ({"world_sizes": (0, 2)}, "world_sizes: [0, 2]; give positive whole numbers"),
    ({"headroom": 0}, "headroom: 0; give the share of the device's memory"),
])
def test_bad_arguments_are_one_line_naming_them(kwargs, message):
    with pytest.raises(ArgumentError) as err:
        plan(_cfg("synthetic"), probe=False, **kwargs)
    assert str(err.value).startswith(message)


def test_gradient_accumulation_is_traced_with_the_first_micro_batchs_gradients_held():
    """A later micro-batch runs with the earlier ones' gradients held: traced as the real step is, and under
    fsdp2 every unit's gradient stays whole until the step's last micro-batch (nothing reduce-scattered)."""
    cfg = _cfg("charlm", micro=16, train={"grad_accum_steps": 2})
    fake = step_memory(cfg, resolve_factory("charlm"), "cpu")
    real = step_memory(cfg, resolve_factory("charlm"), "cpu", fake=False)
    assert fake.grad_accum_steps == 2 and fake.peak == pytest.approx(real.peak, rel=0.10)
    alone = step_memory(cfg.replace(train__grad_accum_steps=1), resolve_factory("charlm"), "cpu")
    for n in (2, 4):
        held = (fake.params + fake.optimizer) / n
        assert fake.sharded(n) >= held + fake.grads + fake.activations, n  # the gradients whole, not 1/n of them
        assert fake.sharded(n) > alone.sharded(n), n


def test_fsdp2_rows_shard_weights_gradients_and_optimizer_state_and_ddp_rows_say_when_fsdp2_fits():
    cfg = _cfg("charlm", micro=4, dist={"procs_per_node": 4})
    frame = plan(cfg, world_sizes=(1, 2, 4), strategies=("ddp", "fsdp2"), probe=False).set_index(
        ["world_size", "strategy"])
    assert frame.loc[(1, "fsdp2"), "peak_mb"] == pytest.approx(frame.loc[(1, "ddp"), "peak_mb"])
    for n in (2, 4):
        assert frame.loc[(n, "fsdp2"), "optimizer_mb"] == pytest.approx(frame.loc[(n, "ddp"), "optimizer_mb"] / n)
        assert frame.loc[(n, "fsdp2"), "peak_mb"] < frame.loc[(n, "ddp"), "peak_mb"]
    assert frame.loc[(4, "fsdp2"), "peak_mb"] < frame.loc[(2, "fsdp2"), "peak_mb"]
    # a device between the two: ddp does not fit at 4 ranks, fsdp2 does, and the line says so
    between = (frame.loc[(4, "fsdp2"), "peak_mb"] + frame.loc[(4, "ddp"), "peak_mb"]) / 2 / 0.85 / 1024
    ddp_only = plan(cfg, world_sizes=(4,), probe=False, device_memory_gb=between)
    assert list(ddp_only["strategy"]) == ["ddp"] and not ddp_only["fits"].iloc[0]
    assert "or dist.strategy: fsdp2 (" in fit_text(ddp_only)[0] and "a rank: fits)" in fit_text(ddp_only)[0]
    assert list(plan(cfg.replace(dist__strategy="fsdp2"), world_sizes=(2,), probe=False)["strategy"]) == ["fsdp2"]
