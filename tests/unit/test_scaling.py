"""Golden tests of the scaling rules against the numbers of a reference DDP guide, plus the table,
the CLI `table`/`check` commands and the 1/2/4/8-GPU presets.

The guide: lr 5e-5 at 1 GPU -> 1e-4 / 2e-4 / 4e-4 at 2 / 4 / 8 GPUs (linear); warmup 5000 ->
10000 / 20000 / 40000; effective batch 16 x 4 x {1, 2, 4, 8} = 64 / 128 / 256 / 512; its 8-GPU
recommendation uses per-GPU batch 12: effective 384, x6 (384 / 64), lr 3e-4, warmup 30000.  The other
four guides' recommended configurations follow, each reproduced exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from workbench.cli import main
from workbench.config import JobConfig
from workbench.config.presets import PRESETS, preset
from workbench.errors import ConfigError
from workbench.config.scaling import (
    RULES,
    describe_change,
    effective_batch,
    multiplier,
    scaled,
    scaling_table,
    steps_per_epoch,
)

pytestmark = pytest.mark.timeout(30)

SIZES = (1, 2, 4, 8)
COLUMNS = ["world_size", "rule", "micro_batch_size", "grad_accum_steps", "effective_batch", "lr_multiplier",
           "lr", "warmup_steps", "steps_per_epoch", "selected"]
# world size -> (lr, warmup, effective batch) of the guide's linear rule
GUIDE_LINEAR = {1: (5e-5, 5000, 64), 2: (1e-4, 10000, 128), 4: (2e-4, 20000, 256), 8: (4e-4, 40000, 512)}


def guide(**sections: dict) -> JobConfig:
    """The guide's 1-GPU baseline: batch 16, accum 4, lr 5e-5 tuned at 1 GPU, warmup 5000."""
    data = {"train": {"micro_batch_size": 16, "grad_accum_steps": 4, "lr": 5e-5, "lr_ref_world_size": 1,
                      "warmup_steps": 5000},
            "scaling": {"rule": "linear"}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return JobConfig.from_dict(data)


# --- the rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_linear_rule_matches_the_guide(n):
    lr, warmup, batch = GUIDE_LINEAR[n]
    s = scaled(guide(), n)
    assert s.lr == pytest.approx(lr, rel=1e-12)
    assert s.warmup_steps == warmup
    assert s.effective_batch == batch
    assert s.multiplier == n and s.rule == "linear" and s.world_size == n


@pytest.mark.parametrize("n, batch", [(1, 64), (2, 128), (4, 256), (8, 512)])
def test_effective_batch(n, batch):
    assert effective_batch(16, 4, n) == batch


@pytest.mark.parametrize("n", SIZES)
def test_sqrt_rule(n):
    s = scaled(guide(scaling={"rule": "sqrt"}), n)
    assert s.lr == pytest.approx(5e-5 * math.sqrt(n), rel=1e-12)
    assert s.warmup_steps == round(5000 * math.sqrt(n))
    assert s.effective_batch == 64 * n
    assert {1: 5000, 2: 7071, 4: 10000, 8: 14142}[n] == s.warmup_steps


# --- the five guides' recommended configurations (../shared/seeds), each reproduced exactly -----------


@pytest.mark.parametrize("n, micro, lr, warmup, batch", [(1, 16, 5e-5, 5000, 64), (2, 16, 1e-4, 10000, 128),
                                                        (4, 16, 2e-4, 20000, 256), (8, 12, 3e-4, 30000, 384)])
def test_uniref50_guide_recommended_configurations(n, micro, lr, warmup, batch):
    """Tuned at 16 x 4 x 1 = 64; at 8 GPUs the per-GPU batch drops to 12 "for memory": effective 384, lr 3e-4
    (5e-5 x 6), warmup 30000 (5000 x 6).  By world size alone the 8-GPU row came out 4e-4 and 40000."""
    cfg = guide(train={"micro_batch_size": micro, "lr_ref_batch": 64})
    s = scaled(cfg, n)
    assert (s.effective_batch, s.warmup_steps, s.reference_batch) == (batch, warmup, 64)
    assert s.lr == pytest.approx(lr, rel=1e-12) and s.multiplier == batch / 64


def test_dpo_guide_scales_lr_by_total_batch_over_base_batch():
    """"lr_new = lr_base x (total_batch_size / base_batch_size)": batch 1, lr 3e-7 at 1 GPU; 4 GPUs of 1 -> 1.2e-6;
    its example of 4 GPUs with --batch_size 2 is a total of 8."""
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 1, "lr": 3e-7}, "scaling": {"rule": "linear"}})
    assert scaled(cfg, 1).lr == pytest.approx(3e-7, rel=1e-12)
    assert (scaled(cfg, 4).effective_batch, scaled(cfg, 4).lr) == (4, pytest.approx(1.2e-6, rel=1e-12))
    two = cfg.replace(train__micro_batch_size=2, train__lr_ref_batch=1)
    assert (scaled(two, 4).effective_batch, scaled(two, 4).lr) == (8, pytest.approx(2.4e-6, rel=1e-12))


def test_retrieval_guide_8_gpus_doubles_the_lr():
    """Batch 64, lr 2e-5 on one GPU; 8 GPUs of 64 (effective 512): lr 4e-5 "(scaled)": x2 at x8 the batch, which
    is the capped rule at 2 (its text also says "2x GPUs -> 2x LR": linear, reproduced at 2 GPUs)."""
    base = {"micro_batch_size": 64, "lr": 2e-5}
    capped = JobConfig.from_dict({"train": base, "scaling": {"rule": "capped", "cap": 2}})
    assert (scaled(capped, 8).effective_batch, scaled(capped, 8).lr) == (512, pytest.approx(4e-5, rel=1e-12))
    linear = JobConfig.from_dict({"train": base, "scaling": {"rule": "linear"}})
    assert scaled(linear, 2).lr == pytest.approx(4e-5, rel=1e-12)


def test_comformer_guide_4_gpus_of_64():
    """base_lr 0.001, per-GPU batch 64, 4 GPUs: effective 256, scaled_lr = base_lr x num_gpus = 0.004."""
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 64, "lr": 0.001}, "scaling": {"rule": "linear"}})
    assert (scaled(cfg, 4).effective_batch, scaled(cfg, 4).lr) == (256, pytest.approx(0.004, rel=1e-12))


def test_trainer_ddp_guide_keeps_its_lr_at_3_gpus():
    """batch_size 64 per GPU, 3 GPUs = 192 samples an iteration, AdamW lr 0.001 as configured (no rule)."""
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 64, "lr": 0.001}, "scaling": {"rule": "none"}})
    assert (scaled(cfg, 3).effective_batch, scaled(cfg, 3).lr) == (192, 0.001)


def test_the_reference_batch_defaults_to_the_tuned_world_size_and_is_checked():
    cfg = guide(train={"lr_ref_world_size": 2})
    assert scaled(cfg, 8).reference_batch == 128 and scaled(cfg, 8).multiplier == 4
    assert scaled(guide(train={"lr_ref_batch": 32}), 1).multiplier == 2  # tuned at a smaller batch: lr grows
    with pytest.raises(ConfigError, match=r"train\.lr_ref_batch: .*effective batch"):
        guide(train={"lr_ref_batch": 0})


def test_capped_rule_cap_4_as_in_the_guides_custom_scaling():
    # "scaled_lr = base_lr * min(num_gpus, 4)"
    cfg = guide(scaling={"rule": "capped", "cap": 4})
    assert [scaled(cfg, n).lr for n in SIZES] == pytest.approx([5e-5, 1e-4, 2e-4, 2e-4], rel=1e-12)


@pytest.mark.parametrize("n", SIZES)
def test_rule_none_keeps_lr_and_warmup(n):
    s = scaled(guide(scaling={"rule": "none"}), n)
    assert s.multiplier == 1.0
    assert s.lr == 5e-5 and s.warmup_steps == 5000
    assert s.effective_batch == 64 * n  # the batch still grows


@pytest.mark.parametrize("n, lr, warmup", [(1, 5e-5, 5000), (2, 1e-4, 10000), (4, 2e-4, 20000), (8, 4e-4, 40000)])
def test_reference_world_size_2(n, lr, warmup):
    # lr 1e-4 and warmup 10000 tuned at 2 GPUs: halves at 1 GPU, doubles at 4.
    cfg = guide(train={"lr": 1e-4, "warmup_steps": 10000, "lr_ref_world_size": 2})
    s = scaled(cfg, n)
    assert s.multiplier == n / 2
    assert s.lr == pytest.approx(lr, rel=1e-12)
    assert s.warmup_steps == warmup


def test_reference_world_size_2_sqrt_and_capped():
    cfg = guide(train={"lr": 1e-4, "lr_ref_world_size": 2}, scaling={"rule": "sqrt"})
    assert scaled(cfg, 8).lr == pytest.approx(2e-4, rel=1e-12)  # sqrt(8 / 2) = 2
    assert scaled(cfg, 1).lr == pytest.approx(1e-4 / math.sqrt(2), rel=1e-12)
    capped = guide(train={"lr": 1e-4, "lr_ref_world_size": 2}, scaling={"rule": "capped", "cap": 3})
    assert scaled(capped, 8).lr == pytest.approx(3e-4, rel=1e-12)  # min(4, 3)
    assert scaled(capped, 1).lr == pytest.approx(5e-5, rel=1e-12)  # min(0.5, 3)


@pytest.mark.parametrize("n", SIZES)
def test_scale_warmup_false(n):
    s = scaled(guide(scaling={"scale_warmup": False}), n)
    assert s.lr == pytest.approx(5e-5 * n, rel=1e-12)
    assert s.warmup_steps == 5000


def test_scaled_defaults_to_the_configs_own_world_size_and_rule():
    cfg = guide(dist={"procs_per_node": 4})
    assert scaled(cfg) == scaled(cfg, 4, "linear")
    assert scaled(cfg, rule="none").lr == 5e-5


def test_multiplier_and_unknown_rule():
    assert multiplier(8, 1, "linear") == 8
    assert multiplier(8, 2, "sqrt") == 2
    assert multiplier(16, 1, "capped", cap=6) == 6
    assert multiplier(3, 1, "none") == 1
    with pytest.raises(ValueError, match="scaling.rule"):
        multiplier(2, 1, "cubic")


# --- steps per epoch ---------------------------------------------------------------------------


def _brute_force_steps(n: int, micro: int, accum: int, world: int) -> int:
    """Optimizer steps each rank takes: DistributedSampler + DataLoader, both drop_last=True."""
    dataset = TensorDataset(torch.arange(n))
    counts = []
    for rank in range(world):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
        loader = DataLoader(dataset, batch_size=micro, sampler=sampler, drop_last=True)
        counts.append(sum(1 for _ in loader) // accum)
    assert len(set(counts)) == 1, counts  # every rank takes the same number of steps
    return counts[0]


CASES = [  # (dataset size, micro batch, accum, world size)
    (1000, 16, 4, 1), (1000, 16, 4, 2), (1000, 16, 4, 4), (1000, 16, 4, 8),
    (1003, 16, 4, 8), (997, 7, 3, 3), (100, 5, 2, 6), (64, 16, 4, 1), (63, 16, 4, 1), (10, 4, 1, 3),
    (50, 8, 1, 7), (24, 1, 5, 5), (8, 16, 1, 1),
]


@pytest.mark.parametrize("n, micro, accum, world", CASES)
def test_steps_per_epoch_matches_sampler_and_loader(n, micro, accum, world):
    assert steps_per_epoch(n, micro, accum, world, drop_last=True) == _brute_force_steps(n, micro, accum, world)


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("n, micro, accum, world", CASES)
def test_steps_per_epoch_matches_the_engines_count(n, micro, accum, world, drop_last):
    # The trainer builds its loader with engine.data.train_loader and takes
    # len(loader) // grad_accum_steps steps per epoch.
    from workbench.config import DataConfig
    from workbench.engine.data import train_loader

    dataset = TensorDataset(torch.arange(n))
    for rank in range(world):
        loader = train_loader(dataset, DataConfig(drop_last=drop_last), micro, rank, world, seed=0, device="cpu")
        engine_steps = len(loader) // accum
        assert steps_per_epoch(n, micro, accum, world, drop_last=drop_last) == engine_steps


def test_steps_per_epoch_in_the_table_matches_brute_force():
    cfg = guide(task={"train_samples": 1003})
    table = scaling_table(cfg, (1, 2, 3, 4, 8))
    for row in table.itertuples():
        assert row.steps_per_epoch == _brute_force_steps(1003, 16, 4, row.world_size)
    assert list(table.steps_per_epoch) == [15, 7, 5, 3, 1]


# --- the table ---------------------------------------------------------------------------------


def test_scaling_table_columns_and_values():
    table = scaling_table(guide(), SIZES, dataset_size=100_000)
    assert list(table.columns) == COLUMNS
    assert list(table.world_size) == [1, 2, 4, 8]
    assert set(table.rule) == {"linear"}
    assert list(table.micro_batch_size) == [16] * 4 and list(table.grad_accum_steps) == [4] * 4
    assert list(table.effective_batch) == [64, 128, 256, 512]
    assert list(table.lr_multiplier) == [1, 2, 4, 8]
    assert list(table.lr) == pytest.approx([5e-5, 1e-4, 2e-4, 4e-4], rel=1e-12)
    assert list(table.warmup_steps) == [5000, 10000, 20000, 40000]
    assert list(table.steps_per_epoch) == [100_000 // 64, 100_000 // 128, 100_000 // 256, 100_000 // 512]


def test_scaling_table_without_dataset_size_has_no_steps():
    table = scaling_table(guide(), SIZES)
    assert table.steps_per_epoch.isna().all()


def test_scaling_table_rule_argument():
    table = scaling_table(guide(), SIZES, rule="capped")
    assert set(table.rule) == {"capped"}
    assert list(table.lr) == pytest.approx([5e-5, 1e-4, 2e-4, 4e-4], rel=1e-12)  # default cap 8
    capped6 = scaling_table(guide(scaling={"cap": 6}), SIZES, rule="capped")
    assert list(capped6.lr) == pytest.approx([5e-5, 1e-4, 2e-4, 3e-4], rel=1e-12)
    assert list(capped6.warmup_steps) == [5000, 10000, 20000, 30000]


def test_scaling_table_compare_rules():
    cfg = guide(scaling={"rule": "capped", "cap": 6})
    table = scaling_table(cfg, SIZES, compare_rules=True, dataset_size=10_000)
    assert list(table.columns) == COLUMNS
    assert len(table) == len(RULES) * len(SIZES) == 16
    assert set(zip(table.world_size, table.rule)) == {(n, r) for n in SIZES for r in RULES}
    by = {(row.world_size, row.rule): row for row in table.itertuples()}
    for n in SIZES:
        assert by[n, "none"].lr == pytest.approx(5e-5)
        assert by[n, "linear"].lr == pytest.approx(5e-5 * n)
        assert by[n, "sqrt"].lr == pytest.approx(5e-5 * math.sqrt(n))
        assert by[n, "capped"].lr == pytest.approx(5e-5 * min(n, 6))
        assert len({by[n, r].effective_batch for r in RULES}) == 1
        assert len({by[n, r].steps_per_epoch for r in RULES}) == 1
    assert by[8, "capped"].warmup_steps == 30000


def test_selected_marks_the_configs_world_size():
    cfg = guide(dist={"procs_per_node": 4})
    table = scaling_table(cfg, SIZES)
    assert list(table.selected) == [False, False, True, False]
    compare = scaling_table(cfg, SIZES, compare_rules=True)
    assert set(compare[compare.selected].world_size) == {4}
    assert compare[compare.selected].rule.tolist() == [cfg.scaling.rule]  # the config's rule, not every rule
    two_nodes = guide(dist={"nodes": 2, "procs_per_node": 4}, launch={"executor": "slurm"})
    assert list(scaling_table(two_nodes, SIZES).selected) == [False, False, False, True]
    assert not scaling_table(guide(dist={"procs_per_node": 3}), SIZES).selected.any()


def test_describe_change():
    text = describe_change(guide(), 1, 8)
    assert "1 -> 8" in text and "linear" in text
    assert "64 -> 512" in text
    assert "5e-05 -> 0.0004" in text
    assert "5000 -> 40000" in text
    capped = describe_change(guide(scaling={"rule": "capped", "cap": 6}), 2, 8)
    assert "capped" in capped and "128 -> 512" in capped and "0.0001 -> 0.0003" in capped
    assert "10000 -> 30000" in capped


# --- CLI ---------------------------------------------------------------------------------------


def _write(tmp_path, cfg: JobConfig, name: str = "job.yaml") -> str:
    path = tmp_path / name
    cfg.to_yaml(path)
    return str(path)


def _table_rows(out: str) -> list[list[str]]:
    lines_out = out.strip().splitlines()
    at = next(i for i, line in enumerate(lines_out) if line.startswith("lr "))
    table, note = lines_out[:at], lines_out[at]
    assert "tuned at effective batch" in note, note  # where the lr scales from
    lines = [line.split() for line in table]
    assert lines[0] == COLUMNS
    return lines[1:]


def test_cli_table(tmp_path, capsys):
    path = _write(tmp_path, guide())
    assert main(["table", path, "--dataset-size", "100000"]) == 0
    out = capsys.readouterr().out
    assert "steps_per_epoch: —" not in out  # the dataset's size was given
    assert out.strip().splitlines()[-1] == ("lr 5e-05 and warmup 5000 tuned at effective batch 64 (16 x 4 x 1 rank: "
                                            "train.lr_ref_world_size; set train.lr_ref_batch to keep it when the "
                                            "per-rank batch changes); linear rule: lr x effective batch / 64")
    rows = _table_rows(out)
    col = {name: [row[i] for row in rows] for i, name in enumerate(COLUMNS)}
    assert col["world_size"] == ["1", "2", "4", "8"]
    assert col["effective_batch"] == ["64", "128", "256", "512"]
    assert col["warmup_steps"] == ["5000", "10000", "20000", "40000"]
    assert [float(v) for v in col["lr"]] == pytest.approx([5e-5, 1e-4, 2e-4, 4e-4])
    assert col["steps_per_epoch"] == ["1562", "781", "390", "195"]
    assert col["selected"] == ["no", "yes", "no", "no"]  # default procs_per_node is 2


def test_cli_table_options(tmp_path, capsys):
    path = _write(tmp_path, guide())
    assert main(["table", path, "--world-sizes", "2,8", "--rule", "capped", "--set", "scaling.cap=6"]) == 0
    rows = _table_rows(capsys.readouterr().out)
    assert [row[0] for row in rows] == ["2", "8"]
    assert [float(row[COLUMNS.index("lr")]) for row in rows] == pytest.approx([1e-4, 3e-4])
    assert [row[COLUMNS.index("warmup_steps")] for row in rows] == ["10000", "30000"]


def test_cli_table_compare(tmp_path, capsys):
    path = _write(tmp_path, guide())
    assert main(["table", path, "--compare"]) == 0
    out = capsys.readouterr().out
    assert "steps_per_epoch: — (the dataset's size is not in the config: set task.train_samples" in out
    rows = _table_rows(out)
    assert len(rows) == 16
    assert {(row[0], row[1]) for row in rows} == {(str(n), r) for n in SIZES for r in RULES}


def test_cli_table_plan_says_memory_fit_and_what_does_not_fit(tmp_path, capsys, monkeypatch):
    from workbench.planning import probe
    from workbench.planning.cost import Link

    # the probe's ranks are tests/ddp/test_plan_probe.py's: here a link and a step as the probe would give them
    monkeypatch.setattr(probe, "measured_link", lambda n, settings: Link(n, 1e-4, 1.0, 1e-3, "measured (test)"))
    monkeypatch.setattr(probe, "measured_step", lambda cfg, factory, n, threads, bare=False: {
        "step_s": 0.05 * n, "steps": 10, "load": 1.0})
    path = _write(tmp_path, guide(task={"options": {"n_train": 512}}))
    assert main(["table", path, "--world-sizes", "1,2", "--plan", "--device-memory-gb", "0.000001"]) == 0
    out = capsys.readouterr().out
    assert "plan (per rank; MiB):" in out and "memory: traced on fake tensors (torch MemTracker)" in out
    assert "2 ranks 100 us a call, 1.00 GB/s, engine 1.00 ms a step (measured (test))" in out
    assert ("step time at 2 ranks (ddp): the engine's step of this model measured with 2 ranks stepping at once on "
            "this host (100.0 ms, rank 0's median of 10; load 1.0)") in out
    assert out.count("does not fit: world size ") == 2 and " MiB x 0.85: a smaller model or a larger device" in out
    assert " NO " in out and "0 MiB a rank" not in out, out


def test_cli_check_ok(tmp_path, capsys):
    assert main(["check", _write(tmp_path, guide())]) == 0
    assert "config OK" in capsys.readouterr().out


def test_cli_check_says_when_a_ranks_step_does_not_fit_its_device_and_the_ways_out(tmp_path, capsys):
    path = _write(tmp_path, guide(task={"name": "synthetic", "options": {"dim": 256, "hidden": 2048, "classes": 16}},
                                  train={"micro_batch_size": 16}, dist={"procs_per_node": 2}))
    # 13.3 MiB: ddp's 12.8 MiB (accumulation 4: DDP's buckets beside the micro-batches' own gradients) does not
    # fit in 0.85 of it, fsdp2's 9.72 MiB (every unit's gradient whole until the last micro-batch) does
    assert main(["check", path, "--device-memory-gb", "0.013"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench: train.micro_batch_size: does not fit: world size 2 (ddp): 12.8 MiB a rank > "
                          "13.3 MiB x 0.85: a smaller model or a larger device (no micro-batch fits), or "
                          "dist.strategy: fsdp2 (9.72 MiB a rank: fits)"), err
    assert main(["check", path, "--device-memory-gb", "0.013", "--no-plan"]) == 0
    assert capsys.readouterr().out.splitlines() == ["config OK"]


def test_cli_check_says_when_the_training_set_is_smaller_than_one_step_as_the_ranks_would(tmp_path, capsys):
    """256 samples, 64 x 4 x 2 a step: an epoch of no step.  The ranks refuse it in this line; `check`
    said "config OK" (a user trial), since only the factory knows its dataset's size, which the plan's
    trace builds."""
    path = _write(tmp_path, guide(task={"name": "synthetic", "options": {"n_train": 256, "n_val": 64}},
                                  train={"micro_batch_size": 64, "grad_accum_steps": 4}, dist={"procs_per_node": 2}))
    assert main(["check", path]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["workbench: train.micro_batch_size: the training set has 256 samples but one "
                                "optimizer step needs 512 (micro_batch_size x grad_accum_steps x world_size); "
                                "lower micro_batch_size or grad_accum_steps, or use fewer ranks"], err


def test_cli_check_bad_config(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  micro_batch_size: 0\n  lr: 5e-5\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "train.micro_batch_size" in err
    assert "train.lr" not in err


def test_cli_check_reports_every_problem(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  micro_batch_sise: 8\n  epochs: many\ndata:\n  pin_memory: 'no'\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "train.micro_batch_sise" in err and "micro_batch_size" in err
    assert "train.epochs" in err and "data.pin_memory" in err


def test_cli_bad_set(tmp_path, capsys):
    path = _write(tmp_path, guide())
    assert main(["table", path, "--set", "train.lr"]) == 2
    assert "--set" in capsys.readouterr().err


# --- presets -----------------------------------------------------------------------------------


def test_presets_are_the_guides_recommended_configurations():
    expected = {1: (5e-5, 5000, 64), 2: (1e-4, 10000, 128), 4: (2e-4, 20000, 256), 8: (3e-4, 30000, 384)}
    assert PRESETS == (1, 2, 4, 8)
    for n in PRESETS:
        cfg = preset(n)
        s = scaled(cfg)
        lr, warmup, batch = expected[n]
        assert cfg.world_size == n and s.world_size == n
        assert s.lr == pytest.approx(lr, rel=1e-12)
        assert s.warmup_steps == warmup
        assert s.effective_batch == batch


def test_8_gpu_preset():
    cfg = preset(8)
    assert cfg.train.micro_batch_size == 12 and cfg.train.grad_accum_steps == 4
    assert cfg.scaling.rule == "capped" and cfg.scaling.cap == 6
    assert scaled(cfg).lr == pytest.approx(3e-4, rel=1e-12)
    assert scaled(cfg).effective_batch == 384
    assert scaled(cfg).warmup_steps == 30000


@pytest.mark.parametrize("n", PRESETS)
def test_preset_settings(n):
    cfg = preset(n)
    t, d = cfg.train, cfg.dist
    assert (t.micro_batch_size, t.grad_accum_steps) == ((12, 4) if n == 8 else (16, 4))
    assert t.lr == 5e-5 and t.lr_ref_world_size == 1 and t.warmup_steps == 5000
    assert t.precision == "bf16"
    assert cfg.scaling.rule == ("capped" if n == 8 else "linear")
    assert cfg.scaling.scale_warmup
    assert d.nodes == 1 and d.procs_per_node == n and d.backend == "nccl"
    assert d.find_unused_parameters is False and d.gradient_as_bucket_view is True
    assert cfg.data.num_workers == 4
    assert cfg.problems(gpus=n) == []
    assert "dist.backend" in [p.split(":")[0] for p in cfg.problems(gpus=0)]  # nccl needs GPUs
    assert JobConfig.from_yaml(cfg.to_yaml()) == cfg


def test_preset_keeps_the_rest_of_the_base():
    base = JobConfig.from_dict({"task": {"name": "charlm", "train_samples": 5000}, "train": {"epochs": 3},
                                "launch": {"time_limit": "2:00:00"}})
    before = base.to_dict()
    cfg = preset(4, base)
    assert cfg.task == base.task and cfg.launch == base.launch
    assert cfg.train.epochs == 3
    assert cfg.dist.procs_per_node == 4 and cfg.train.micro_batch_size == 16
    assert base.to_dict() == before  # the base is not modified


@pytest.mark.parametrize("bad", [0, 3, 16, -1])
def test_unknown_preset(bad):
    with pytest.raises(ValueError) as info:
        preset(bad)
    assert "1, 2, 4, 8" in str(info.value)
