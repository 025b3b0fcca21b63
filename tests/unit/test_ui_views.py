"""The views fit what they show: the runs table keeps a name on one line and every column in reach
(scrolling inside its widget), the config diff names each run whole, a badge's age is never left
behind by the refresh that wrote it, and a %%ranks traceback shows the cell's frames, not the
workbench's (WORKBENCH_TRACEBACK=full shows every frame).  No process is started."""
from __future__ import annotations

import re

import pytest

from tests.support.runs import write_run
from workbench.launch.history import compare, runs, wrap_name
from workbench.launch.status import RankStatus, RunStatus
from workbench.ui.dashboard import badges_html
from workbench.ui.runs_view import RunsView, runs_html
from workbench.ui.state import dashboard_state

pytestmark = pytest.mark.timeout(60)
LONG = "quickstart-20261122-101500-123"


def test_runs_table_keeps_names_on_one_line_and_every_column_in_a_scrolling_box(tmp_path):
    write_run(tmp_path, LONG, 1, "none")
    write_run(tmp_path, "lr-sweep-sqrt-rule-20261122-110000-789", 2, "sqrt")
    frame = runs(tmp_path)
    table = runs_html(frame)
    assert table.startswith("<div class='wb-table-scroll'") and "overflow-x:auto" in table
    for column in ("val_loss", "val_accuracy", "best_loss"):
        assert column in frame and f"title='{column}'" in table  # every column is there to scroll to
    cells = re.findall(r"<td style='([^']*)'>([^<]*)</td>", table)
    assert cells and all("white-space:nowrap" in style for style, _ in cells)  # no cell wraps
    assert re.search(r"text-align:left;white-space:nowrap'>" + LONG, table)  # the whole name, left-aligned
    assert "val_<wbr>accuracy" in table  # a header may wrap, after an underscore only
    view = RunsView(tmp_path)
    assert view.table.value == table and view.select.layout.max_width == "100%"


def test_every_lr_a_table_shows_says_which_lr_it_is(tmp_path):
    """The history table showed the scaled lr, the sweep view the base lr, neither labelled (issue 29)."""
    import pandas as pd

    from workbench.config import JobConfig
    from workbench.config.scaling import scaling_table
    from workbench.ui.scaling_view import table_html
    from workbench.ui.sweepview import frame_html

    write_run(tmp_path, "two-ranks", 2, "linear")
    frame = runs(tmp_path)
    table = runs_html(frame)
    assert frame["base_lr"].iloc[0] == 1e-3 and frame["lr"].iloc[0] == pytest.approx(2e-3)  # 2 ranks, linear
    assert ">base lr</th>" in table and ">lr used</th>" in table
    assert "title='train.lr as configured, before the scaling rule" in table
    assert "title='the lr the job used: the peak it logged, or train.lr scaled" in table
    trials = frame_html(pd.DataFrame({"number": [0], "train.lr": [1e-3], "state": ["finished"]}))
    assert ">train.lr (base)</th>" in trials
    scaling = table_html(scaling_table(JobConfig(), (1, 2)))
    assert "title='train.lr scaled by the rule to this row&#x27;s effective batch'" in scaling
    big = scaling_table(JobConfig(), (1, 2)).assign(max_micro_batch=[20_981_033, 512])
    assert ">20,981,033</td>" in table_html(big) and ">512</td>" in table_html(big)  # large counts grouped


def test_config_diff_headers_name_each_run_whole_wrapped_after_a_dash():
    assert wrap_name(LONG, 45) == LONG
    assert wrap_name(LONG, 12) == "quickstart-\n20261122-\n101500-123"
    assert wrap_name("a_verylongwordthatcannotbreak", 8) == "a_\nverylongwordthatcannotbreak"  # never mid-word
    for width in (8, 12, 20):
        assert wrap_name(LONG, width).replace("\n", "") == LONG


def test_the_compare_figure_shows_whole_run_names_in_its_config_diff(tmp_path):
    folders = [write_run(tmp_path, LONG, 1, "none"),
               write_run(tmp_path, "lr-sweep-sqrt-rule-2026112-110000", 2, "sqrt")]
    fig = compare(folders)
    table = fig.axes[-1].tables[0]
    headers = [cell.get_text().get_text() for (row, col), cell in table.get_celld().items() if row == 0 and col >= 0]
    assert sorted(h.replace("\n", "") for h in headers) == sorted(f.name for f in folders)
    assert not any("…" in h for h in headers)


def test_a_badge_shows_an_age_while_its_rank_is_active_and_none_once_it_ended():
    ranks = [RankStatus(0, "running", 10, 3.0), RankStatus(1, "finished", 40, 1.0)]
    text = badges_html(dashboard_state(RunStatus("running", ranks, 10, 40), job_done=False))
    running, finished = text.split("</span>")[:2]
    assert "rank 0: running @ 10 · 3s ago" in running
    # the poller stops at the final state: an age written then ("1s ago") would stay on screen for ever
    assert "rank 1: finished @ 40<" in finished + "<" and "ago" not in finished


def _cell_outcomes(monkeypatch, full: bool):
    from workbench.engine.warm import run_exec

    source = "import json\ndef parse(text):\n    return json.loads(text)\nparse('{bad')"
    if full:
        monkeypatch.setenv("WORKBENCH_TRACEBACK", "full")
    else:
        monkeypatch.delenv("WORKBENCH_TRACEBACK", raising=False)
    return [run_exec({"kind": "exec", "source": source}, {}, rank) for rank in (0, 1)]


def test_ranks_tracebacks_show_the_cells_frames_not_the_workbenchs(monkeypatch, capsys):
    from workbench.engine.userframes import HIDDEN_NOTE
    from workbench.ui.magic import show

    outcomes = _cell_outcomes(monkeypatch, full=False)
    assert all(o["outcome"] == "raised" for o in outcomes)
    show(outcomes)
    err = capsys.readouterr().err
    frames = re.findall(r'^\[rank (\d)\]   File "([^"]+)"', err, re.M)
    assert frames[0] == ("0", "<rank 0 cell>")  # the user's cell comes first: no workbench frame before it
    assert not any("workbench" in name for _, name in frames), err
    assert any(name.endswith("json/__init__.py") for _, name in frames)  # what the cell called stays
    assert err.count(HIDDEN_NOTE.strip()) == 1 and err.rstrip().endswith(HIDDEN_NOTE.strip())  # said once
    assert "[rank 1] json.decoder.JSONDecodeError" in err

    show(_cell_outcomes(monkeypatch, full=True))
    full = capsys.readouterr().err
    assert "workbench/engine/warm.py" in full and HIDDEN_NOTE.strip() not in full


def test_a_ranks_cell_that_does_not_parse_says_where_without_frames():
    from workbench.engine.warm import run_exec

    error = run_exec({"kind": "exec", "source": "def f(:\n    pass"}, {}, 0)["error"]
    assert error.splitlines()[0] == '  File "<rank 0 cell>", line 1'
    assert error.rstrip().endswith("SyntaxError: invalid syntax")
    assert "Traceback" not in error
