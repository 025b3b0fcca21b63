"""The repository keeps its promises: CI runs the README's test command; import stays light."""

from __future__ import annotations

import ast
import re

import pytest

from tests.support import REPO

ROOT = REPO
pytestmark = pytest.mark.timeout(60)


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(pip install .*pytest.*)$", readme, flags=re.M)
    assert commands, "README must state the test command"
    assert commands[0] in (ROOT / ".ci" / "run").read_text()


def test_ci_lints_and_type_checks_before_the_tests():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    test_line = next(i for i, line in enumerate(lines) if line.endswith("python -m pytest"))
    assert lines[0:test_line].count("ruff check workbench") == 1
    assert lines[0:test_line].count("mypy") == 1
    assert lines.index("set -euo pipefail") < lines.index("pip install -q torch==2.13.0") < test_line


def test_readme_tells_notebook_users_to_install_the_lab_extra():
    assert 'pip install torch==2.13.0 -e ".[lab]"' in (ROOT / "README.md").read_text()




def test_no_test_is_skipped_by_what_is_on_path_at_collection():
    """On a fresh machine the test setup installs SLURM and Chromium after collection, so a `skipif` on
    `shutil.which` skips its test there every time, CI included.  Such tests ask for a fixture that installs
    what they need (`slurm_clients`, `slurm_cluster`, the browser's) and fails with CI=true where it cannot."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for tree_node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(tree_node, ast.Call) and "skipif" in ast.unparse(tree_node.func)
                    and "which(" in ast.unparse(tree_node)):
                found.append(f"{path.relative_to(REPO)}:{tree_node.lineno}")
    assert not found, found
