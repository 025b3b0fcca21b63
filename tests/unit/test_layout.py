"""The house keeps its layout: code that runs inside a rank lives in workbench/engine and imports
nothing from the submitting side or the widgets; nothing outside ui/ imports ui/ at module level;
no import cycles, lazy ones included, and no exemption list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGE = REPO / "workbench"
pytestmark = pytest.mark.timeout(60)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of the module but those inside `if TYPE_CHECKING:` blocks (their `else:` counts):
    an import anywhere else, inside a function included, runs at some point."""
    out: list[ast.AST] = []

    def walk(node: ast.AST) -> None:
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                walk(child)
            return
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported workbench module, at module level?) for every import that runs (not typing-only)."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    found = []
    for node in _runtime_nodes(tree):
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


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        edges = {target for target, _ in _imports(path) if target != name}
        graph[name] = edges
    return graph


LAYERS = {
    # package: what it may import at run time (lazily included), besides itself
    "errors": set(),
    "config": {"errors"},
    "runfolder": {"errors", "config", "proctree"},
    "engine": {"errors", "config", "runfolder", "proctree"},
    "integrations": {"errors", "config", "runfolder", "engine"},
    "planning": {"errors", "config", "runfolder", "engine"},
    "testhook": set(),
    "launch": {"errors", "config", "runfolder", "proctree", "engine", "results", "planning", "testhook"},
    "results": {"errors", "config", "runfolder"},
    "sweeps": {"errors", "config", "runfolder", "proctree", "engine", "launch", "results", "testhook"},
    "cli": {"errors", "config", "runfolder", "proctree", "launch", "results", "sweeps", "planning"},
    "ui": {"errors", "config", "runfolder", "launch", "results", "engine", "sweeps", "planning"},
}
"""Who may import whom: code that runs inside a rank (engine) reaches neither the submitting side
nor the widgets; the run-folder contract and the config import nothing above them; sweeps sit above
launch (a trial is a run submitted as any other) and below the front doors (ui, cli)."""


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_package_imports_only_the_layers_below_it(package):
    allowed = LAYERS[package] | {package, ""}
    folder = PACKAGE / package
    paths = list(folder.rglob("*.py")) if folder.is_dir() else [PACKAGE / f"{package}.py"]
    for path in paths:
        bad = sorted({t for t, _ in _imports(path) if _package(t) not in allowed})
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_the_top_level_shows_the_architecture():
    """The top level keeps __init__, the torchrun entry and a few modules both sides share; the rest
    lives in packages that say what they hold."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, modules
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert set(LAYERS) - {"errors", "testhook"} <= set(packages), packages  # the two modules of LAYERS


def test_engine_imports_nothing_from_launch_or_ui():
    for path in (PACKAGE / "engine").rglob("*.py"):
        bad = [t for t, _ in _imports(path) if t.startswith(("workbench.launch", "workbench.ui", "workbench.results",
                                                             "workbench.cli"))]
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


def test_the_sweep_feature_lives_in_its_package():
    """Sweeps sit above launch/: no sweep module is stored in the layers below them (what runs in an
    array element's ranks is engine/sweep_element.py; the front doors stay in ui/ and cli/)."""
    for below in ("launch", "results"):
        assert not list((PACKAGE / below).glob("sweep*.py")), f"{below}/ holds a sweep module: it belongs in sweeps/"
    assert (PACKAGE / "sweeps" / "__init__.py").exists() and not (PACKAGE / "sweeps.py").exists()


def test_no_two_layers_may_import_each_other():
    """The layers form a ladder: where a imports b, b never imports a (results sits below launch;
    history, which builds Run handles, is launch's)."""
    pairs = sorted((a, b) for a, allowed in LAYERS.items() for b in allowed if a in LAYERS.get(b, set()))
    assert not pairs, pairs


def test_the_widgets_a_run_opens_are_named_by_entry_point_not_imported():
    """run.dashboard() and run.plot(interactive=True) find the ui's widgets through the entry-point group
    pyproject.toml declares, so launch/ imports nothing of ui/ and the names resolve to its classes."""
    import tomllib

    from workbench.launch.run import WIDGETS

    declared = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]["entry-points"][WIDGETS]
    assert set(declared) == {"dashboard", "plot"}
    for name, target in declared.items():
        module, attr = target.split(":")
        assert _package(module) == "ui", (name, target)
        assert (PACKAGE.parent / Path(*module.split("."))).with_suffix(".py").exists(), target
        source = (PACKAGE.parent / Path(*module.split("."))).with_suffix(".py").read_text()
        assert re.search(rf"^class {attr}\b", source, re.M), target


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


RUN_FOLDER_NAME = re.compile(
    r"rank|\.jsonl?$|\.png$|\.csv$|\.pt$|\.pkl$|run\.json|config\.yaml|summary|world|scaling|set-aside|pool-job|"
    r"down|^gen|^(metrics|events|status|errors|stacks|checkpoints|logs|plots|procs|results|rendezvous|tensorboard|"
    r"wandb|exports|jobs|done|taken|ready|pools)$|^metrics\.")
"""A name that belongs to a run folder (or a pool's, or a scaling bench's): RunDir and its kin build it."""
RUN_FOLDER_GLOB = re.compile(r"rank|run\.json|step-|_log\.|\.pt$|failure-|world|scaling|pool-job|down")
"""A glob or name pattern over run-folder files (not any *.json: Jupyter's runtime files are not ours)."""
NAME_PART = re.compile(r"rank\*|\*/run\.json|pool-job|-down-rank|set-aside-|-restart\{|^gen\{\}$")
"""Pieces of run-folder names and patterns that only a name being built contains, wherever it stands."""
KEYED = ("rendezvous", "down_mark", "pool_log")
"""RunDir methods whose key or tag the layout builds too (start_key, restart_key, generation_key)."""


def _literal(node: ast.AST) -> str | None:
    """The text of a string literal, of an f-string with "{}" for each value; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def hand_built_paths(source: str) -> list[str]:
    """Where `source` builds a run-folder path or name itself: `x / "name"`, a glob or name pattern
    for run-folder files, a meeting key or log tag made by hand."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        text = _literal(node)
        if text is not None and id(node) not in docstrings | parts and NAME_PART.search(text):
            found.append(repr(text))
        if _builds_a_name(node):
            found.append(ast.unparse(node))
    return found


def _builds_a_name(node: ast.AST) -> bool:
    """`x / "name"`, `x.glob("pattern")` with a run-folder name, or a RunDir key method given a literal."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        text = _literal(node.right)
        return text is not None and bool(RUN_FOLDER_NAME.search(text))
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
        return False
    text = _literal(node.args[0])
    if node.func.attr in ("glob", "rglob", "with_name"):
        return text is not None and bool(RUN_FOLDER_GLOB.search(text))
    return node.func.attr in KEYED and text is not None


def test_one_module_builds_run_folder_paths():
    """Paths and names inside a run folder (folders, files, globs, meeting keys, log tags) come from
    workbench.runfolder.layout, never built by hand elsewhere."""
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).as_posix() == "runfolder/layout.py":
            continue
        found = hand_built_paths(path.read_text())
        assert not found, f"{path.relative_to(PACKAGE)} builds run-folder paths by hand: {found}"


@pytest.mark.parametrize("source", [
    'run.root / "wandb"', 'run.dir.plots / "loss.png"', 'Path(folder) / "scaling.png"', 'folder / "scaling.csv"',
    'folder / f"world{n}"', 'base.parent / f"scaling-{base.name}"', 'run.root / "metrics" / f"rank{r}.jsonl"',
    'folder.glob("rank*.jsonl")', 'MultiTail(folder, "rank*.jsonl")', 'base.glob("*/run.json")',
    'run.checkpoints.glob("step-*.pt")', 'run.rendezvous(f"{key}-down-rank{r}")', 'pool.rendezvous(f"gen{g}")',
    'run.pool_log(f"pool-job{n}", 0, "err")', 'logdir / f"rank{rank}"', 'output_to(run, f"pool-job{number}", rank)',
    'found = {p.parent for pattern in ("*/run.json", "*/*/run.json") for p in base.glob(pattern)}',
    'run.dir.exports / f"metrics.{fmt}"', 'key = f"{self.job_key}-restart{restart}"', 'key = f"gen{generation}"',
])
def test_the_path_check_catches_hand_built_names(source):
    assert hand_built_paths(source), source


def test_the_path_check_passes_paths_that_are_not_the_run_folders():
    ok = ['Path.home() / ".jupyter" / "lab"', 'root / "config" / "sections.py"', 'run.rendezvous(key)',
          'Path(jupyter_runtime_dir()).glob("jpserver-*.json")',
          'path.with_name(f".{path.name}.tmp-{pid}")', 'run.pool_log(number, rank, "out")']
    assert [s for s in ok if hand_built_paths(s)] == []


OWNERS = {"TERMINAL": "launch/status.py", "ENDED_RANK_STATES": "runfolder/rankstate.py",
          "effective_batch": "config/scaling.py"}
"""Facts with one owner: the module that defines them (a constant, or the effective batch's formula)."""


def _defines(tree: ast.AST, name: str) -> bool:
    """`name = ...` at module level, `def name`, or (for the effective batch) the formula written out:
    micro_batch_size * grad_accum_steps."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return True
        if name == "effective_batch" and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            text = ast.unparse(node)
            if "micro_batch_size" in text and "grad_accum_steps" in text:
                return True
    return False


@pytest.mark.parametrize("name", sorted(OWNERS))
def test_a_fact_has_one_owner(name):
    """A run's terminal states, the ranks' ended states and the effective batch are written once;
    everything else imports them (two answers for one fact is what users see)."""
    found = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                   if _defines(ast.parse(p.read_text()), name))
    assert found == [OWNERS[name]], f"{name} is defined in {found}; only {OWNERS[name]} should"


def test_the_three_submit_forms_are_written_once():
    """workbench.submit, submit_fn and submit_script: fresh ranks, a pool's warm ranks and a sweep
    array's element all submit through Launches' one copy (a launcher only says check and hand_over)."""
    forms = {"submit", "submit_fn", "submit_script"}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name != "Launches":
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                defined = methods & forms if "hand_over" in methods else set()  # a launcher
                assert not defined, f"{path.relative_to(PACKAGE)}: {node.name} writes {sorted(defined)} again"
    from workbench.launch.pool import Pool
    from workbench.launch.submit import FreshRanks, Launches
    from workbench.sweeps.array import Element

    for launcher in (FreshRanks, Pool, Element):
        assert issubclass(launcher, Launches) and launcher.submit_script is Launches.submit_script
