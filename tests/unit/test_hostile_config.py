"""Configs from colleagues and old runs: bounded YAML, one clear line per bad file or value, the same
line from the CLI (exit 2, no traceback) and from the notebook (ConfigError), and fuzzing that only
ever gets a ConfigError out of from_dict / from_yaml / with_overrides."""

from __future__ import annotations

import datetime
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.cli import main
from workbench.config import JobConfig
from workbench.config import yamlfile as configyaml
from workbench.errors import ConfigError

pytestmark = pytest.mark.timeout(300)
BOUND = datetime.timedelta(seconds=10)
"""Each fuzzed call must return within this (a hang detector: typical calls take milliseconds)."""
EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "100"))
"""Examples per fuzz test (raise it for a long hunt: WORKBENCH_FUZZ_EXAMPLES=5000)."""


def _bomb(levels: int = 9) -> str:
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = [f"    {names[0]}: &{names[0]} [x, x, x, x, x, x, x, x, x]"]
    lines += [f"    {n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip(names, names[1:])]
    return "task:\n  options:\n" + "\n".join(lines) + "\n"


CASES = {
    # name: (file bytes, the line the user sees without "workbench: ", with {path} for the file)
    "empty": (b"", "{path}: the file is empty; write the sections you change, e.g. train: {lr: 0.001}, "
                   "or {} for all defaults"),
    "only comments": (b"# nothing yet\n", "{path}: the file holds no settings (empty, or only comments); write the "
                                          "sections you change, e.g. train: {lr: 0.001}, or {} for all defaults"),
    "binary": (b"\x7fELF\x02\x01\x01\x00\x00", "{path}: a binary file (a NUL byte at byte 7), not a YAML config; "
                                                "give the config's .yaml file"),
    "not utf-8": (b"train:\n  lr: 0.1 # caf\xe9\n",
                  "{path}: not UTF-8 text (byte 22); give a YAML config saved as UTF-8"),
    "too large": (b"# " + b"x" * configyaml.MAX_BYTES + b"\n", "{path}: larger than the 256 KiB a config may be; is it "
                  "the right file? Keep large data in files your task factory reads"),
    "a list": (b"- train\n- dist\n",
               "{path}: the top level must be a mapping of sections (task:, train:, ...), got a list"),
    "numeric key": (b"train:\n  1: 2\n", "{path}: line 2, column 3: the key '1' is not text; names of sections, fields "
                                         "and options are words (quote it if it is meant as text: '1':)"),
    "duplicate key": (b"train:\n  lr: 0.1\n  lr: 0.2\n", "{path}: line 3, column 3: the key 'lr' appears twice in one "
                                                          "mapping (first at line 2); keep one of them"),
    "alias bomb": (_bomb().encode(), "{path}: anchors and aliases (&name, *name) expand to more than 100000 values; "
                                     "write the values out, or use fewer aliases"),
    "self alias": (b"task:\n  options: &o\n    again: *o\n", "{path}: line 2, column 12: an alias refers to the anchor "
                                                              "it is inside of; a config cannot contain itself"),
    "python tag": (b"task:\n  name: !!python/object/apply:os.system [echo pwned]\n",
                   "{path}: line 2, column 9: the tag 'tag:yaml.org,2002:python/object/apply:os.system' is not "
                   "allowed: a config holds plain data (text, numbers, lists, mappings); remove the tag"),
    "syntax": (b"train: {lr: [1}\n", "{path}: line 1, column 15: cannot parse YAML (expected ',' or ']', but got '}'); "
                                     "fix the syntax"),
    "lr inf": (b"train:\n  lr: .inf\n", "train.lr: must be a finite number, got inf; inf and nan are not allowed, "
                                        "write digits"),
    "name escapes": (b"launch:\n  name: ../../x\n", "launch.name: '../../x' holds a path separator (/ or \\), so the "
                     "run folder would land elsewhere; write one plain folder name, e.g. lr-sweep-1, or leave it "
                     "empty for the task's name (set launch.run_root to choose where runs go)"),
    "hidden name": (b"launch:\n  name: ..\n", "launch.name: '..' starts with a dot (a hidden folder, or .. to climb "
                    "out of run_root); write one plain folder name, e.g. lr-sweep-1, or leave it empty for the "
                    "task's name (set launch.run_root to choose where runs go)"),
    "NUL in run_root": (b'launch:\n  run_root: "runs\\0x"\n', "launch.run_root: 'runs\\x00x' holds a NUL or control "
                        "character; write a plain path, e.g. runs or /scratch/me/runs"),
    "option object key": (b"task:\n  options: {? [a, b] : 1}\n", "{path}: line 2, column 15: a key is a list or "
                          "mapping; names of sections, fields and options are words"),
    "huge number": (b"train:\n  seed: " + b"9" * 5000 + b"\n", "{path}: cannot read a value (Exceeds the limit (4300 "
                    "digits) for integer string conversion: value has 5000 digits); write it as plain text or "
                    "shorter digits"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_config_file_is_one_line_from_the_cli_and_the_same_error_in_python(tmp_path, capsys, case):
    data, expected = CASES[case]
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    line = expected.replace("{path}", str(path))
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err == f"workbench: {line}\n"
    with pytest.raises(ConfigError) as err:
        JobConfig.from_yaml(path)
    assert str(err.value) == line and err.value.problems == [line]


def test_a_folder_a_missing_file_and_any_extension(tmp_path, capsys, monkeypatch):
    assert main(["check", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"workbench: {tmp_path}: is a folder, not a config file; give the YAML file "
                                       "in it\n")
    assert main(["check", str(tmp_path / "gone.yaml")]) == 2
    assert capsys.readouterr().err == f"workbench: {tmp_path / 'gone.yaml'}: no such file; check the path\n"
    conf = tmp_path / "job.conf"
    conf.write_text("train:\n  lr: 0.01\n")
    monkeypatch.chdir(tmp_path)
    assert JobConfig.from_yaml("job.conf").train.lr == 0.01  # a file, not the YAML text "job.conf"
    with pytest.raises(FileNotFoundError, match="other.conf: no such file"):  # also a ConfigError
        JobConfig.from_yaml("other.conf")
    assert JobConfig.from_yaml(conf).train.lr == 0.01


def test_local_world_size_beyond_the_machine_is_rejected_with_the_fix(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("dist:\n  procs_per_node: 10000\n")
    cores = len(os.sched_getaffinity(0))
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err == (f"workbench: dist.procs_per_node: 10000 local ranks on a machine with {cores} "
                                       f"core(s); set procs_per_node <= {4 * cores} (4 per core), or run on SLURM "
                                       "(launch.executor: slurm)\n")
    assert JobConfig.from_yaml(path).problems(gpus=2)[0].startswith("dist.procs_per_node: 10000 ranks per node but "
                                                                     "only 2 GPU(s) visible")


def test_a_run_root_under_a_file_is_rejected_before_anything_is_made(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = tmp_path / "job.yaml"
    path.write_text(f"launch:\n  run_root: {blocker}/runs\n")
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err == (f"workbench: launch.run_root: {blocker} is a file, not a folder; choose a "
                                       "folder, e.g. runs\n")
    assert main(["run", str(path)]) == 2
    assert not (blocker.parent / "runs").exists()








def test_a_bug_in_workbench_still_prints_its_traceback(capsys, monkeypatch):
    import workbench.cli as cli

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(cli.parser, "cmd_check", broken)
    assert main(["check", "x.yaml"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'a bug'" in err and "this is a bug in workbench" in err


def test_options_hold_plain_data_only(tmp_path):
    import numpy as np

    cycle: dict = {}
    cycle["me"] = cycle
    wide: list = [0] * 10
    for _ in range(8):
        wide = [wide] * 10  # shared lists: 10^9 values once copied
    cases = {"task.options: the key 1 is not text; option names are words": {1: 2},
             "task.options: contains itself at me; a config holds plain data, without cycles": cycle,
             "task.options: holds more than 100000 values; keep large data in files your task factory reads":
                 {"w": wide},
             "task.options: holds np.float64(0.5) (float64) at lr; a config holds plain data (numbers, text, "
             "lists, mappings): pass objects through the task factory": {"lr": np.float64(0.5)}}
    for line, options in cases.items():
        with pytest.raises(ConfigError) as err:
            JobConfig.from_dict({"task": {"options": options}})
        assert str(err.value) == line


# --- fuzzing: only ConfigError gets out, quickly ---------------------------------------------------
SECTIONS = ["task", "data", "train", "scaling", "dist", "launch", "slurm", "options", "name", "lr", "run_root",
            "procs_per_node", "early_stopping", "optimizer_kwargs", "sbatch_options", "setup", "time_limit"]
_leaf = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20)
         | st.sampled_from(["1:30:00", "5e-5", "../x", "a/b", "runs\0", ".inf", "\ud800", "synthetic", "slurm"]))
_data = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
    st.sampled_from(SECTIONS) | st.text(max_size=8) | st.integers(), inner, max_size=6), max_leaves=40)


def _only_config_errors(call) -> None:
    try:
        cfg = call()
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and "\n" not in p for p in exc.problems)
        return
    # what is built round-trips, through YAML as through dicts
    assert JobConfig.from_yaml(cfg.to_yaml()) == cfg == JobConfig.from_dict(cfg.to_dict())


@settings(max_examples=EXAMPLES, deadline=BOUND, suppress_health_check=[HealthCheck.too_slow])
@given(_data)
def test_from_dict_of_anything_gives_a_config_or_a_config_error(data):
    _only_config_errors(lambda: JobConfig.from_dict(data))


@settings(max_examples=EXAMPLES, deadline=BOUND, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(SECTIONS[:6]), st.dictionaries(st.sampled_from(SECTIONS) | st.text(max_size=5),
                                                                     _data, max_size=4), max_size=6))
def test_from_dict_of_sections_of_anything_gives_a_config_or_a_config_error(data):
    _only_config_errors(lambda: JobConfig.from_dict(data))


YAML_BITS = ["task:", "  options:", "    a: &a [1, 2, 3]", "    b: [*a, *a, *a]", "    c: {<<: *a}", "train:",
             "  lr: .inf", "  lr: 1e999", "  lr: 5e-5", "  1: 2", "  lr: 1", "{", "[", "]", "- x", "? [a]", ": 1",
             "!!python/object:os.system", "!!binary aGk=", "!!set {a}", "2024-01-01", '"\\ud800"', '"\\0"', "\t",
             "launch:", "  name: ../x", "  run_root: ''", "dist:", "  procs_per_node: 10000", "%YAML 1.1", "---",
             "...", "&x", "*x", "*nope", "<<: *a", "'", '"', "#", "|", ">", "@", "`", "\ufeff"]


@settings(max_examples=EXAMPLES, deadline=BOUND, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(YAML_BITS) | st.text(max_size=10), max_size=12).map("\n".join))
def test_from_yaml_text_of_anything_gives_a_config_or_a_config_error(text):
    _only_config_errors(lambda: JobConfig.from_yaml(text))


@settings(max_examples=EXAMPLES, deadline=BOUND, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=3000))
def test_from_yaml_file_of_any_bytes_gives_a_config_or_a_config_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("cfg") / "job.yaml"
    path.write_bytes(data)
    _only_config_errors(lambda: JobConfig.from_yaml(path))


@settings(max_examples=EXAMPLES, deadline=BOUND)
@given(st.lists(st.text(max_size=30) | st.sampled_from(["train.lr=.inf", "task.options={a: *b}", "=", "a.b.c=1",
                                                        "launch.name=../x", "dist=3", "train.lr=[", "task.name="]),
                max_size=4))
def test_overrides_of_anything_give_a_config_or_a_config_error(assignments):
    _only_config_errors(lambda: JobConfig().with_overrides(assignments))


def test_the_largest_config_allowed_still_loads(tmp_path):
    """A file just under the size limit is parsed in full (the pure-Python parser is slow, not stuck)."""
    lines, size = ["task:", "  options:"], 0
    while size < configyaml.MAX_BYTES - 200:
        lines.append(f"    k{len(lines)}: [1, 2.5, text]")
        size += len(lines[-1]) + 1
    path = tmp_path / "big.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert len(JobConfig.from_yaml(path).task.options) == len(lines) - 2


