"""What workbench takes from submitit beyond its public API: the private members that
workbench/launch/executors.py and launch/local_controller.py override, call or read.  submitit is
pinned from above in pyproject.toml; raising the pin is safe once every member here still exists,
and an upgrade that removes one fails here by name instead of breaking every launch at run time."""

from __future__ import annotations

import ast
import importlib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.support import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra installs tomli
    import tomli as tomllib

pytestmark = pytest.mark.timeout(30)

PRIVATE = {
    # (submitit class, member): what workbench does with it
    ("submitit.local.local.LocalExecutor", "_submit_command"):
        "overridden: the local controller in a session of its own (executors.LocalExecutor)",
    ("submitit.slurm.slurm.SlurmExecutor", "_submit_command"):
        "overridden and called: a refused sbatch as one SubmitError line (executors.SlurmExecutor)",
    ("submitit.slurm.slurm.SlurmExecutor", "_internal_process_submissions"):
        "overridden: a batch is always one job array (executors.ArraySlurmExecutor)",
    ("submitit.slurm.slurm.SlurmExecutor", "_submitit_command_str"): "read: the command an array element runs",
    ("submitit.slurm.slurm.SlurmInfoWatcher", "_make_command"): "called by executors.SlurmWatcher.update",
    ("submitit.slurm.slurm.SlurmInfoWatcher", "_num_calls"): "counted by SlurmWatcher.update",
    ("submitit.slurm.slurm.SlurmInfoWatcher", "_output"): "set by SlurmWatcher.update (sacct's output)",
    ("submitit.slurm.slurm.SlurmInfoWatcher", "_info_dict"): "updated by SlurmWatcher.update (the jobs' states)",
    ("submitit.slurm.slurm.SlurmInfoWatcher", "_last_status_check"): "set by SlurmWatcher.update",
    ("submitit.slurm.slurm.SlurmInfoWatcher", "_registered"): "read by SlurmWatcher.update",
    ("submitit.slurm.slurm.SlurmInfoWatcher", "_finished"): "read and added to by SlurmWatcher.update",
    ("submitit.local.local.Controller", "_forward_signal"): "called: local_controller forwards USR2 to the ranks",
    ("submitit.local.local.LocalJobEnvironment", "_usr_sig"): "called: which signal submitit's ranks checkpoint on",
}
"""Every private member of submitit that workbench overrides, calls or reads."""
OWN = {"_agent_killed", "_note_ended", "_request_stop"}
"""Private methods workbench's own subclasses define (not submitit's)."""
MODULES = ("workbench/launch/executors.py", "workbench/launch/local_controller.py")


def _instance_attributes(cls: type) -> set[str]:
    """What an instance gets in __init__ (the watcher's state lives there, not on the class)."""
    if cls.__name__ == "SlurmInfoWatcher":
        return set(vars(cls(delay_s=600)))
    return set()


@pytest.mark.parametrize("path, member", sorted(PRIVATE),
                         ids=[f"{c.rsplit('.', 1)[1]}.{m}" for c, m in sorted(PRIVATE)])
def test_each_private_member_workbench_relies_on_still_exists(path, member):
    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    assert hasattr(cls, member) or member in _instance_attributes(cls), (
        f"submitit {Version(importlib.import_module('submitit').__version__)} has no {name}.{member}, which "
        f"workbench relies on ({PRIVATE[(path, member)]}): adapt workbench/launch before raising the submitit pin")


def _private_names_in_submitit_subclasses(source: str) -> set[str]:
    """Private names (one leading underscore) used or defined inside the module's classes that derive,
    directly or through the module's own classes, from a submitit class."""
    tree = ast.parse(source)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    derived: set[str] = set()
    for cls in classes:  # in order: a class derives from one defined above it
        if any("submitit" in ast.unparse(b) or ast.unparse(b) in derived for b in cls.bases):
            derived.add(cls.name)
    found = set()
    for cls in (c for c in classes if c.name in derived):
        for node in ast.walk(cls):
            name = node.attr if isinstance(node, ast.Attribute) else node.name if isinstance(node, ast.FunctionDef) \
                else None
            if name and name.startswith("_") and not name.startswith("__"):
                found.add(name)
    return found


def test_the_list_names_every_private_member_the_subclasses_use():
    """The list above is complete: a new override or call of a submitit private member is listed
    (or, if workbench defines it itself, named in OWN)."""
    used = set().union(*(_private_names_in_submitit_subclasses((REPO / m).read_text()) for m in MODULES))
    assert used - OWN - {member for _, member in PRIVATE} == set()


def test_submitit_is_pinned_from_above_to_a_range_the_installed_version_is_in():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (requirement,) = [Requirement(r) for r in pyproject["project"]["dependencies"] if r.startswith("submitit")]
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in requirement.specifier), requirement
    installed = Version(importlib.import_module("submitit").__version__)
    assert installed in requirement.specifier, f"submitit {installed} is outside {requirement}"
