"""The house keeps its layout: code that runs inside a rank lives in workbench/engine and imports
nothing from the submitting side or the widgets; nothing outside ui/ imports ui/ at module level;
no import cycles, lazy ones included (but for the one-line Run.dashboard convenience)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
pytestmark = pytest.mark.timeout(60)
ALLOWED_LAZY = {("workbench.launch.run", "workbench.ui.dashboard")}
"""Run.dashboard(): a lazy one-line convenience the layout allows."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported workbench module, at module level?) for every import in the file."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("workbench"):
            names = [f"{node.module}.{a.name}" for a in node.names]
            targets = [n for n in names if _is_module(n)] or [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("workbench")]
        else:
            continue
        found += [(t, id(node) in top_level) for t in targets]
    return found


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").exists() or (PACKAGE.parent / rel / "__init__.py").exists()


def _type_checking_only(path: Path) -> set[str]:
    """Modules imported only under `if TYPE_CHECKING:` (no runtime dependency)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and sub.module:
                    out.add(sub.module)
                    out.update(f"{sub.module}.{a.name}" for a in sub.names)
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        typing_only = _type_checking_only(path)
        edges = {target for target, _ in _imports(path) if target not in typing_only and target != name}
        graph[name] = {e for e in edges if (name, e) not in ALLOWED_LAZY}
    return graph


def test_engine_imports_nothing_from_launch_or_ui():
    for path in (PACKAGE / "engine").rglob("*.py"):
        bad = [t for t, _ in _imports(path) if t.startswith(("workbench.launch", "workbench.ui"))]
        assert not bad, f"{path.name} imports {bad}"


def test_only_ui_imports_ui_at_module_level():
    for path in PACKAGE.rglob("*.py"):
        if "ui" in path.relative_to(PACKAGE).parts[:1]:
            continue
        bad = [t for t, top in _imports(path) if top and t.startswith("workbench.ui")]
        assert not bad, f"{path} imports {bad} at module level"


def test_rank_side_code_lives_in_engine():
    launch = {p.stem for p in (PACKAGE / "launch").glob("*.py")}
    assert not launch & {"worker", "rendezvous", "script"}, "rank-side modules belong in workbench/engine"
    for path in (PACKAGE / "launch").glob("*.py"):
        assert "submitit.JobEnvironment" not in path.read_text(), f"{path.name} reads the rank's environment"


def test_no_import_cycles_lazy_imports_included():
    graph = _graph()
    seen: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt == "workbench" or nxt not in graph:
                continue
            if seen.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in seen:
                visit(nxt)
        stack.pop()
        seen[node] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module)


def test_one_module_builds_run_folder_paths():
    """Paths inside a run folder come from workbench.rundir.RunDir, never built by hand elsewhere."""
    kinds = ("metrics", "events", "status", "errors", "stacks", "checkpoints", "logs", "plots")
    for path in PACKAGE.rglob("*.py"):
        if path.name == "rundir.py":
            continue
        text = path.read_text()
        for kind in kinds:
            for pattern in (f'/ "{kind}"', f"/ '{kind}'"):
                assert pattern not in text, f"{path.relative_to(PACKAGE)} builds a run-folder path by hand: {pattern}"
