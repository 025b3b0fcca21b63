"""A task factory meets task.options at submit, before any process starts: its signature is bound to
them, options it does not take are one ConfigError line naming them and the fix, and options written
for a built-in task (the example config's) are not passed to a factory given as task=."""

from __future__ import annotations

import functools
import inspect
import sys

import pytest

from tests.support import REPO
from workbench.config import JobConfig
from workbench.config.tasknames import BUILTIN_OPTIONS, BUILTINS
from workbench.engine.tasks import factory_options, named_task_problem, resolve_factory
from workbench.errors import ConfigError
from workbench.launch.submit import check_before_submit, engine_payload

pytestmark = pytest.mark.timeout(60)

QUICKSTART = REPO / "examples" / "quickstart.yaml"


def my_task(hidden=64):  # docs/notebook.md's factory
    return {"hidden": hidden}


def needs_width(width, depth=2):
    return {"width": width, "depth": depth}


def test_the_built_in_option_names_are_the_factories_parameters():
    for name, target in BUILTINS.items():
        assert tuple(inspect.signature(resolve_factory(target)).parameters) == BUILTIN_OPTIONS[name], name


def test_the_docs_flow_the_example_configs_options_stay_with_the_built_in_task():
    cfg = JobConfig.from_yaml(QUICKSTART)
    assert cfg.task.name == "synthetic" and "n_train" in cfg.task.options
    submitted, factory = engine_payload(cfg, my_task)
    assert factory is my_task
    assert submitted.task.options == {}  # the config records what the factory is called with
    assert submitted.task.name.endswith("my_task>")


def test_options_the_factory_takes_are_all_passed():
    cfg = JobConfig.from_yaml(QUICKSTART).replace(task__options={"hidden": 128})
    assert engine_payload(cfg, my_task)[0].task.options == {"hidden": 128}
    everything = JobConfig.from_dict({"task": {"options": {"n_train": 64, "hidden": 8}}})
    assert factory_options(lambda **options: options, "synthetic", everything.task.options) == {"n_train": 64,
                                                                                                 "hidden": 8}
    partial = functools.partial(needs_width, 3)
    assert factory_options(partial, "synthetic", {"depth": 4}) == {"depth": 4}


def test_options_the_factory_does_not_take_are_one_line_naming_them():
    cfg = JobConfig.from_dict({"task": {"options": {"hiden": 32, "n_layers": 2}}})  # not all synthetic's
    with pytest.raises(ConfigError) as caught:
        engine_payload(cfg, my_task)
    assert caught.value.problems == [
        "task.options: my_task() does not take hiden, n_layers (it takes hidden); remove them from task.options, "
        "or add them to my_task's parameters"]


def test_a_factory_that_needs_an_option_the_config_does_not_set_says_how_to_give_it():
    with pytest.raises(ConfigError) as caught:
        engine_payload(JobConfig.from_yaml(QUICKSTART), needs_width)
    (line,) = caught.value.problems
    assert line.startswith("task.options: needs_width() needs width, and the config's task.options (n_train, "
                           "n_val, dim, hidden) are for the built-in task synthetic, so they are not passed")
    assert "cfg.replace(task__options={...})" in line
    with pytest.raises(ConfigError, match=r"needs_width\(\) needs width, which task.options does not set"):
        engine_payload(JobConfig.from_dict({"task": {"name": "pkg.mod:f", "options": {"depth": 1}}},), needs_width)


def test_a_built_in_task_with_an_option_it_does_not_take():
    cfg = JobConfig.from_dict({"task": {"name": "charlm", "options": {"hidden": 8}}})
    with pytest.raises(ConfigError) as caught:
        check_before_submit(cfg)
    assert caught.value.problems == ["task.options: the built-in task charlm does not take hidden; remove it (it "
                                     "takes block_size, d_model, n_head, n_layer, dropout, val_fraction)"]


def test_a_named_factory_is_imported_and_bound(tmp_path, monkeypatch):
    (tmp_path / "first_contact_tasks.py").write_text("def make(width, depth=2):\n    return None\nVALUE = 3\n")
    (tmp_path / "first_contact_broken.py").write_text("raise RuntimeError('no data folder here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("first_contact_tasks", "first_contact_broken"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert named_task_problem("first_contact_tasks:make", {"width": 4}) is None
    assert named_task_problem("first_contact_tasks:make", {"width": 4, "colour": 1}) == (
        "task.options: make() does not take colour (it takes depth, width); remove it from task.options, or add it "
        "to make's parameters")
    assert named_task_problem("first_contact_tasks:nope", {}) == (
        "task.name: first_contact_tasks:nope: module first_contact_tasks has no nope; check the name after the colon")
    assert named_task_problem("first_contact_tasks:VALUE", {}) == (
        "task.name: first_contact_tasks:VALUE is int, not a function; name a task factory (module:function)")
    assert named_task_problem("first_contact_broken:make", {}) == (
        "task.name: first_contact_broken:make: importing first_contact_broken raised RuntimeError: no data folder "
        "here; fix the module")
    assert named_task_problem("first_contact_missing_module:make", {}) == (
        "task.name: module 'first_contact_missing_module' is not importable; install it or add it to PYTHONPATH")
    cfg = JobConfig.from_dict({"task": {"name": "first_contact_tasks:make", "options": {"depth": 1}}})
    with pytest.raises(ConfigError, match=r"^task.options: make\(\) needs width"):
        check_before_submit(cfg)


def test_script_and_function_jobs_have_no_factory_to_bind():
    assert named_task_problem("<script train>", {"anything": 1}) is None
    assert named_task_problem("<function train>", {}) is None


def test_submit_refuses_before_any_folder_or_process_is_made(tmp_path, monkeypatch):
    import workbench

    cfg = JobConfig.from_yaml(QUICKSTART).replace(launch__run_root=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match=r"needs_width\(\) needs width"):
        workbench.submit(cfg, task=needs_width)
    (tmp_path / "first_contact_named.py").write_text("def make(width):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "first_contact_named", raising=False)
    with pytest.raises(ConfigError, match=r"make\(\) does not take n_train, n_val, dim, hidden"):
        workbench.submit(cfg.replace(task__name="first_contact_named:make"))
    assert not (tmp_path / "runs").exists()


def test_a_run_folder_written_before_the_word_payload_still_reads_its_task_pkl(tmp_path):
    """New folders hold payload.pkl; a folder written by an earlier release has task.pkl, which is read."""
    import cloudpickle

    from workbench.engine.tasks import load_task_factory
    from workbench.runfolder.layout import RunDir, SweepDir

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    assert run.payload_pickle.name == "payload.pkl"
    (run.root / "task.pkl").write_bytes(cloudpickle.dumps(_factory_for_old_folders))
    assert run.payload_pickle.name == "task.pkl"
    run.root.chmod(0o700)
    assert load_task_factory(run) is _factory_for_old_folders
    (run.root / "payload.pkl").write_bytes(b"")  # both: the new name wins
    assert run.payload_pickle.name == "payload.pkl"
    assert SweepDir(tmp_path / "run").payload_pickle.name == "payload.pkl"


def _factory_for_old_folders():
    return None


class _CallableFactory:
    def __call__(self, hidden=64):
        return my_task(hidden)


@pytest.mark.parametrize("factory", [my_task, functools.partial(my_task, 32), functools.partial(
    functools.partial(my_task), hidden=8)], ids=["function", "partial", "nested partial"])
def test_a_factory_names_its_run_by_its_function_never_by_a_repr(tmp_path, factory):
    """A partial (the usual way to fix a factory's arguments) names the run as its function does: the
    folder `my_task-<time>`, not `functools-functools-partial--function-my_task-at-0x7f...`."""
    from workbench.runfolder.layout import default_run_dir

    cfg, _ = engine_payload(JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}}), factory)
    assert cfg.task.name == f"<{__name__}.my_task>"
    assert default_run_dir(cfg).name.startswith("my_task-")


def test_a_callable_object_or_lambda_is_named_by_its_class_or_lambda():
    from workbench.engine.tasks import factory_label
    from workbench.runfolder.layout import safe_name

    assert factory_label(_CallableFactory()) == f"<{__name__}._CallableFactory>"
    assert safe_name(factory_label(lambda: None)) == "lambda"


def test_folder_names_keep_the_functions_own_name_and_only_safe_characters():
    from hypothesis import given
    from hypothesis import strategies as st

    from workbench.runfolder.layout import safe_name

    assert [safe_name(n) for n in ("pkg.mod:make", "<pkg.mod.Outer.<locals>.make>", "synthetic", "<script train>")] == [
        "make", "make", "synthetic", "script-train"]

    @given(st.text(max_size=80))
    def any_name(name):
        made = safe_name(name)
        assert 0 < len(made) <= 40 and all(c.isalnum() or c in "-_" for c in made), (name, made)

    any_name()


def test_a_function_run_of_a_partial_is_named_by_its_function(tmp_path):
    from workbench.launch.submit import fn_payload

    cfg, _ = fn_payload(functools.partial(my_task, 16), (), {}, None)
    assert cfg.task.name == "<function my_task>" and cfg.launch.name == "my_task"
