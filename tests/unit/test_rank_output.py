"""Each rank's output where people look: live in the terminal, prefixed [rank N], filtered like
torchrun's --local-ranks-filter; the launcher's own lines left out."""
from __future__ import annotations

import pytest

from workbench.errors import ConfigError
from workbench.launch.output import RankOutput, shown_streams
from workbench.runfolder.layout import RunDir

pytestmark = pytest.mark.timeout(120)


def test_default_filter_is_every_rank_up_to_eight_then_rank_zero_and_errors():
    assert shown_streams(2) == {0: ("out", "err"), 1: ("out", "err")}
    big = shown_streams(16)
    assert big[0] == ("out", "err") and big[7] == ("err",) and len(big) == 16
    assert shown_streams(4, "1,3") == {1: ("out", "err"), 3: ("out", "err")}
    assert shown_streams(4, "none") == {} and len(shown_streams(16, "all")) == 16


@pytest.mark.parametrize("spec", ["4", "a", "", "-1"])
def test_a_bad_filter_names_the_flag(spec):
    with pytest.raises(ConfigError, match="--ranks: expected all, none or rank numbers below 4"):
        shown_streams(4, spec)


def test_only_complete_new_lines_are_read_and_launcher_lines_are_left_out(tmp_path):
    run = RunDir(tmp_path).create()
    log = run.logs / "77_1_log.out"
    log.write_text("submitit INFO (2026-11-22 10:00:00,000) - Starting with JobEnvironment(...)\nepoch 1\npart")
    output = RankOutput(run, {1: ("out",)})
    assert output.poll() == [(1, "out", "epoch 1")]
    with open(log, "a") as fh:
        fh.write("ial line\n\xe9t\xe9 \xff\n")
    assert output.poll() == [(1, "out", "partial line"), (1, "out", "été ÿ")]
    assert output.poll() == []


def test_a_launcher_line_glued_to_a_rank_s_last_output_without_a_newline_is_cut_off_and_dropped(tmp_path):
    """A script whose last print ends without a newline: submitit's "Job completed" line lands right
    after it in the same log line; the user's text is shown as its own line, submitit's is not."""
    run = RunDir(tmp_path).create()
    log = run.logs / "77_0_log.out"
    log.write_text("saw submitit INFO (the launcher) here\nr0 tail no newline")
    output = RankOutput(run, {0: ("out",)})
    assert output.poll() == [(0, "out", "saw submitit INFO (the launcher) here")]
    with open(log, "a") as fh:
        fh.write("submitit INFO (2026-11-28 08:18:02,808) - Job completed successfully\n")
    assert output.poll() == [(0, "out", "r0 tail no newline")]
    assert output.poll() == []
