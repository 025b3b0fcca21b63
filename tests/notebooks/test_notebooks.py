"""Every notebook in notebooks/ runs top to bottom in a real kernel (nbclient) without a cell error.

Parametrized over the glob, so a new notebook is executed without touching this file.  Each runs as a
user opens it: the kernel's working folder is notebooks/, the run root is the notebooks' default
(notebooks/runs, git-ignored), and no WORKBENCH_* variable is set.  Afterwards `git status` shows
nothing new, and the run folders the notebook made are removed.  The SLURM notebook also gets the
`slurm` marker and the real `slurm_cluster` fixture.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import workbench
from tests.support import REPO
from tests.support.checkout import git_status, remove_runs, run_folders, user_env

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
RUN_ROOT = REPO / "notebooks" / "runs"  # the notebooks' default run root, opened in place
pytestmark = pytest.mark.notebook

CELL_TIMEOUT_S = 280  # one cell; the whole notebook is bounded by the test's own timeout

# Notebooks that need the real SLURM cluster (marker `slurm`, fixture `slurm_cluster`).
SLURM_NOTEBOOKS = {"03_slurm.ipynb"}


def _has(name: str) -> bool:
    try:
        return hasattr(workbench, name)
    except Exception:  # noqa: BLE001 - it exists but fails to import: run the notebook, which shows why
        return True


def _skip_reason(path: Path) -> str | None:
    if path.name == "04_scaling_study.ipynb" and not _has("benchmark_scaling"):
        return "workbench.benchmark_scaling does not exist yet (the notebook uses it)"
    return None


def _params() -> list:
    params = []
    for path in NOTEBOOKS:
        marks = []
        if path.name in SLURM_NOTEBOOKS:
            marks += [pytest.mark.slurm, pytest.mark.timeout(900)]  # may include installing and starting SLURM
        else:
            marks.append(pytest.mark.timeout(300))
        reason = _skip_reason(path)
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(path, marks=marks, id=path.stem))
    return params


def execute(path: Path, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """Run every cell of `path` in a fresh python3 kernel whose working folder is the notebook's own, with
    a user's environment (plus `env`); raise on the first cell error."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, startup_timeout=120,
                            resources={"metadata": {"path": str(path.parent)}}, allow_errors=False)
    client.execute(env={**user_env(), **(env or {})})
    return nb


def _run_notebook(path: Path, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    started = time.monotonic()
    try:
        nb = execute(path, env)
    except CellExecutionError as exc:
        pytest.fail(f"{path.name}: a cell failed:\n{exc}", pytrace=False)
    print(f"{path.name}: executed in {time.monotonic() - started:.1f} s")
    return nb


def _outputs_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


@pytest.mark.timeout(30)
def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"01_quickstart.ipynb", "02_custom_model.ipynb", "03_slurm.ipynb",
                                           "04_scaling_study.ipynb"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_saved_clean_with_a_kernelspec(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", "needs kernelspec metadata (python3)"
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"cells {dirty} were saved with outputs: clear them before saving"
    first_code = next(c.source for c in nb.cells if c.cell_type == "code")
    assert "WORKBENCH_RUN_ROOT" in first_code, "the first code cell must read WORKBENCH_RUN_ROOT"


@pytest.fixture
def runs_before() -> Iterator[set[Path]]:
    """The run folders there were before the notebook ran; afterwards the new ones are removed and
    git status shows nothing new."""
    before, folders = git_status(), run_folders(RUN_ROOT)
    yield folders
    new = sorted(git_status() - before)
    remove_runs(run_folders(RUN_ROOT) - folders)
    assert not new, f"the notebook left files git sees (add them to .gitignore or write them elsewhere): {new}"


@pytest.mark.parametrize("path", _params())
def test_notebook_runs(path: Path, runs_before: set[Path], request: pytest.FixtureRequest):
    env = None
    if path.name in SLURM_NOTEBOOKS:
        cluster = request.getfixturevalue("slurm_cluster")  # session fixture: starts (or skips) the cluster
        env = dict(cluster.env)  # a SLURM user's shell has SLURM_CONF; the notebook takes the default partition
    nb = _run_notebook(path, env)
    made = run_folders(RUN_ROOT) - runs_before
    assert any((folder / "run.json").exists() or any(folder.rglob("run.json")) for folder in made), \
        f"{path.name} wrote no run under {RUN_ROOT}"
    if path.name == "06_warm_ranks.ipynb":
        _check_ranks_magic(nb)
    if path.name == "01_quickstart.ipynb":
        text = _outputs_text(nb)
        assert "finished" in text
        widget_views = [o for c in nb.cells for o in c.get("outputs", [])
                        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        assert len(widget_views) >= 2, "the Workbench widget and run.dashboard() should both display"
        images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert images, "run.plot() should display a figure"


def _check_ranks_magic(nb: nbformat.NotebookNode) -> None:
    """%%ranks showed both ranks' output, the collective's value and one rank's exception, tagged."""
    text = "\n".join(_outputs_text(nb).splitlines())
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} of 2 sees 3.0" in text, text
        assert f"[rank {rank}] Out: tensor([3.])" in text, text
    assert "[rank 0] Out: tensor([30.])" in text, text
    assert "[rank 1] ValueError: something wrong on rank 1" in text, text
    assert "[rank 0] ValueError" not in text, text
