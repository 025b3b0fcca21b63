"""The pieces of run.plan() that need no run: the rank's first-steps memory probe (engine.memprobe) on a real
model and optimizer in this process, its error paths, and the lines that say a miss."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from workbench.engine.memprobe import STEPS, FirstStepsMemory
from workbench.launch.plancheck import COLUMNS, lines, misses

pytestmark = pytest.mark.timeout(60)


class Events:
    """What the probe writes through the rank's monitor: its step and its events."""

    def __init__(self) -> None:
        self.step, self.written = 0, []

    def event(self, kind: str, **fields: Any) -> None:
        self.written.append({"event": kind, **fields})


def _steps(probe: FirstStepsMemory, monitor: Events, model: torch.nn.Module, opt: torch.optim.Optimizer,
           n: int) -> None:
    for _ in range(n):
        with probe.step():
            with probe.untracked():
                x = torch.randn(8, model.in_features)
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            monitor.step += 1  # as the Trainer counts the step inside it


def test_the_first_two_steps_are_measured_once_with_the_weights_gradients_and_adams_moments():
    model = torch.nn.Linear(64, 512)
    opt = torch.optim.AdamW(model.parameters())
    monitor = Events()
    probe = FirstStepsMemory(True, "cpu", model, opt, False, monitor)
    _steps(probe, monitor, model, opt, 4)
    assert len(monitor.written) == 1 and STEPS == 2
    event = monitor.written[0]
    weights = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    assert event["event"] == "memory" and event["how"] == "MemTracker" and event["steps"] == [1, 2]
    assert 4 * weights <= event["peak_mb"] <= 7 * weights, event  # weights, grads, 2 moments, AdamW's temporaries
    assert _get_current_dispatch_mode() is None


def test_a_tracker_that_cannot_start_says_why_and_the_steps_run_untracked():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Events()
    probe = FirstStepsMemory(True, "cpu", object(), opt, False, monitor)  # not a module: torch refuses to track it
    before = model.weight.detach().clone()
    _steps(probe, monitor, model, opt, 3)
    assert not torch.equal(before, model.weight), "the steps ran"
    assert len(monitor.written) == 1 and monitor.written[0]["peak_mb"] is None
    assert monitor.written[0]["why"].startswith("TypeError: Object of type"), monitor.written


def test_a_step_that_raises_leaves_no_tracker_behind_and_records_nothing():
    model = torch.nn.Linear(4, 4)
    monitor = Events()
    probe = FirstStepsMemory(True, "cpu", model, torch.optim.SGD(model.parameters(), lr=0.1), False, monitor)
    with pytest.raises(ValueError, match="the user's step"), probe.step():
        raise ValueError("the user's step")
    assert _get_current_dispatch_mode() is None and monitor.written == []


def test_turned_off_it_measures_nothing():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Events()
    _steps(FirstStepsMemory(False, "cpu", model, opt, False, monitor), monitor, model, opt, 3)
    assert monitor.written == []


def _check(rows: list[dict[str, float]], predicted: bool = True) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame.attrs["misses"] = misses(frame)
    frame.attrs["predicted"] = predicted
    return frame


def test_a_miss_over_the_plans_margins_is_one_line_naming_the_rank_and_both_values():
    frame = _check([
        {"rank": 0, "predicted_peak_mb": 100.0, "measured_peak_mb": 109.0, "peak_error": 0.09,
         "predicted_step_s": 0.1, "measured_step_s": 0.135, "step_error": 0.35},
        {"rank": 1, "predicted_peak_mb": 100.0, "measured_peak_mb": 125.0, "peak_error": 0.25,
         "predicted_step_s": 0.1, "measured_step_s": 0.12, "step_error": 0.2}])
    assert frame.attrs["misses"] == [
        "rank 0: step time 135.0 ms measured, 100.0 ms predicted (+35%, more than the plan's 30%)",
        "rank 1: peak memory 125 MiB measured, 100 MiB predicted (+25%, more than the plan's 10%)"]
    text = lines(frame, 2)
    assert text[0] == "plan vs measured:" and text[1].startswith("  rank 0: peak 109 MiB measured / 100 MiB")
    assert text[-1].startswith("  missed: rank 1: peak memory")


def test_ranks_alike_are_one_line_and_without_a_prediction_the_measured_peak_says_how_to_get_one():
    row = {"rank": 0, "predicted_peak_mb": 12.5, "measured_peak_mb": 12.6, "peak_error": 0.008,
           "predicted_step_s": 0.02, "measured_step_s": 0.021, "step_error": 0.05}
    assert lines(_check([row, {**row, "rank": 1}]), 2) == [
        "plan vs measured (every rank): peak 12.6 MiB measured / 12.5 MiB predicted, step 21.0 ms / 20.0 ms",
        "  within the plan's 10% (memory) and 30% (step)"]
    bare = {**row, "predicted_peak_mb": float("nan"), "predicted_step_s": float("nan"),
            "peak_error": float("nan"), "step_error": float("nan")}
    said = lines(_check([bare, {**bare, "rank": 1, "measured_peak_mb": 13.0}], predicted=False), 2)
    assert said == ["peak memory a rank over its first two steps: 12.6 MiB to 13 MiB (tracked tensors; no plan to "
                    "check it against yet: run.plan() or `workbench show RUN --plan` makes one)"]


def test_gradient_accumulation_and_a_loss_module_called_twice_are_measured_not_failed():
    """torch's MemTracker raises on a root module's second forward within what it tracks ("multiple
    iterative calls"): in a rank that would fail ordinary training, so the probe lets it run again."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters())
    criterion = torch.nn.MSELoss()
    monitor = Events()
    probe = FirstStepsMemory(True, "cpu", model, opt, False, monitor)
    for _ in range(2):
        with probe.step():
            for _micro in range(2):  # grad_accum_steps 2: the model's forward again after a backward
                out = model(torch.randn(8, 16))
                (criterion(out, torch.zeros(8, 4)) + criterion(out * 2, torch.ones(8, 4))).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            monitor.step += 1
    assert len(monitor.written) == 1 and monitor.written[0]["peak_mb"] > 0, monitor.written
    assert monitor.written[0]["how"] == "MemTracker"


def test_a_tracker_that_fails_as_it_stops_leaves_the_step_done_and_says_why(monkeypatch):
    """torch's tracker failing on its way out (after a step that ran): the step is not failed by it."""
    from workbench.engine import memprobe

    lenient = memprobe._lenient

    def breaking(base: type) -> type:
        class Breaking(lenient(base)):  # type: ignore[misc]
            def __exit__(self, *exc: object) -> None:
                super().__exit__(*exc)
                raise RuntimeError("the tracker broke on its way out")

        return Breaking

    monkeypatch.setattr(memprobe, "_lenient", breaking)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Events()
    before = model.weight.detach().clone()
    _steps(FirstStepsMemory(True, "cpu", model, opt, False, monitor), monitor, model, opt, 3)
    assert not torch.equal(before, model.weight) and monitor.step == 3
    assert monitor.written == [{"event": "memory", "peak_mb": None, "how": "not measured",
                                "why": "RuntimeError: the tracker broke on its way out"}]
    assert _get_current_dispatch_mode() is None
