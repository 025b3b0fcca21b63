"""The README is a first page and docs/ holds the rest: the README stays small and links every docs page,
every relative link of the README and docs/ reaches a file (and its heading), and every block on those
pages is one the tests run (tests/notebooks/test_readme.py runs them; here nothing runs)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.timeout(60)

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_BYTES = 12 * 1024
"""Issue 27: the README is a first page (what it is, install, a notebook, a terminal and a SLURM example, the
documentation list); everything else lives in docs/, one page per topic."""

FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
RUN_LANGS = {"python", "bash"}
"""The languages tests/notebooks/test_readme.py executes: a block in any other would be shown but never run."""


def prose(page: Path) -> str:
    """The page without its fenced blocks and inline code, where links and headings are read."""
    text = FENCE.sub("", page.read_text())
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (backticks too), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on a page, a repeated heading's with GitHub's -1, -2 suffix."""
    text = FENCE.sub("", page.read_text())
    seen: Counter[str] = Counter()
    found = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, re.M):
        base = slug(m[1])
        found.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def test_the_readme_is_a_first_page_of_at_most_12_kb():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (f"README.md is {size} bytes, over {README_MAX_BYTES}: move the detail to a "
                                      "page under docs/ and link it")


def test_the_readme_links_every_docs_page_and_each_link_is_there():
    assert DOCS.is_dir() and len(PAGES) > 1, "docs/ holds one page per topic"
    linked = {(README.parent / m["target"].split("#", 1)[0]).resolve()
              for m in LINK.finditer(prose(README)) if m["target"].startswith("docs/")}
    missing = sorted(str(p.relative_to(REPO)) for p in linked if not p.is_file())
    assert not missing, f"the README links docs pages that do not exist: {missing}"
    unlisted = sorted(str(p.relative_to(REPO)) for p in PAGES[1:] if p.resolve() not in linked)
    assert not unlisted, f"the README's documentation list leaves out: {unlisted}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_to_a_file_and_its_heading(page: Path):
    broken = []
    for m in LINK.finditer(prose(page)):
        target = m["target"]
        if re.match(r"[a-z]+:", target):  # https:, mailto: ... are not files here
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)} has links that do not resolve: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_block_is_one_the_tests_run_and_real_code(page: Path):
    """A block is python or bash (run by tests/notebooks/test_readme.py), and a python block has no `...`
    placeholder a user would have to fill in (comments aside)."""
    for m in FENCE.finditer(page.read_text()):
        assert m["lang"].strip() in RUN_LANGS, (f"{page.relative_to(REPO)} has a ```{m['lang']} block, which no "
                                                f"test runs: make it python or bash\n{m['code']}")
        if m["lang"].strip() == "python":
            lines = [line.split("#", 1)[0] for line in m["code"].splitlines()]
            assert not any("..." in line for line in lines), f"a block has a placeholder:\n{m['code']}"


def test_the_pages_show_the_python_api_and_a_cell_on_every_rank():
    python = [m for page in PAGES for m in FENCE.finditer(page.read_text()) if m["lang"].strip() == "python"]
    assert len(python) >= 6
    assert any(m["code"].startswith("%%ranks\n") for m in python), "a page runs a %%ranks cell (docs/pools.md)"


def test_the_readme_starts_with_the_set_up_commands():
    """Install, the main job, the tests: the first blocks, as before the split (.ci/run runs the last)."""
    first = [m["code"] for m in FENCE.finditer(README.read_text())][:3]
    assert first[0].startswith("pip install torch==2.13.0 -e .  ")
    assert first[1].startswith("workbench run examples/quickstart.yaml")
    assert 'pip install torch==2.13.0 -e ".[test]" && python -m pytest\n' in first[2]


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: str(p.relative_to(REPO)))
def test_a_docs_page_has_short_paragraphs(page: Path):
    """No paragraph of prose over 8 lines (tables and lists aside): the README's were 15-28 (issue 27)."""
    for paragraph in prose(page).split("\n\n"):
        lines = [line for line in paragraph.strip().splitlines() if not line.startswith(("|", "- "))]
        assert len(lines) <= 8, f"{page.relative_to(REPO)}: a paragraph of {len(lines)} lines:\n{paragraph}"
