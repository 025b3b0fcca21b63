"""The README and every docs/ page work as written, page by page: a page's ```python blocks run, in
order, in one real Jupyter kernel whose working folder is the repository (so `%load_ext workbench` and
`%%ranks` blocks work and runs land in the git-ignored runs/), and its ```bash blocks run from the
repository, with no workbench environment variable set; the terminal table's commands (docs/terminal.md)
run against the run the README's own `workbench run` made.  A block marked just before it with
`<!-- needs: slurm -->` (or gpu, network) runs only where that exists.  Afterwards `git status` shows
nothing new: what a page makes is ignored, and the run folders these tests made are removed.  What a
page must hold and link is checked without running anything in tests/unit/test_docs.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.support import REPO
from tests.support.checkout import git_status, remove_runs, run_folders, user_env

README = REPO / "README.md"
TERMINAL = REPO / "docs" / "terminal.md"  # the terminal table
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
"""Every page whose blocks run: the README first, then docs/ (a page's blocks run in one test, in order)."""
RUN_ROOT = REPO / "runs"  # examples/quickstart.yaml's launch.run_root, from the repository
BLOCK = re.compile(r"(?:<!--\s*needs:\s*(?P<needs>[\w, ]+?)\s*-->\s*\n)?```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)

pytestmark = pytest.mark.notebook


def blocks(lang: str, page: Path = README) -> list[tuple[str, set[str]]]:
    """(code, what it needs) of each block of `page` in `lang`, in order."""
    return [(m["code"], {n.strip() for n in (m["needs"] or "").split(",") if n.strip()})
            for m in BLOCK.finditer(page.read_text()) if m["lang"] == lang]


def pages_with(lang: str) -> list[Any]:
    """A pytest param per page that has a block in `lang`, named by its path in the repository."""
    return [pytest.param(page, id=str(page.relative_to(REPO))) for page in PAGES if blocks(lang, page)]


RANKS_CELL = 'print("rank", rank, "sees", x.item())'
"""The last line of the `%%ranks` block (docs/pools.md): a page that has it must show both ranks' answers."""


def available() -> set[str]:
    """What this machine has of what a block may need (never the network: tests do not download)."""
    import torch

    return {"gpu"} if torch.cuda.is_available() else set()


@pytest.fixture
def leaves_nothing() -> Iterator[None]:
    """git status shows nothing new afterwards; the run folders made meanwhile are removed again."""
    before, runs_before = git_status(), run_folders(RUN_ROOT)
    yield
    new = sorted(git_status() - before)
    remove_runs(run_folders(RUN_ROOT) - runs_before)
    assert not new, f"the page left files git sees (add them to .gitignore or write them elsewhere): {new}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", pages_with("python"))
def test_the_python_blocks_run_in_order_in_one_kernel(page: Path, leaves_nothing):
    have = available()
    cells = [nbformat.v4.new_code_cell(code) for code, needs in blocks("python", page) if needs <= have]
    if not cells:
        pytest.skip(f"every python block of {page.name} needs what this machine lacks")
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                        "display_name": "Python 3"}})
    client = NotebookClient(nb, kernel_name="python3", timeout=240, startup_timeout=120,
                            resources={"metadata": {"path": str(REPO)}}, allow_errors=False)
    started = time.monotonic()
    try:
        client.execute(env=user_env())
    except CellExecutionError as exc:
        pytest.fail(f"a block of {page.relative_to(REPO)} failed:\n{exc}", pytrace=False)
    print(f"{len(cells)} blocks of {page.relative_to(REPO)} ran in {time.monotonic() - started:.0f} s")
    text = "\n".join(str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
                     for cell in nb.cells for out in cell.get("outputs", []))
    if RANKS_CELL in page.read_text():  # the collective completed on every rank, each answer tagged
        assert "[rank 0] rank 0 sees 3.0" in text and "[rank 1] rank 1 sees 3.0" in text, text[-3000:]


def sh(command: str, env: dict[str, str], timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


TABLE = {
    # the terminal table's rows (their first command) -> what runs here, with CONFIG.yaml and RUN_DIR filled
    # in, or why it does not run here
    "workbench run CONFIG.yaml": "covered by the bash block (workbench run examples/quickstart.yaml)",
    "workbench run CONFIG.yaml --executor slurm --nodes 2": "needs SLURM (tests/slurm)",
    "workbench table CONFIG.yaml": ["workbench table {config} --compare"],
    "workbench show RUN_DIR": ["workbench show {run}"],
    "workbench follow RUN_DIR": ["workbench follow {run}", "workbench cancel {run}"],
    "workbench check CONFIG.yaml": ["workbench check {config}"],
    "workbench pools": ["workbench pools --all"],
    "workbench config": ["workbench config {config} --set train.lr=3e-4", "workbench config --docs",
                         "workbench config --where train.grad_accum_steps"],
    "workbench export CONFIG.yaml --sbatch": ["workbench export {config} --torchrun"],  # --sbatch: the README's
                                                                                       # SLURM block
    "workbench export RUN_DIR --tensorboard DIR": ["workbench export {run} --metrics {tmp}/metrics.csv"],
    "workbench bench-scaling CONFIG.yaml --world-sizes 1,2": "more real runs than this test's budget "
                                                            "(tests/ddp/test_scaling_bench.py runs it)",
    "workbench launch": "launches the user's own train.py (tests/ddp/test_script_mode.py)",
    "torchrun --standalone --nproc_per_node=2 -m workbench.train CONFIG.yaml": "the same run under torchrun "
                                                                               "(tests/ddp)",
}


def table_rows() -> list[str]:
    """The first command of each row of the terminal table (docs/terminal.md), its [optional] parts left out."""
    section = TERMINAL.read_text().split("\n## Commands\n\n", 1)[1].split("\n\n", 1)[0]
    rows = [re.match(r"\| `([^`]+)`", line) for line in section.splitlines()]
    return [re.sub(r"\s*\[.*", "", m[1]).strip() for m in rows if m]


@pytest.mark.timeout(30)
def test_every_row_of_the_terminal_table_is_run_or_says_why_not():
    assert sorted(table_rows()) == sorted(TABLE)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", pages_with("bash"))
def test_the_shell_commands_run_as_written(page: Path, leaves_nothing, tmp_path: Path):
    env, have = user_env(), available()
    ran = []
    for code, needs in blocks("bash", page):
        if not needs <= have:
            continue
        for line in code.splitlines():
            command = line.split(" #", 1)[0].strip()
            if command and not command.startswith("#"):
                ran.append(sh(command, env))
    if page != README:
        if not ran:
            pytest.skip(f"every bash block of {page.name} needs what this machine lacks")
        return
    assert ran, "the README has no bash block that runs here"
    # the README's main job, and the terminal table's commands against the run it made
    out = "\n".join(done.stdout for done in ran)
    run = re.search(r"\[workbench\] run folder: (\S+)", out)
    assert run, out
    progress = re.findall(r"^  step +(\d+)/(\d+) \| loss [^|]*\(rank 0 [^|]*, rank 1 [^|]*\) \|", out, re.M)
    steps = [int(step) for step, _ in progress]
    assert steps and steps[-1] == int(progress[-1][1]), out  # the last line is the last step
    assert all(step % 10 == 0 for step in steps[:-1]) and steps == sorted(set(steps)), steps  # every 10 steps
    nexts = re.search(r"next: `workbench show (\S+)`", out)
    assert nexts and (REPO / nexts[1]).resolve() == Path(run[1]), out  # what it says to type works from here
    for what in TABLE.values():
        for command in what if isinstance(what, list) else []:
            sh(command.format(config="examples/quickstart.yaml", run=shlex.quote(nexts[1]), tmp=tmp_path), env)
