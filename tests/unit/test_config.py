"""Unit tests of the typed job config: YAML round trip, coercion, validation, overrides, docs."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from workbench.config import JobConfig, TrainConfig
from workbench.config.validate import parse_time_limit
from workbench.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def everything_changed() -> JobConfig:
    """A config in which every section (and nested section) differs from the default."""
    return JobConfig.from_dict({
        "task": {"name": "charlm", "options": {"seq_len": 64, "dims": [8, 16], "text": "a: b"},
                 "train_samples": 12345},
        "data": {"num_workers": 3, "pin_memory": True, "drop_last": False, "prefetch_factor": 4,
                 "persistent_workers": True},
        "train": {
            "micro_batch_size": 16, "grad_accum_steps": 4, "epochs": 7, "max_steps": 1000,
            "optimizer": "sgd", "optimizer_kwargs": {"betas": [0.9, 0.95], "eps": 1e-8, "nesterov": True},
            "lr": 5e-5, "lr_ref_world_size": 2, "warmup_steps": 5000, "schedule": "cosine",
            "min_lr_ratio": 0.1, "weight_decay": 0.01, "grad_clip_norm": None, "precision": "bf16",
            "seed": 42, "log_every_steps": 10, "eval_every_steps": 200, "checkpoint_every_steps": 500,
            "keep_checkpoints": 5,
            "early_stopping": {"metric": "val_acc", "mode": "max", "patience": 3, "min_delta": 0.001},
        },
        "scaling": {"rule": "capped", "cap": 6.0, "scale_warmup": False},
        "dist": {"nodes": 2, "procs_per_node": 4, "backend": "gloo", "find_unused_parameters": True,
                 "gradient_as_bucket_view": False, "static_graph": True, "bucket_cap_mb": 50.5,
                 "comm_hook": "fp16", "timeout_s": 1200},
        "launch": {
            "executor": "slurm", "run_root": "/scratch/runs", "name": "yes", "time_limit": "1:30:00",
            "slurm": {"partition": "gpu", "account": "proj42", "qos": "high", "mem": "64G",
                      "gpus_per_node": 4, "cpus_per_task": 8, "constraint": "a100",
                      "sbatch_options": {"reservation": "xyz", "exclusive": True, "nice": 10},
                      "setup": ["module load cuda/12.1", "export NCCL_DEBUG=INFO", "null"]},
        },
        "log": {"tensorboard": True, "wandb": True, "wandb_project": "p", "wandb_mode": "offline", "mlflow": True,
                "mlflow_tracking_uri": "file:/tmp/mlruns", "mlflow_experiment": "e"},
    })


def error_of(fn: typing.Callable[[], object]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    return info.value


def fields_of(problems: list[str]) -> list[str]:
    return ConfigError(problems).fields()


# --- YAML round trip ---------------------------------------------------------------------------


def test_default_round_trip_is_exact():
    cfg = JobConfig()
    assert JobConfig.from_yaml(cfg.to_yaml()) == cfg


def test_every_section_changed_differs_from_default():
    cfg, default = everything_changed(), JobConfig()
    for f in dataclasses.fields(JobConfig):
        assert getattr(cfg, f.name) != getattr(default, f.name), f.name
    assert cfg.train.early_stopping != default.train.early_stopping
    assert cfg.launch.slurm != default.launch.slurm


def test_every_section_changed_round_trip_is_exact():
    cfg = everything_changed()
    back = JobConfig.from_yaml(cfg.to_yaml())
    assert back == cfg
    assert back.train.optimizer_kwargs["betas"] == [0.9, 0.95]
    assert back.launch.slurm.sbatch_options == {"reservation": "xyz", "exclusive": True, "nice": 10}
    assert back.launch.slurm.setup == ["module load cuda/12.1", "export NCCL_DEBUG=INFO", "null"]
    assert back.launch.name == "yes" and back.launch.time_limit == "1:30:00"  # stayed text
    assert back.train.early_stopping.mode == "max" and back.train.early_stopping.patience == 3


@pytest.mark.parametrize("make", [JobConfig, everything_changed])
def test_round_trip_through_a_file(tmp_path, make):
    cfg = make()
    path = tmp_path / "job.yaml"
    text = cfg.to_yaml(path)
    assert path.read_text() == text
    assert JobConfig.from_yaml(path) == cfg
    assert JobConfig.from_yaml(str(path)) == cfg


def test_dict_round_trip_is_exact():
    cfg = everything_changed()
    assert JobConfig.from_dict(cfg.to_dict()) == cfg


def test_lr_written_as_5e_5_is_a_float():
    # PyYAML (YAML 1.1) reads 5e-5 (no dot) as the text "5e-5".
    import yaml

    assert yaml.safe_load("lr: 5e-5")["lr"] == "5e-5"
    cfg = JobConfig.from_yaml("train:\n  lr: 5e-5\n  warmup_steps: 5000\n")
    assert isinstance(cfg.train.lr, float)
    assert cfg.train.lr == 5e-5
    assert cfg.problems(gpus=0) == []


def test_empty_yaml_and_empty_sections_give_defaults():
    assert JobConfig.from_yaml("") == JobConfig()
    assert JobConfig.from_yaml("train:\ndist:\n") == JobConfig()


# --- validation --------------------------------------------------------------------------------


def test_default_config_is_valid_on_cpu_and_gpu():
    assert JobConfig().problems(gpus=0) == []
    assert JobConfig().problems(gpus=8) == []
    assert JobConfig().check(gpus=0) == JobConfig()


def test_micro_batch_size_zero():
    err = error_of(lambda: JobConfig.from_dict({"train": {"micro_batch_size": 0}}))
    assert err.fields() == ["train.micro_batch_size"]


def test_negative_lr():
    err = error_of(lambda: JobConfig.from_dict({"train": {"lr": -1e-4}}))
    assert err.fields() == ["train.lr"]


def test_nan_lr_is_rejected():
    err = error_of(lambda: JobConfig.from_dict({"train": {"lr": float("nan")}}))
    assert err.fields() == ["train.lr"]
    assert "finite" in err.problems[0]


def test_grad_accum_steps_zero():
    err = error_of(lambda: JobConfig.from_dict({"train": {"grad_accum_steps": 0}}))
    assert err.fields() == ["train.grad_accum_steps"]


@pytest.mark.parametrize("value", [1.5, "two", [2], True])
def test_grad_accum_steps_not_a_whole_number_when_loading(value):
    err = error_of(lambda: JobConfig.from_dict({"train": {"grad_accum_steps": value}}))
    assert err.fields() == ["train.grad_accum_steps"]


@pytest.mark.parametrize("value", [0, 1.5, "two"])
def test_grad_accum_steps_not_a_positive_int_when_built_in_python(value):
    err = error_of(lambda: JobConfig(train=TrainConfig(grad_accum_steps=value)))
    assert err.fields() == ["train.grad_accum_steps"]


def test_whole_float_is_accepted_as_int():
    assert JobConfig.from_dict({"train": {"grad_accum_steps": 2.0}}).train.grad_accum_steps == 2


def test_unknown_backend_value():
    err = error_of(lambda: JobConfig.from_yaml("dist:\n  backend: mpi\n"))
    assert err.fields() == ["dist.backend"]
    assert "gloo" in err.problems[0] and "nccl" in err.problems[0]


def test_nccl_without_cuda():
    cfg = JobConfig.from_dict({"dist": {"backend": "nccl"}})
    assert fields_of(cfg.problems(gpus=0)) == ["dist.backend"]
    assert cfg.problems(gpus=2) == []


def test_procs_per_node_above_visible_gpus():
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 4}})
    problems = cfg.problems(gpus=2)
    assert fields_of(problems) == ["dist.procs_per_node"]
    assert "only 2 GPU(s) visible; set procs_per_node <= 2" in problems[0]
    assert cfg.problems(gpus=4) == []
    assert cfg.problems(gpus=0) == []  # CPU ranks: no per-GPU limit


def test_unknown_top_level_key_suggests():
    err = error_of(lambda: JobConfig.from_yaml("trian:\n  lr: 0.1\n"))
    assert err.fields() == ["trian"]
    assert "did you mean 'train'" in err.problems[0]


def test_unknown_nested_key_suggests():
    err = error_of(lambda: JobConfig.from_yaml("train:\n  micro_batch_sise: 8\n"))
    assert err.fields() == ["train.micro_batch_sise"]
    assert "did you mean 'micro_batch_size'" in err.problems[0]


def test_unknown_deeply_nested_key():
    err = error_of(lambda: JobConfig.from_dict({"launch": {"slurm": {"partitoin": "gpu"}},
                                                "train": {"early_stopping": {"patients": 3}}}))
    assert sorted(err.fields()) == ["launch.slurm.partitoin", "train.early_stopping.patients"]
    assert any("did you mean 'partition'" in p for p in err.problems)
    assert any("did you mean 'patience'" in p for p in err.problems)


def test_bool_field_given_a_string():
    err = error_of(lambda: JobConfig.from_yaml('data:\n  pin_memory: "yes"\n'))
    assert err.fields() == ["data.pin_memory"]


def test_int_field_given_a_list():
    err = error_of(lambda: JobConfig.from_dict({"train": {"epochs": [1, 2]}}))
    assert err.fields() == ["train.epochs"]


def test_section_given_a_scalar():
    err = error_of(lambda: JobConfig.from_yaml("train: 5\n"))
    assert err.fields() == ["train"]


def test_fp16_runs_on_cpu_too():
    """torch.amp.GradScaler("cpu") and CPU fp16 autocast (torch >= 2.3): real runs in tests/ddp/test_fsdp2.py."""
    cfg = JobConfig.from_dict({"train": {"precision": "fp16"}})
    assert cfg.problems(gpus=0) == [] and cfg.problems(gpus=2) == []


@pytest.mark.parametrize("bad", ["abc", "1h", "1:2:3:4", "00:00:00", ""])
def test_malformed_time_limit(bad):
    err = error_of(lambda: JobConfig.from_dict({"launch": {"time_limit": bad}}))
    assert err.fields() == ["launch.time_limit"]


@pytest.mark.parametrize("bad", ["16 gigs", "lots", "G16", "-4G"])
def test_malformed_slurm_mem(bad):
    err = error_of(lambda: JobConfig.from_dict({"launch": {"slurm": {"mem": bad}}}))
    assert err.fields() == ["launch.slurm.mem"]


@pytest.mark.parametrize("good", ["16G", "64000M", "1T", "512"])
def test_wellformed_slurm_mem(good):
    assert JobConfig.from_dict({"launch": {"slurm": {"mem": good}}}).problems(gpus=0) == []


def test_prefetch_factor_without_workers():
    err = error_of(lambda: JobConfig.from_dict({"data": {"prefetch_factor": 2}}))
    assert err.fields() == ["data.prefetch_factor"]
    assert JobConfig.from_dict({"data": {"prefetch_factor": 2, "num_workers": 2}}).problems(gpus=0) == []


def test_local_executor_with_two_nodes():
    err = error_of(lambda: JobConfig.from_dict({"dist": {"nodes": 2}}))
    assert err.fields() == ["dist.nodes"]
    slurm = JobConfig.from_dict({"dist": {"nodes": 2}, "launch": {"executor": "slurm"}})
    assert slurm.problems(gpus=0) == []


def test_unknown_task_name():
    cfg = JobConfig.from_dict({"task": {"name": "nosuchtask"}})
    problems = cfg.problems(gpus=0)
    assert fields_of(problems) == ["task.name"]
    assert "synthetic" in problems[0]  # lists the built-ins


def test_task_in_unimportable_module():
    cfg = JobConfig.from_dict({"task": {"name": "nosuchmodule:f"}})
    problems = cfg.problems(gpus=0)
    assert fields_of(problems) == ["task.name"]
    assert "nosuchmodule" in problems[0]


def test_task_as_importable_factory_is_fine():
    cfg = JobConfig.from_dict({"task": {"name": "workbench.engine.builtin_tasks:char_lm"}})
    assert cfg.problems(gpus=0) == []


def test_several_validation_problems_are_reported_at_once():
    err = error_of(lambda: JobConfig.from_dict({
        "train": {"micro_batch_size": 0, "lr": -1.0, "precision": "fp16"},
        "data": {"prefetch_factor": 2},
        "dist": {"backend": "nccl", "nodes": 2},
        "launch": {"time_limit": "soon", "slurm": {"mem": "lots"}},
        "task": {"name": "nosuchmodule:f"},
    }))
    # Construction reports every value problem; the target's (nccl, the task) wait for problems().
    assert set(err.fields()) == {
        "train.micro_batch_size", "train.lr", "data.prefetch_factor", "dist.nodes", "launch.time_limit",
        "launch.slurm.mem",
    }
    for field in err.fields():
        assert field in str(err)


def test_several_target_problems_are_reported_at_once():
    cfg = JobConfig.from_dict({
        "train": {"precision": "fp16"}, "dist": {"backend": "nccl"}, "task": {"name": "nosuchmodule:f"},
    })
    err = error_of(lambda: cfg.check(gpus=0))
    assert set(err.fields()) == {"dist.backend", "task.name"}
    assert fields_of(cfg.problems(gpus=2)) == ["task.name"]  # GPUs there: only the task is left


def test_several_loading_problems_are_reported_at_once():
    err = error_of(lambda: JobConfig.from_dict({
        "trian": {}, "train": {"epochs": [1], "micro_batch_sise": 3, "grad_accum_steps": "two"},
        "data": {"pin_memory": "true"}, "dist": {"backend": "mpi"},
    }))
    assert sorted(err.fields()) == sorted([
        "trian", "train.epochs", "train.micro_batch_sise", "train.grad_accum_steps", "data.pin_memory",
        "dist.backend",
    ])


def test_yaml_list_at_top_level():
    err = error_of(lambda: JobConfig.from_yaml("- train\n- dist\n"))
    assert len(err.problems) == 1 and "mapping" in err.problems[0]


def test_yaml_scalar_at_top_level():
    error_of(lambda: JobConfig.from_yaml("42\n"))


def test_yaml_syntax_error():
    err = error_of(lambda: JobConfig.from_yaml("train: [1, 2\ndist: {\n"))
    assert "YAML" in err.problems[0]


def test_yaml_syntax_error_in_a_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: 0.1\n   epochs: 2\n")
    error_of(lambda: JobConfig.from_yaml(path))


# --- overrides ---------------------------------------------------------------------------------


def test_with_overrides():
    cfg = JobConfig()
    new = cfg.with_overrides(["train.lr=3e-4", "dist.procs_per_node=4"])
    assert new.train.lr == 3e-4 and isinstance(new.train.lr, float)
    assert new.dist.procs_per_node == 4
    assert new.world_size == 4
    assert cfg == JobConfig()  # the original is untouched
    assert new.with_overrides([]) == new


def test_with_overrides_nested_and_structured_values():
    new = JobConfig().with_overrides(["train.early_stopping.patience=3", "train.optimizer_kwargs={betas: [0.9, 0.95]}",
                                      "launch.slurm.setup=[module load cuda]", "train.max_steps="])
    assert new.train.early_stopping.patience == 3
    assert new.train.optimizer_kwargs == {"betas": [0.9, 0.95]}
    assert new.launch.slurm.setup == ["module load cuda"]
    assert new.train.max_steps is None


@pytest.mark.parametrize("bad", ["train.lr", "=3e-4"])
def test_malformed_override_names_set(bad):
    err = error_of(lambda: JobConfig().with_overrides([bad]))
    assert err.fields()[0].startswith("--set")
    assert bad in err.problems[0]


def test_override_of_unknown_field_suggests():
    err = error_of(lambda: JobConfig().with_overrides(["train.lrr=0.1"]))
    assert err.fields() == ["train.lrr"]
    assert "did you mean 'lr'" in err.problems[0]


def test_override_with_wrong_type():
    err = error_of(lambda: JobConfig().with_overrides(["train.epochs=many"]))
    assert err.fields() == ["train.epochs"]


def test_override_below_a_scalar_field_is_a_config_error():
    err = error_of(lambda: JobConfig().with_overrides(["train.lr.value=1"]))
    assert err.fields()[0].startswith("--set")


def test_override_with_unparsable_value_is_a_config_error():
    err = error_of(lambda: JobConfig().with_overrides(["train.optimizer_kwargs={betas: [0.9"]))
    assert err.fields()[0].startswith("--set")


# --- docs --------------------------------------------------------------------------------------


def _all_field_paths(cls: type, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    paths = []
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        paths.append(path)
        if dataclasses.is_dataclass(hints[f.name]):
            paths.extend(_all_field_paths(hints[f.name], f"{path}."))
    return paths


def test_every_field_has_a_doc():
    docs = JobConfig.docs()
    paths = _all_field_paths(JobConfig)
    assert len(paths) > 50
    assert "train.early_stopping.patience" in paths and "launch.slurm.sbatch_options" in paths
    missing = [p for p in paths if not docs.get(p, "").strip()]
    assert missing == []
    assert set(docs) == set(paths)


# --- time limits -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, minutes", [
    ("90", 90), ("1:30:00", 90), ("01:30:00", 90), ("2-00:00:00", 2880), ("45:00", 45),
    ("1-12:00:00", 2160), ("00:30:30", 31),
])
def test_parse_time_limit(text, minutes):
    assert parse_time_limit(text) == minutes


@pytest.mark.parametrize("text", ["abc", "1h", "", "00:00:00"])
def test_parse_time_limit_rejects(text):
    with pytest.raises(ValueError):
        parse_time_limit(text)


# --- safety ------------------------------------------------------------------------------------


def test_yaml_python_tags_are_rejected_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"!!python/object/apply:os.system ['touch {marker}']\n"
    error_of(lambda: JobConfig.from_yaml(payload))
    nested = f"train:\n  optimizer_kwargs: !!python/object/apply:os.system ['touch {marker}']\n"
    error_of(lambda: JobConfig.from_yaml(nested))
    path = tmp_path / "evil.yaml"
    path.write_text(nested)
    error_of(lambda: JobConfig.from_yaml(path))
    assert not marker.exists()


@pytest.mark.parametrize("text, minutes", [("90", 90), ("1:30:00", 90), ("'01:30:00'", 90), ("2-00:00:00", 2880)])
def test_time_limit_unquoted_in_yaml_is_read_as_written(text, minutes):
    from workbench.config.validate import parse_time_limit

    cfg = JobConfig.from_yaml(f"launch:\n  time_limit: {text}\n")
    assert parse_time_limit(cfg.launch.time_limit) == minutes
    assert JobConfig.from_yaml(cfg.to_yaml()) == cfg


def test_missing_config_file_is_a_clear_cli_error(tmp_path, capsys):
    from workbench.cli import main

    assert main(["check", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_gpus_are_counted_without_torch_only_where_no_device_node_could_hold_one(tmp_path, monkeypatch):
    """A machine with no GPU device node answers 0 without importing torch; a node present, a
    process that has torch already, or another system asks torch."""
    import sys

    from workbench.config import devices

    node = tmp_path / "nvidia0"
    absent = (str(tmp_path / "nvidia[0-9]*"), str(tmp_path / "kfd"))
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # put back after the test
    monkeypatch.setattr(sys, "platform", "linux")
    assert devices.no_device_nodes(absent)
    node.touch()
    assert not devices.no_device_nodes(absent)  # a GPU may be there: torch is asked
    node.unlink()
    monkeypatch.setattr(sys, "platform", "win32")
    assert not devices.no_device_nodes(absent)  # no /dev to look at
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setitem(sys.modules, "torch", object())
    assert not devices.no_device_nodes(absent)  # torch is here: asking it costs nothing
