"""What fsdp2 shards as units (engine.strategy.pick_units), how a run continues at another world size
(config.scaling.resize), and where in an epoch it starts again (engine.data.ResumableSampler)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DistributedSampler

import workbench
from workbench.config import JobConfig
from workbench.config.scaling import resize
from workbench.engine.builtin_tasks import char_lm, synthetic_classification
from workbench.engine.data import ResumableSampler
from workbench.engine.strategy import pick_units
from workbench.errors import ConfigError
from workbench.launch.submit import model_problems

pytestmark = [pytest.mark.timeout(60)]


def test_units_are_the_repeated_blocks_else_the_large_children_and_never_split_a_tied_weight():
    lm = char_lm(n_layer=3).model
    assert [type(m).__name__ for _, m in pick_units(lm, [])] == ["TransformerEncoderLayer"] * 3
    mlp = synthetic_classification(n_train=8, n_val=8).model
    assert [path for path, _ in pick_units(mlp, [])] == ["0"]  # the 32x64 layer; the 64x4 head stays with the root

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4)) for _ in range(2))
            self.head = nn.Linear(4, 4)
            self.blocks[1][0].weight = self.head.weight  # a block sharing the head's weight

    assert [path for path, _ in pick_units(Tied(), [])] == ["blocks.0"]


def test_units_named_in_the_config_must_exist_and_the_error_lists_the_ones_that_do():
    lm = char_lm(n_layer=2).model
    assert [path for path, _ in pick_units(lm, ["LayerNorm"])] == [
        "blocks.layers.0.norm1", "blocks.layers.0.norm2", "blocks.layers.1.norm1", "blocks.layers.1.norm2", "norm"]
    with pytest.raises(ConfigError, match=r"dist.fsdp_units: the model has no Block; its module classes are .*"
                                          r"TransformerEncoderLayer"):
        pick_units(lm, ["Block"])


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


def blocks_task(n_blocks: int = 2) -> dict:
    """A factory in the submitting file (the shape `workbench.submit(cfg, task=f)` from a script)."""
    return {"model": nn.Sequential(*(Block() for _ in range(n_blocks))),
            "train_dataset": torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 8)),
            "loss_fn": nn.functional.mse_loss}


def reads_its_data_task() -> dict:
    """A factory that looks at a tensor's value: it cannot be built on the meta device."""
    if torch.randn(1).item() > 10:
        raise AssertionError("unreachable")
    return blocks_task()


def _fsdp2(*units: str, task: str = "synthetic") -> JobConfig:
    return JobConfig.from_dict({"task": {"name": task}, "dist": {"strategy": "fsdp2", "fsdp_units": list(units)}})


NO_NOPE = ("dist.fsdp_units: the model has no Nope; its module classes are Block, Linear, Sequential; list some of "
           "those, or leave it empty for its repeated blocks")


@pytest.mark.timeout(180)  # charlm's meta build imports torch._dynamo once (torch.triu): 30 s seen at load 14
def test_fsdp_units_are_checked_at_submit_against_the_model_built_without_allocating(tmp_path):
    assert model_problems(_fsdp2("Block"), blocks_task) == []
    assert model_problems(_fsdp2("Nope", "Block"), blocks_task) == [NO_NOPE]
    assert model_problems(_fsdp2("TransformerEncoderLayer", task="charlm")) == []
    [line] = model_problems(_fsdp2("Nope", task="charlm"))  # a built-in task, by name
    assert "the model has no Nope; its module classes are Dropout, Embedding, LayerNorm, Linear" in line
    # The factory is not called where nothing is to be checked (ddp, or no units named) ...
    assert model_problems(_fsdp2(), reads_its_data_task) == []
    assert model_problems(_fsdp2("Nope").replace(dist__strategy="ddp"), reads_its_data_task) == []
    # ... and one that cannot be built on the meta device is left to the ranks, which build it for real.
    assert model_problems(_fsdp2("Nope"), reads_its_data_task) == []
    cfg = _fsdp2("Nope").replace(launch__run_root=str(tmp_path / "runs"))
    with pytest.raises(ConfigError) as raised:  # the default path: nothing starts (this layer forbids processes)
        workbench.submit(cfg, task=blocks_task)
    assert str(raised.value) == NO_NOPE
    with pytest.raises(ConfigError) as raised:  # a sweep of that factory: once, before its folder is made
        workbench.sweep(cfg, {"train.lr": [1e-3, 2e-3]}, payload=blocks_task)
    assert str(raised.value) == NO_NOPE
    assert not (tmp_path / "runs").exists()


def _cfg(ranks: int, micro: int = 8, accum: int = 1, **train) -> JobConfig:
    return JobConfig.from_dict({"train": {"micro_batch_size": micro, "grad_accum_steps": accum, "lr": 1e-3,
                                          "warmup_steps": 10, **train},
                                "dist": {"procs_per_node": ranks}})


def test_a_resize_keeps_the_effective_batch_with_accumulation_and_the_lr_where_it_was_tuned():
    old = _cfg(4)  # effective batch 32, lr tuned at 8 (lr_ref_world_size 1): lr 4e-3
    smaller = resize(old, 4, _cfg(1), 1)
    assert smaller.kept_batch and smaller.config.train.grad_accum_steps == 4
    assert smaller.config.train.lr_ref_batch == 8  # pinned: 8 x 4 x 1 must not become the reference
    assert "world size 4 -> 1: grad_accum_steps 1 -> 4 keeps the effective batch 32 (lr 0.004, warmup 40" \
        in smaller.message
    same = resize(old, 4, _cfg(4), 4)
    assert same.config == _cfg(4) and same.message == ""
    again = resize(old, 4, smaller.config, 1)  # the ranks apply it to the config the submit wrote: the same
    assert again.config == smaller.config and again.message == smaller.message


def test_a_resize_that_cannot_keep_the_batch_scales_lr_and_warmup_and_says_why():
    grown = resize(_cfg(2), 2, _cfg(3), 3)
    assert not grown.kept_batch and grown.config.train.grad_accum_steps == 1
    assert "effective batch 16 -> 24, lr 0.002 -> 0.003, warmup 20 -> 30 steps" in grown.message
    assert "not a multiple of micro_batch_size 8 x 3 ranks" in grown.message
    chosen = resize(_cfg(2), 2, _cfg(1, keep_batch_on_resize=False), 1)
    assert not chosen.kept_batch and "train.keep_batch_on_resize is false" in chosen.message


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), world=st.integers(1, 4), shuffle=st.booleans(), drop_last=st.booleans(),
       epoch=st.integers(0, 3))
def test_the_sampler_is_torchs_and_starts_at_any_global_position(n, world, shuffle, drop_last, epoch):
    data = list(range(n))
    for rank in range(world):
        theirs = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last)
        ours = ResumableSampler(data, num_replicas=world, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last)
        theirs.set_epoch(epoch)
        ours.set_epoch(epoch)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
        for k in range(len(theirs) + 1):
            ours.set_epoch(epoch, start=k * world)
            assert list(ours) == list(theirs)[k:] and len(ours) == len(list(ours))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(8, 80), old=st.integers(1, 4), new=st.integers(1, 4), steps=st.integers(0, 5))
def test_an_epoch_continued_at_another_world_size_sees_each_remaining_sample_once(n, old, new, steps):
    def shards(world: int, start: int) -> list[list[int]]:
        out = []
        for rank in range(world):
            sampler = ResumableSampler(list(range(n)), num_replicas=world, rank=rank, seed=1, drop_last=True)
            sampler.set_epoch(0, start=start)
            out.append(list(sampler))
        return out

    before = shards(old, 0)
    start = min(steps * old, old * len(before[0]))  # `steps` samples a rank trained on, over `old` ranks
    seen = [i for shard in before for i in shard[:start // old]]
    after = shards(new, start)
    rest = [i for shard in after for i in shard]
    assert not set(seen) & set(rest), "no sample twice in one epoch"
    assert len(rest) == len(set(rest))
    full = ResumableSampler(list(range(n)), num_replicas=old, rank=0, seed=1, drop_last=True).epoch_order()
    # skipped at most: what drop_last cuts at the new world size, and the rest rounded down to a multiple of it
    assert len(set(full) - set(seen) - set(rest)) < 2 * new


def test_the_form_offers_the_strategy_and_its_units_like_any_other_field():
    from workbench.ui.form import ConfigForm

    form = ConfigForm(JobConfig())
    assert list(form.rows["dist.strategy"].widget.options) == ["ddp", "fsdp2"]
    form.rows["dist.strategy"].widget.value = "fsdp2"
    form.rows["dist.fsdp_units"].widget.value = "[Block, MLP]"
    assert form.config.dist.strategy == "fsdp2" and form.config.dist.fsdp_units == ["Block", "MLP"]
    assert JobConfig().with_overrides(["dist.strategy=fsdp2"]).dist.strategy == "fsdp2"  # --set
    assert JobConfig.from_yaml("dist: {strategy: fsdp2}").dist.strategy == "fsdp2"  # YAML text


def test_the_strategy_is_a_sweep_field_in_the_form_and_on_the_command_line():
    """The real sweep over it runs in tests/ddp/test_fsdp2.py."""
    from workbench.sweeps.space import parse_assignment
    from workbench.ui.form import ConfigForm

    form = ConfigForm(JobConfig())
    row = form.rows["dist.strategy"]
    row.several.value = True
    row.values.value = "ddp, fsdp2"
    assert form.problems == [] and form.space == {"dist.strategy": ["ddp", "fsdp2"]}
    assert form.config.dist.strategy == "ddp"  # the first point
    row.values.value = "ddp, fsdp3"
    assert form.problems == ["dist.strategy: unknown value 'fsdp3'; choose one of ddp, fsdp2 (one of the swept "
                             "values)"]
    assert parse_assignment("dist.strategy=ddp,fsdp2") == ("dist.strategy", ["ddp", "fsdp2"])  # --grid
