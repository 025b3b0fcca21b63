"""pyproject.toml keeps its promises: a small base install, a `lab` extra for the notebook, a `test`
extra with everything the tests, ruff and mypy need, and every third-party import declared."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra installs tomli
    import tomli as tomllib

ROOT = REPO
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
pytestmark = pytest.mark.timeout(30)

# Import name -> distribution name, where they differ.
DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow", "mlflow": "mlflow-skinny", "hydra": "hydra-core"}
OPTIONAL_EXTRAS = ("parquet", "tensorboard", "wandb", "mlflow", "sweep")
"""Extras for one feature each; their packages are imported lazily where the feature runs, and a
missing one gives a message naming the extra (or, in a rank, a warning event)."""
NOTEBOOK_ONLY = {"ipywidgets", "jupyterlab", "ipykernel"}


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def extra(name: str) -> set[str]:
    """The distributions an extra installs, following self-references such as `workbench[lab]`."""
    found: set[str] = set()
    for text in PROJECT["optional-dependencies"][name]:
        req = Requirement(text)
        if canonicalize_name(req.name) == canonicalize_name(PROJECT["name"]):
            for inner in req.extras:
                found |= extra(inner)
        else:
            found.add(canonicalize_name(req.name))
    return found


def third_party_imports(folder: Path) -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere under `folder` (lazy imports included) -> files."""
    found: dict[str, set[str]] = {}
    scripts = folder / "support" / "scripts"  # the test scripts' own modules (helper, proj), imported as a user's would be
    local = {p.stem for p in scripts.rglob("*.py")} | {p.name for p in scripts.rglob("*") if p.is_dir()}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("workbench", "tests", "__future__", *local):
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def distribution(module: str) -> str:
    return canonicalize_name(DISTRIBUTION.get(module, module))


def test_base_install_has_no_notebook_packages():
    assert not names(PROJECT["dependencies"]) & NOTEBOOK_ONLY


def test_lab_extra_has_jupyterlab_and_widgets():
    assert extra("lab") >= NOTEBOOK_ONLY


def test_test_extra_has_what_the_tests_and_linters_need():
    wanted = {"pytest", "pytest-timeout", "nbclient", "nbformat", "ipykernel", "playwright", "hypothesis",
              "ruff", "mypy", "pandas-stubs", "types-pyyaml", "ipympl", "tensorboard", "wandb", "mlflow-skinny",
              "pyarrow"}
    assert wanted | NOTEBOOK_ONLY <= extra("test")


def test_every_import_in_workbench_is_a_declared_dependency():
    base, lab, frameworks = names(PROJECT["dependencies"]), extra("lab"), extra("integrations")
    optional = set().union(*(extra(name) for name in OPTIONAL_EXTRAS))
    for module, files in third_party_imports(ROOT / "workbench").items():
        if distribution(module) in base | optional:
            continue
        if all(f.startswith("workbench/integrations/") for f in files):
            assert distribution(module) in frameworks, f"{sorted(files)} import {module}: add it to [integrations]"
            continue
        outside_ui = sorted(f for f in files if not f.startswith("workbench/ui/"))
        assert distribution(module) in lab, f"{sorted(files)} import {module}, which pyproject does not declare"
        assert not outside_ui, f"{outside_ui} import {module}, which only the lab extra installs"


def test_every_import_in_the_tests_is_installed_by_the_test_extra():
    installed = names(PROJECT["dependencies"]) | extra("test")
    for module, files in third_party_imports(ROOT / "tests").items():
        assert distribution(module) in installed, f"{sorted(files)} import {module}, not installed by the test extra"


def test_license_is_an_spdx_expression_with_a_setuptools_that_reads_it():
    assert PROJECT["license"] == "MIT"
    assert not any(c.startswith("License ::") for c in PROJECT["classifiers"]), "PEP 639: no license classifier"
    setuptools = next(Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools"))
    assert setuptools.specifier.contains("77") and not setuptools.specifier.contains("76.1")


def test_ruff_and_mypy_are_configured():
    assert PYPROJECT["tool"]["ruff"]["line-length"] == 120
    assert {"E", "F", "W", "I", "B", "UP", "SIM"} <= set(PYPROJECT["tool"]["ruff"]["lint"]["select"])
    assert PYPROJECT["tool"]["mypy"]["files"] == ["workbench"]


TEST_TOOLS = ["pytest", "pytest-xdist", "pytest-timeout", "hypothesis", "playwright", "ruff", "mypy"]


@pytest.mark.parametrize("tool", TEST_TOOLS)
def test_the_test_tools_are_pinned_to_a_range_the_suite_passed_with(tool):
    """A new machine gets the newest version a pin allows; an open upper bound let pytest 9.2 in, which
    drops xdist's groups.  Raise a bound on purpose, after a full run with the new version."""
    (req,) = [Requirement(r) for r in PROJECT["optional-dependencies"]["test"] if Requirement(r).name == tool]
    assert any(spec.operator == "<" for spec in req.specifier), f"{req}: no upper bound"
