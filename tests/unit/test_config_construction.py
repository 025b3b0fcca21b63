"""A JobConfig is valid by construction: every way of building one reports every problem at once."""

from __future__ import annotations

import dataclasses
import math
import re
import typing

import pytest

from workbench.config import (
    DataConfig,
    DistConfig,
    EarlyStoppingConfig,
    JobConfig,
    LaunchConfig,
    ScalingConfig,
    SlurmConfig,
    TaskConfig,
    TrainConfig,
    validate,
)
from workbench.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

SECTIONS = [TaskConfig, DataConfig, EarlyStoppingConfig, TrainConfig, ScalingConfig, DistConfig, SlurmConfig,
            LaunchConfig, JobConfig]
MESSAGE = re.compile(r"^[\w.]+: \S.*; \S")  # "section.field: what is wrong; the fix"


def error_of(fn: typing.Callable[[], object]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    return info.value


def leaf_fields(cls: type = JobConfig, prefix: str = "") -> dict[str, typing.Any]:
    """Field path -> type hint of every non-section field."""
    hints = typing.get_type_hints(cls)
    out: dict[str, typing.Any] = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(leaf_fields(hints[f.name], f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = hints[f.name]
    return out


def section_paths(cls: type = JobConfig, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    paths = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            paths += [f"{prefix}{f.name}", *section_paths(hints[f.name], f"{prefix}{f.name}.")]
    return paths


def nested(path: str, value: object) -> dict:
    *parents, leaf = path.split(".")
    data: dict = {leaf: value}
    for part in reversed(parents):
        data = {part: data}
    return data


FLOAT_FIELDS = [p for p, hint in leaf_fields().items() if float in (hint, *typing.get_args(hint))]


# --- one pass, every problem ---------------------------------------------------------------------


def test_type_and_value_problems_come_together_in_one_error():
    err = error_of(lambda: JobConfig.from_dict({"train": {"lr": "abc", "micro_batch_size": 0}, "dist": {"nodes": 2}}))
    assert sorted(err.fields()) == ["dist.nodes", "train.lr", "train.micro_batch_size"]
    assert "local runs use one machine" in str(err)


def test_a_type_error_is_not_repeated_by_the_value_checks_of_that_field():
    err = error_of(lambda: JobConfig.from_dict({"train": {"lr": "abc"}}))
    assert err.fields() == ["train.lr"]
    # num_workers is broken, so the prefetch rule that reads it stays quiet; other rules still run.
    err = error_of(lambda: JobConfig.from_dict({"data": {"num_workers": "x", "prefetch_factor": 2},
                                                "train": {"epochs": 0}}))
    assert sorted(err.fields()) == ["data.num_workers", "train.epochs"]


def test_a_broken_section_silences_the_rules_that_read_it():
    err = error_of(lambda: JobConfig.from_dict({"launch": 5, "dist": {"nodes": 2}}))
    assert err.fields() == ["launch"]


# --- every entry path ----------------------------------------------------------------------------


def test_from_yaml_text_raises_at_load():
    err = error_of(lambda: JobConfig.from_yaml("train:\n  lr: -1\n  micro_batch_size: 0\ndist:\n  nodes: 2\n"))
    assert sorted(err.fields()) == ["dist.nodes", "train.lr", "train.micro_batch_size"]


def test_from_yaml_file_raises_at_load(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("train:\n  lr: -1\n")
    assert error_of(lambda: JobConfig.from_yaml(path)).fields() == ["train.lr"]
    assert error_of(lambda: JobConfig.from_yaml(str(path))).fields() == ["train.lr"]


def test_replace_raises():
    assert error_of(lambda: JobConfig().replace(train__lr=-1.0)).fields() == ["train.lr"]
    assert error_of(lambda: JobConfig().replace(dist__nodes=2)).fields() == ["dist.nodes"]
    ok = JobConfig().replace(dist__nodes=2, launch__executor="slurm")  # both at once: fine
    assert ok.world_size == 4


def test_replace_of_an_unknown_section_names_it():
    err = error_of(lambda: JobConfig().replace(trian__lr=0.1))
    assert err.fields() == ["trian"] and "did you mean 'train'" in err.problems[0]


def test_with_overrides_raises():
    assert error_of(lambda: JobConfig().with_overrides(["train.lr=-1"])).fields() == ["train.lr"]
    err = error_of(lambda: JobConfig().with_overrides(["train.lr=abc", "dist.nodes=2"]))
    assert sorted(err.fields()) == ["dist.nodes", "train.lr"]


def test_direct_construction_raises():
    assert error_of(lambda: JobConfig(train=TrainConfig(lr=-1.0))).fields() == ["train.lr"]
    assert error_of(lambda: TrainConfig(lr=-1.0)).fields() == ["train.lr"]
    assert error_of(lambda: EarlyStoppingConfig(patience=0)).fields() == ["train.early_stopping.patience"]
    assert error_of(lambda: SlurmConfig(mem="lots")).fields() == ["launch.slurm.mem"]
    assert error_of(lambda: DataConfig(prefetch_factor=2)).fields() == ["data.prefetch_factor"]


def test_direct_construction_reports_every_problem_of_a_section():
    err = error_of(lambda: TrainConfig(lr="abc", micro_batch_size=0, optimizer="adam"))
    assert sorted(err.fields()) == ["train.lr", "train.micro_batch_size", "train.optimizer"]


def test_rules_across_sections_run_on_the_whole_config():
    dist = DistConfig(nodes=2)  # fine on its own: SLURM can run two nodes
    assert error_of(lambda: JobConfig(dist=dist)).fields() == ["dist.nodes"]
    assert JobConfig(dist=dist, launch=LaunchConfig(executor="slurm")).world_size == 4


def test_direct_construction_converts_like_from_dict():
    t = TrainConfig(lr=1, grad_accum_steps=2.0, epochs=3)
    assert t.lr == 1.0 and isinstance(t.lr, float)
    assert t.grad_accum_steps == 2 and isinstance(t.grad_accum_steps, int)
    assert JobConfig(train=t) == JobConfig.from_dict({"train": {"lr": 1, "grad_accum_steps": 2, "epochs": 3}})


def test_a_section_of_the_wrong_type_is_named():
    err = error_of(lambda: JobConfig(train={"lr": 0.1}))
    assert err.fields() == ["train"] and "TrainConfig" in err.problems[0]
    err = error_of(lambda: TrainConfig(early_stopping={"patience": 3}))
    assert err.fields() == ["train.early_stopping"]


# --- defaults ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__name__)
def test_every_default_is_valid(cls):
    obj = cls()
    assert obj == cls()


def test_default_config_has_no_value_problems():
    assert validate.value_problems(JobConfig()) == []


# --- non-finite numbers and YAML's number forms ---------------------------------------------------


def test_there_are_float_fields_to_check():
    assert {"train.lr", "train.grad_clip_norm", "scaling.cap", "dist.stall_after_s"} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("path", FLOAT_FIELDS)
@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", ".NaN", "1e999"])
def test_non_finite_numbers_in_yaml_are_rejected(path, text):
    parts = path.split(".")
    yaml_text = "".join(f"{'  ' * i}{part}:" + (f" {text}" if i == len(parts) - 1 else "") + "\n"
                        for i, part in enumerate(parts))
    err = error_of(lambda: JobConfig.from_yaml(yaml_text))
    assert err.fields() == [path]
    assert "finite" in err.problems[0]


@pytest.mark.parametrize("path", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "inf", "nan"])
def test_non_finite_numbers_from_python_are_rejected(path, value):
    assert error_of(lambda: JobConfig.from_dict(nested(path, value))).fields() == [path]


def test_non_finite_numbers_are_rejected_by_constructors_and_overrides():
    assert error_of(lambda: TrainConfig(lr=math.nan)).fields() == ["train.lr"]
    assert error_of(lambda: ScalingConfig(cap=math.inf)).fields() == ["scaling.cap"]
    assert error_of(lambda: JobConfig().with_overrides(["train.lr=.inf"])).fields() == ["train.lr"]
    assert error_of(lambda: JobConfig().replace(dist__bucket_cap_mb=math.inf)).fields() == ["dist.bucket_cap_mb"]


def test_yaml_keeps_time_text_and_reads_exponents_as_numbers():
    cfg = JobConfig.from_yaml("train:\n  lr: 5e-5\nlaunch:\n  time_limit: 1:30:00\n")
    assert cfg.train.lr == 5e-5 and isinstance(cfg.train.lr, float)
    assert cfg.launch.time_limit == "1:30:00"


# --- messages ------------------------------------------------------------------------------------


def test_every_message_names_the_field_and_the_fix():
    bad_values = {
        "data.num_workers": -1, "data.prefetch_factor": 0, "data.persistent_workers": True,
        "train.micro_batch_size": 0, "train.grad_accum_steps": 0, "train.epochs": 0, "train.max_steps": 0,
        "train.lr": 0.0, "train.lr_ref_world_size": 0, "train.warmup_steps": -1, "train.min_lr_ratio": 2.0,
        "train.weight_decay": -0.1, "train.grad_clip_norm": 0.0, "train.log_every_steps": 0,
        "train.eval_every_steps": 0, "train.checkpoint_every_steps": 0, "train.keep_checkpoints": 0,
        "train.early_stopping.patience": 0, "train.early_stopping.min_delta": -1.0, "scaling.cap": 0.5,
        "dist.nodes": 2, "dist.procs_per_node": 0, "dist.bucket_cap_mb": 0.0, "dist.threads_per_rank": 0,
        "dist.timeout_s": 0, "dist.check_every_steps": 0, "dist.straggler_threshold": 0.0,
        "dist.stall_after_s": 0.0, "dist.lost_after_s": 1.0, "launch.time_limit": "soon", "launch.run_root": "",
        "launch.slurm.mem": "lots", "launch.slurm.gpus_per_node": -1, "launch.slurm.cpus_per_task": 0,
    }
    data: dict = {}
    for path, value in bad_values.items():
        _merge(data, nested(path, value))
    err = error_of(lambda: JobConfig.from_dict(data))
    assert set(err.fields()) == set(bad_values)
    for problem in err.problems:
        assert MESSAGE.match(problem), problem


@pytest.mark.parametrize("path, value", [
    ("train.lr", "abc"), ("train.epochs", 1.5), ("train.max_steps", "x"), ("data.pin_memory", "yes"),
    ("task.name", 5), ("train.optimizer_kwargs", [1]), ("launch.slurm.setup", "x"), ("launch.time_limit", [1]),
    ("dist.backend", "mpi"), ("train.lr", math.inf), ("trian", {}), ("train", 5),
])
def test_type_messages_name_the_field_and_the_fix(path, value):
    err = error_of(lambda: JobConfig.from_dict(nested(path, value)))
    assert err.fields() == [path]
    assert MESSAGE.match(err.problems[0]), err.problems[0]


def _merge(into: dict, data: dict) -> None:
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


# --- value versus target checks ------------------------------------------------------------------


def test_target_problems_wait_for_problems():
    cfg = JobConfig.from_dict({"train": {"precision": "fp16"}, "dist": {"backend": "nccl", "procs_per_node": 4},
                               "task": {"name": "nosuchmodule:f"}})
    assert sorted(f.split(":")[0] for f in cfg.problems(gpus=0)) == ["dist.backend", "task.name"]
    assert [f.split(":")[0] for f in cfg.problems(gpus=2)] == ["task.name", "dist.procs_per_node"]


def test_problems_still_report_value_problems_of_a_config_changed_behind_its_back():
    cfg = JobConfig()
    object.__setattr__(cfg.train, "lr", -1.0)  # what frozen=True is there to prevent
    assert [p.split(":")[0] for p in cfg.problems(gpus=0)] == ["train.lr"]


def test_every_section_has_value_rules_and_rules_read_real_fields():
    assert set(validate._SECTION_RULES) == set(section_paths())
    fields = set(leaf_fields())
    rules = [r for rules in validate._SECTION_RULES.values() for r in rules] + validate._CROSS_RULES
    for rule in rules:
        assert set(rule.reads) <= fields, rule.reads


# --- frozen --------------------------------------------------------------------------------------


def test_a_built_config_cannot_be_changed_in_place():
    cfg = JobConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.lr = -1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train = TrainConfig()  # type: ignore[misc]
    assert cfg.replace(train__lr=0.1).train.lr == 0.1 and cfg.train.lr == 1e-3


# --- cheap -----------------------------------------------------------------------------------------


