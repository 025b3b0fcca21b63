"""A sweep's space: lists are grids, distributions are ranges, every grid point and every range's
bounds are checked against the config before any trial starts, and the CLI's --grid/--search parse
to the same space.  Pure logic (the Optuna parts that need no run: samplers and pruners by name)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import workbench
from workbench.config import JobConfig
from workbench.errors import ConfigError
from workbench.sweeps import space as sp
from workbench.sweeps.script import SweptScript

pytestmark = pytest.mark.timeout(60)


def _cfg(tmp_path) -> JobConfig:
    return JobConfig().replace(launch__run_root=str(tmp_path / "runs"))


def test_a_grid_expands_to_every_combination_first_field_slowest():
    space = sp.normalised({"train.lr": [1e-3, 1e-2], "dist.procs_per_node": [1, 2]})
    assert sp.is_grid(space)
    assert sp.grid_points(space) == [
        {"train.lr": 1e-3, "dist.procs_per_node": 1}, {"train.lr": 1e-3, "dist.procs_per_node": 2},
        {"train.lr": 1e-2, "dist.procs_per_node": 1}, {"train.lr": 1e-2, "dist.procs_per_node": 2}]


def test_the_public_namespace_makes_distributions_and_lists_sweeps(tmp_path):
    d = workbench.sweeps.loguniform(1e-4, 1e-2)
    assert (d.kind, d.low, d.high) == ("loguniform", 1e-4, 1e-2)
    assert workbench.sweeps.int_range(1, 4).corners() == [1, 4]
    assert workbench.sweeps.choice("adamw", "sgd").corners() == ["adamw", "sgd"]
    assert not sp.is_grid(sp.normalised({"train.lr": d, "train.seed": [0, 1]}))
    listed = workbench.sweeps.list_sweeps(tmp_path)
    assert list(listed.columns)[:2] == ["name", "folder"] and len(listed) == 0


def test_the_sweep_handle_is_exported_beside_run_and_pool():
    from workbench.sweeps.driver import Sweep, sweep

    assert workbench.Sweep is Sweep and workbench.sweeps.Sweep is Sweep
    assert workbench.sweep is sweep and workbench.sweeps.sweep is sweep


def test_calling_the_package_still_lists_sweeps_for_one_release_with_a_warning(tmp_path):
    """workbench.sweeps(root) was the README's way to list sweeps: it works, and says the new name."""
    with pytest.warns(DeprecationWarning, match=r"workbench\.sweeps\.list_sweeps\(root\)"):
        listed = workbench.sweeps(tmp_path)
    assert list(listed.columns)[:2] == ["name", "folder"] and len(listed) == 0


@pytest.mark.parametrize("make, args", [
    (sp.loguniform, (0, 1)), (sp.loguniform, (1e-2, 1e-4)), (sp.uniform, (1, 1)), (sp.uniform, ("a", 2)),
    (sp.int_range, (1.5, 4)), (sp.int_range, (4, 1)), (sp.choice, ()),
])
def test_a_bad_distribution_is_one_line_naming_it(make, args):
    with pytest.raises(ConfigError) as err:
        make(*args)
    assert len(err.value.problems) == 1 and make.__name__ in str(err.value)


@pytest.mark.parametrize("space, words", [
    ({"train.lrr": [1e-3]}, ["train.lrr", "unknown key", "did you mean 'lr'"]),
    ({"train.lr": [1e-3, "fast"]}, ["train.lr", "expected a number", "fast"]),
    ({"dist.procs_per_node": [1, 1.5]}, ["dist.procs_per_node", "whole number"]),
    ({"train.lr": sp.uniform(-1.0, 1.0)}, ["train.lr", "must be > 0"]),
    ({"trainlr": [1]}, ["'trainlr' is not a field", "section.field"]),
    ({"train.lr": 1e-3}, ["train.lr", "non-empty list", "loguniform"]),
    ({"train.lr": []}, ["train.lr", "non-empty list"]),
    ({"fn.steps": [1, 2]}, ["fn.steps", "pass payload=workbench.sweeps.Fn(fn)"]),
])
def test_a_bad_space_is_one_config_error_line_naming_the_field(tmp_path, space, words):
    with pytest.raises(ConfigError) as err:
        sp.check_space(_cfg(tmp_path), sp.normalised(space))
    assert len(err.value.problems) == 1, err.value.problems
    for word in words:
        assert word in str(err.value)


def test_a_swept_function_argument_must_be_one_it_takes(tmp_path):
    def train(steps, lr=0.1):
        return steps, lr

    sp.check_space(_cfg(tmp_path), sp.normalised({"fn.lr": [0.1, 0.2]}), fn=train)
    with pytest.raises(ConfigError, match="takes no argument 'momentum'; its arguments are steps, lr"):
        sp.check_space(_cfg(tmp_path), sp.normalised({"fn.momentum": [0.9]}), fn=train)
    assert sp.fn_kwargs({"fn.lr": 0.2, "train.seed": 1}) == {"lr": 0.2}


def test_applying_a_point_sets_nested_fields_and_leaves_the_rest(tmp_path):
    cfg = _cfg(tmp_path)
    out = sp.apply_params(cfg, {"train.lr": 3e-3, "task.options.hidden": 16, "fn.x": 1})
    assert out.train.lr == 3e-3 and out.task.options == {"hidden": 16} and out.dist == cfg.dist


def test_a_huge_grid_is_refused_before_it_is_built():
    with pytest.raises(ConfigError, match="the grid has 100000000 points"):
        sp.grid_points({f"train.f{i}": list(range(100)) for i in range(4)})


@pytest.mark.parametrize("text, field, values", [
    ("train.lr=1e-3,3e-3,1e-2", "train.lr", [1e-3, 3e-3, 1e-2]),
    ("dist.procs_per_node=1,2", "dist.procs_per_node", [1, 2]),
    ("train.optimizer=adamw, sgd", "train.optimizer", ["adamw", "sgd"]),
])
def test_the_grid_flag_parses_values_as_yaml(text, field, values):
    assert sp.parse_assignment(text) == (field, values)


def test_the_search_flag_parses_a_distribution():
    field, dist = sp.parse_assignment("train.lr=loguniform(1e-4,1e-2)", "--search")
    assert field == "train.lr" and dist == sp.loguniform(1e-4, 1e-2)
    assert sp.parse_assignment("train.seed=int_range(0, 3)")[1] == sp.int_range(0, 3)


@pytest.mark.parametrize("text, words", [
    ("train.lr", ["--grid 'train.lr'", "FIELD=VALUE"]), ("=1,2", ["FIELD=VALUE"]), ("train.lr=", ["FIELD=VALUE"]),
    ("train.lr=[1,", ["not valid YAML"]), ("train.lr=loguniform(1)", ["takes two numbers"]),
])
def test_a_bad_grid_flag_is_one_line(text, words):
    with pytest.raises(ConfigError) as err:
        sp.parse_assignment(text)
    assert len(err.value.problems) == 1
    for word in words:
        assert word in str(err.value)


def test_a_field_swept_twice_is_refused():
    with pytest.raises(ConfigError, match="train.lr is swept twice"):
        sp.parse_assignments(["train.lr=1,2"], ["train.lr=uniform(1,2)"])


_SCALARS = st.one_of(
    st.integers(-10**6, 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=64).filter(lambda f: f != 0 or str(f) == "0.0"),
    st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True).filter(lambda s: s not in ("true", "false", "null", "yes",
                                                                                   "no", "on", "off", "y", "n")),
    st.booleans(),
)


@given(st.from_regex(r"[a-z]{1,6}\.[a-z_]{1,8}", fullmatch=True), st.lists(_SCALARS, min_size=1, max_size=6))
def test_the_grid_flag_reads_back_any_values_written_as_the_flag(field, values):
    text = f"{field}=" + ",".join(_written(v) for v in values)
    assert sp.parse_assignment(text) == (field, values)


def _written(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def test_a_space_round_trips_through_its_json(tmp_path):
    space = sp.normalised({"train.lr": sp.loguniform(1e-4, 1e-2), "dist.procs_per_node": [1, 2],
                           "train.seed": sp.int_range(0, 6, 2), "train.optimizer": sp.choice("adamw", "sgd")})
    assert sp.space_from_json(sp.space_to_json(space)) == space


def test_samplers_and_pruners_by_name_and_a_bad_name_is_one_line():
    pytest.importorskip("optuna")
    import optuna

    from workbench.sweeps.study import make_pruner, make_sampler

    grid = sp.normalised({"train.lr": [1e-3, 1e-2]})
    assert isinstance(make_sampler(None, grid), optuna.samplers.GridSampler)
    assert isinstance(make_sampler(None, sp.normalised({"train.lr": sp.uniform(0.1, 1)})),
                      optuna.samplers.TPESampler)
    tpe = optuna.samplers.TPESampler()
    assert isinstance(make_pruner("none", tpe), optuna.pruners.NopPruner)
    assert isinstance(make_pruner(None, tpe), optuna.pruners.MedianPruner)
    custom = optuna.pruners.ThresholdPruner(upper=1.0)
    assert make_pruner(custom, tpe) is custom
    with pytest.raises(ConfigError, match="pruner: 'median2' is not one of median, percentile, hyperband, none"):
        make_pruner("median2", tpe)
    with pytest.raises(ConfigError, match="sampler: 'grid' needs every field given as a list"):
        make_sampler("grid", sp.normalised({"train.lr": sp.uniform(0.1, 1)}))


def test_a_bad_sweep_call_fails_before_anything_is_made(tmp_path):
    pytest.importorskip("optuna")
    cfg = _cfg(tmp_path)
    with pytest.raises(ConfigError, match="trials: a space with a distribution needs trials=N"):
        workbench.sweep(cfg, {"train.lr": sp.loguniform(1e-4, 1e-2)})
    with pytest.raises(ConfigError, match="parallel: 0 must be a whole number >= 1"):
        workbench.sweep(cfg, {"train.lr": [1e-3]}, parallel=0)
    with pytest.raises(ConfigError, match="train.lrr: unknown key"):
        workbench.sweep(cfg, {"train.lrr": [1e-3]})
    assert not (tmp_path / "runs").exists()


def test_without_optuna_the_sweep_names_the_extra(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    with pytest.raises(ConfigError) as err:
        workbench.sweep(_cfg(tmp_path), {"train.lr": [1e-3]})
    assert len(err.value.problems) == 1 and 'pip install "workbench[sweep]"' in str(err.value)


# --- what is swept: a script's options (args.*), a function's arguments (fn.*), a factory's options ----------


@pytest.mark.parametrize("base, params, argv", [
    (["--lr", "0.5", "--steps", "2"], {"args.lr": 1e-3}, ["--lr", "0.001", "--steps", "2"]),  # replaced in place
    (["--lr=0.5"], {"args.lr": 1e-2}, ["--lr=0.01"]),
    (["--steps", "2"], {"args.lr": 1e-3, "dist.nodes": 1}, ["--steps", "2", "--lr=0.001"]),  # appended, --k=v
    (["--steps", "2", "--", "data.txt"], {"args.amp": True}, ["--steps", "2", "--amp=true", "--", "data.txt"]),
    (["--lr", "--steps", "2"], {"args.lr": 3}, ["--lr", "3", "--steps", "2"]),  # a --lr without value
    ([], {"args.batch-size": 16, "args.optim": "sgd"}, ["--batch-size=16", "--optim=sgd"]),
    (["--lrs", "1"], {"args.lr": 1e-4}, ["--lrs", "1", "--lr=0.0001"]),  # --lrs is another option
    # nanoGPT's configurator: a config file, then --key=value only
    (["config/train_shakespeare_char.py", "--max_iters=20"], {"args.learning_rate": 2e-3},
     ["config/train_shakespeare_char.py", "--max_iters=20", "--learning_rate=0.002"]),
    # Hydra (pytorch/examples' minGPT-ddp): overrides keep their style, new ones are added with ++
    (["trainer_config.max_epochs=1", "optimizer_config.learning_rate=0.1"], {"args.optimizer_config.learning_rate": 3e-4},
     ["trainer_config.max_epochs=1", "optimizer_config.learning_rate=0.0003"]),
    (["trainer_config.max_epochs=1"], {"args.trainer_config.grad_norm_clip": 0.5},
     ["trainer_config.max_epochs=1", "++trainer_config.grad_norm_clip=0.5"]),
    (["+extra.seed=1"], {"args.extra.seed": 2}, ["+extra.seed=2"]),  # Hydra's own + kept
    ([], {"args.trainer_config.max_epochs": 2}, ["++trainer_config.max_epochs=2"]),  # dotted: Hydra
    (["--epochs", "1", "lr=0.1"], {"args.lr": 0.2}, ["--epochs", "1", "lr=0.2"]),  # an override among options
])
def test_a_script_option_replaces_its_base_argument_or_follows_them(base, params, argv):
    assert sp.script_argv(base, params) == argv


def _script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import workbench\n")
    return SweptScript.given(script, ["--epochs", "1"])


def _train(steps, lr=0.1):
    return steps, lr


@pytest.mark.parametrize("space, kind, words", [
    ({"args.lr": [1e-3]}, {}, ["space['args.lr']", "args.* fields are a swept script's options (--lr)",
                               "pass payload=workbench.sweeps.Script('train.py')"]),
    ({"args.lr": [1e-3]}, {"fn": _train}, ["space['args.lr']", "this sweep runs a function: sweep 'fn.lr'"]),
    ({"fn.lr": [1e-3]}, {"script": True}, ["space['fn.lr']", "this sweep runs a script: sweep 'args.lr' (--lr)"]),
    ({"train.lr": [1e-3]}, {"script": True}, ["space['train.lr']", "a script does not read the train section",
                                              "sweep its own argument instead, e.g. 'args.lr' (--lr)"]),
    ({"task.options.hidden": [8]}, {"fn": _train}, ["a function does not read the task section", "'fn.hidden'"]),
    ({"args.lr": [None]}, {"script": True}, ["space['args.lr']", "None is not a command-line value"]),
    ({"args.lr": [1e-3]}, {"fn": _train, "script": True}, ["sweep: fn= and script= given", "sweep one thing"]),
])
def test_a_field_that_means_nothing_to_what_is_swept_is_one_line(tmp_path, space, kind, words):
    if kind.get("script"):
        kind = {**kind, "script": _script(tmp_path)}
    with pytest.raises(ConfigError) as err:
        sp.check_space(_cfg(tmp_path), sp.normalised(space), kind.get("fn"), task=kind.get("task"),
                       script=kind.get("script"))
    assert len(err.value.problems) == 1, err.value.problems
    for word in words:
        assert word in str(err.value)


def test_a_script_sweeps_its_options_and_the_sections_it_gets(tmp_path):
    space = sp.normalised({"args.lr": [1e-3, 1e-2], "args.batch-size": sp.int_range(8, 32),
                           "dist.procs_per_node": [1, 2], "launch.time_limit": ["10"]})
    sp.check_space(_cfg(tmp_path), space, script=_script(tmp_path))
    assert sp.apply_params(_cfg(tmp_path), {"args.lr": 1e-3}) == _cfg(tmp_path)  # not a config field


def test_a_swept_script_is_resolved_named_and_kept_as_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "my-train.py").write_text("")
    swept = SweptScript.given("sub/my-train.py", ("--epochs", "1"))
    assert (swept.path, swept.args, swept.cwd) == (str(tmp_path / "sub" / "my-train.py"), ("--epochs", "1"),
                                                  str(tmp_path))
    assert SweptScript.from_json(swept.to_json()) == swept and SweptScript.from_json(None) is None
    cfg = swept.base_config(_cfg(tmp_path))
    assert cfg.task.name == "<script my-train>" and cfg.launch.name == "my-train"
    assert swept.base_config(_cfg(tmp_path).replace(launch__name="mine")).launch.name == "mine"
    module = SweptScript.given(None, ["--x", "1"], module="pkg.train_lm")
    assert (module.path, module.module, module.cwd) == ("pkg.train_lm", True, str(tmp_path))
    assert SweptScript.from_json(module.to_json()) == module
    assert module.base_config(_cfg(tmp_path)).task.name == "<script train_lm>"


def _factory(width, depth=1):
    return width, depth


def test_a_factory_sweep_binds_its_swept_options_and_leaves_the_built_in_ones(tmp_path):
    base = _cfg(tmp_path).replace(task__options={"n_train": 512, "hidden": 8})  # the built-in task's options
    cfg = sp.factory_config(base, _factory)
    assert cfg.task.name.endswith("_factory>") and cfg.task.options == {}
    sp.check_space(cfg, sp.normalised({"task.options.width": [4, 8], "train.lr": [1e-3]}), task=_factory)
    assert sp.apply_params(cfg, {"task.options.width": 4}).task.options == {"width": 4}
    with pytest.raises(ConfigError, match=r"space: task.options: _factory\(\) does not take height .*fix the space"):
        sp.check_space(cfg, sp.normalised({"task.options.height": [4]}), task=_factory)
    with pytest.raises(ConfigError, match=r"_factory\(\) needs width, which task.options does not set"):
        sp.check_space(cfg, sp.normalised({"task.options.depth": [2]}), task=_factory)
    own = sp.factory_config(base.replace(task__options={"width": 3}), _factory)
    assert own.task.options == {"width": 3}  # options the factory takes are its own: kept


def test_a_swept_option_the_named_task_does_not_take_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        sp.check_space(_cfg(tmp_path), sp.normalised({"task.options.width": [4]}))
    assert len(err.value.problems) == 1 and "the built-in task synthetic does not take width" in str(err.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"script": "nope.py"}, ["script: nope.py does not exist", "no file", "give the path"]),
    ({"script_args": ["--epochs", "1"]}, ["script_args: ['--epochs', '1'] given without script="]),
    ({"script": "train.py", "script_args": "--epochs 1"}, ["script_args: '--epochs 1' is not a list of strings"]),
    ({"script": "train.py", "script_args": ["--epochs", 1]}, ["is not a list of strings"]),
    ({"script": "train.py", "fn": _train}, ["sweep: fn= and script= given"]),
    ({"script": "train.py", "space": {"train.lr": [1e-3]}}, ["a script does not read the train section"]),
    ({"space": {"args.lr": [1e-3]}}, ["args.* fields are a swept script's options"]),
    ({"fn": _train, "space": {"fn.momentum": [0.9]}}, ["_train takes no argument 'momentum'"]),
    ({"task": _factory, "space": {"task.options.height": [4]}}, ["_factory() does not take height"]),
    ({"module": "pkg/train.py"}, ["module: 'pkg/train.py' is not a module name", "module='package.train'"]),
    ({"module": "pkg.train", "script": "train.py"}, ["module: 'pkg.train' and script: 'train.py' given"]),
    ({"module": "pkg.train", "task": _factory}, ["sweep: task= and script= given"]),
])
def test_a_bad_script_function_or_factory_sweep_fails_before_anything_is_made(tmp_path, monkeypatch, kwargs, words):
    pytest.importorskip("optuna")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import workbench\n")
    scripted = "script" in kwargs or "module" in kwargs
    space = kwargs.pop("space", {"args.lr": [1e-3]} if scripted else {"train.lr": [1e-3]})
    with pytest.raises(ConfigError) as err:
        workbench.sweep(_cfg(tmp_path), space, **kwargs)
    assert len(err.value.problems) == 1, err.value.problems
    for word in words:
        assert word in str(err.value)
    assert not (tmp_path / "runs").exists()


@given(st.lists(st.sampled_from([["--lr", "0.5"], ["--lr=0.25"], ["--steps", "3"], ["--amp"]]), max_size=5),
       st.floats(min_value=1e-8, max_value=10, allow_nan=False))
def test_the_script_parses_the_swept_value_whatever_its_base_arguments(base, lr):
    """argparse, as a torchrun-style script reads its options, sees the trial's --lr and the rest of
    the base arguments unchanged."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--amp", action="store_true")
    argv = [token for pair in base for token in pair]
    seen = parser.parse_args(sp.script_argv(argv, {"args.lr": lr}))
    assert seen.lr == lr
    assert (seen.steps, seen.amp) == (3 if "--steps" in argv else 1, "--amp" in argv)


@pytest.mark.parametrize("payload, words", [
    (workbench.sweeps.Script("nope.py"), ["script: nope.py does not exist"]),
    (workbench.sweeps.Script(None, "--epochs", "1"), ["payload: Script() has arguments ['--epochs', '1'] but no script"]),
    (workbench.sweeps.Script("train.py", "--epochs", 1), ["is not a list of strings"]),
    (workbench.sweeps.Script(module="pkg/train.py"), ["module: 'pkg/train.py' is not a module name"]),
    (workbench.sweeps.Fn(_train), ["_train takes no argument 'momentum'"]),
    ("train.py", ["payload: 'train.py' is a path; a script is payload=workbench.sweeps.Script('train.py'"]),
    (3, ["payload: 3 is not something a sweep runs"]),
])
def test_what_is_swept_is_one_argument_and_a_bad_one_is_one_line(tmp_path, monkeypatch, payload, words):
    """payload= is a task factory, Fn(fn, *args) or Script(path, *args): checked before anything is made."""
    pytest.importorskip("optuna")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import workbench\n")
    space = {"fn.momentum": [0.9]} if isinstance(payload, workbench.sweeps.Fn) else (
        {"args.lr": [1e-3]} if isinstance(payload, workbench.sweeps.Script) else {"train.lr": [1e-3]})
    with pytest.raises(ConfigError) as err:
        workbench.sweep(_cfg(tmp_path), space, payload=payload)
    assert len(err.value.problems) == 1, err.value.problems
    for word in words:
        assert word in str(err.value), str(err.value)
    assert not list((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else True


def test_the_old_keywords_still_sweep_the_same_payload_with_a_deprecation_warning():
    from workbench.sweeps.payload import Fn, Script, from_old_names, unpack

    with pytest.warns(DeprecationWarning, match="pass what is swept as payload="):
        assert from_old_names(None, {"fn": _train, "fn_args": (5,)}) == Fn(_train, 5)
    with pytest.warns(DeprecationWarning):
        assert from_old_names(None, {"script": "train.py", "script_args": ["--epochs", "1"]}) == \
            Script.of("train.py", ["--epochs", "1"], None)
    with pytest.warns(DeprecationWarning):
        assert from_old_names(None, {"task": _factory}) is _factory
    assert from_old_names(_factory, {}) is _factory  # no old keyword: no warning
    with pytest.raises(ConfigError, match="payload: given with fn=; give payload= alone"):
        from_old_names(_factory, {"fn": _train})
    with pytest.raises(TypeError, match="unexpected keyword argument 'trails'"):
        from_old_names(None, {"trails": 3})
    assert unpack(Script(module="pkg.train"))["module"] == "pkg.train"
    assert unpack(Fn(_train, 1, 2))["fn_args"] == (1, 2) and unpack(_factory)["task"] is _factory
