"""Task factories used by the end-to-end tests (failure injection)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.engine.builtin_tasks import synthetic_classification
from workbench.engine.tasks import Task

if TYPE_CHECKING:
    import torch


def _on_training_call(task: Task, rank: int, step_calls: int, action) -> Task:
    """Run `action(task)` when `rank` makes its `step_calls`-th training loss call."""
    base, calls = task.loss_fn, {"n": 0}

    def loss_fn(output, target):
        if task.model.training and int(os.environ["RANK"]) == rank:
            calls["n"] += 1
            if calls["n"] == step_calls:
                action(task)
        return base(output, target)

    task.loss_fn = loss_fn
    return task


def failing_at(step_calls: int, rank: int = 1, how: str = "raise", **options) -> Task:
    """The synthetic task, except that `rank` fails on its `step_calls`-th training loss call."""

    def fail(task: Task) -> None:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "hang":
            time.sleep(3600)
        raise RuntimeError(f"injected failure on rank {rank}")

    return _on_training_call(synthetic_classification(**options), rank, step_calls, fail)


def slow(delay_s: float, **options) -> Task:
    """The synthetic task with each training micro-step slowed down by `delay_s`."""
    task = synthetic_classification(**options)
    base = task.loss_fn

    def loss_fn(output, target):
        if task.model.training:
            time.sleep(delay_s)
        return base(output, target)

    task.loss_fn = loss_fn
    return task


def slow_on(rank: int, delay_s: float, **options) -> Task:
    """The synthetic task with `rank` slowed by `delay_s` per training micro-step (a straggler)."""
    task = slow(delay_s, **options)
    if int(os.environ["RANK"]) != rank:
        return synthetic_classification(**options)
    return task


def gated(gate: str, at_step: int, delay_s: float = 0.0, open_on_signal: bool = False, **options) -> Task:
    """The synthetic task (each training micro-step slowed by `delay_s`), except that every rank holds
    before its training step `at_step` + 1 until the file `gate` exists: the run cannot pass `at_step`,
    nor end by itself, before the test opens the gate.  With `open_on_signal` the rank's preemption
    signal (SIGUSR2) opens it, after the engine's own handler has seen the signal: the run cannot pass
    `at_step` before it was preempted.  A later attempt (requeued, restarted) finds the gate open."""
    path = Path(gate)
    if open_on_signal:
        engine_handler = signal.getsignal(signal.SIGUSR2)

        def handler(signum, frame):
            if callable(engine_handler):
                engine_handler(signum, frame)  # workbench.engine.preempt: the flag the loop acts on
            path.touch()

        signal.signal(signal.SIGUSR2, handler)

    def hold(task: Task) -> None:
        while not path.exists():
            time.sleep(0.01)

    return _on_training_call(slow(delay_s, **options), int(os.environ["RANK"]), at_step + 1, hold)


def diverging_at(step_calls: int, rank: int = 1, **options) -> Task:
    """The synthetic task, except that `rank` nudges its first weight on its `step_calls`-th step:
    the replicas' parameters silently stop matching (what a rank-dependent bug would do)."""

    def nudge(task: Task) -> None:
        import torch

        with torch.no_grad():
            next(task.model.parameters()).add_(1e-3)

    return _on_training_call(synthetic_classification(**options), rank, step_calls, nudge)


def wrong_return(**options) -> int:
    """A task factory with a bug: it returns something that is not a Task."""
    synthetic_classification(**options)
    return 42


def raising_inside(**options) -> Task:
    """A task factory whose own code raises (the user's frame must come first in the traceback)."""
    sizes = {"hidden": 64}
    return synthetic_classification(hidden=sizes["hiden"], **options)

def failing_on_first_attempt(step_calls: int, rank: int = 1, **options) -> Task:
    """`failing_at`, but only while TORCHELASTIC_RESTART_COUNT is 0: a restarted attempt trains on."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT") != "0":
        return synthetic_classification(**options)
    return failing_at(step_calls, rank, **options)


def failing_to_build(rank: int = 1, **options) -> Task:
    """A factory that raises on `rank` while building the task (before any step)."""
    if int(os.environ["RANK"]) == rank:
        raise ValueError(f"cannot build the task on rank {rank}: no such dataset")
    return synthetic_classification(**options)


def only_outside_ranks(**options) -> Task:
    """Builds in the process that plans (no RANK set) and raises in every rank: a plan's step probe that fails."""
    if "RANK" in os.environ:
        raise ValueError(f"cannot build the task on rank {os.environ['RANK']}: no such dataset")
    return synthetic_classification(**options)


def crashing_while_building(rank: int = 1, **options) -> Task:
    """A factory that crashes the process in native code on `rank` (a segmentation fault)."""
    if int(os.environ["RANK"]) == rank:
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return synthetic_classification(**options)


def big(**options) -> Task:
    """The synthetic task with a model of about 1.3 M parameters (a checkpoint of about 16 MB)."""
    return synthetic_classification(dim=256, hidden=4096, **options)


@dataclass
class Output:
    """Shaped like a Hugging Face ModelOutput: attributes loss and logits."""

    loss: torch.Tensor
    logits: torch.Tensor


def fn_for_the_widget(steps: int, scale: float = 1.0) -> int:
    import torch.distributed as dist

    import workbench

    for step in range(1, steps + 1):
        workbench.log(step=step, loss=scale / step)
    return dist.get_rank()


def data_dependent(**options) -> Task:
    """The synthetic task whose model keeps only the positive inputs (torch.nonzero: a shape that depends on
    the data, which fake tensors cannot trace)."""
    import torch

    task = synthetic_classification(**options)
    inner = task.model

    class KeepPositive(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            kept = x[torch.nonzero(x.sum(1) > -1e9).squeeze(1)]
            return self.inner(kept)

    task.model = KeepPositive()
    return task


def reading_its_data(**options) -> Task:
    """The synthetic task, built by a factory that reads a tensor's value (its training set's mean label):
    it cannot be built on the meta device, so submit leaves its model's checks to the ranks."""
    task = synthetic_classification(**options)
    if task.train_dataset.tensors[1].float().mean().item() < 0:
        raise AssertionError("labels are class indices")
    return task


def billion(layers: int = 20, width: int = 8192, **options) -> Task:
    """An MLP of about 1.34 B parameters (20 x 8192 x 8192): planned, never built for real here."""
    import torch

    task = synthetic_classification(dim=width, classes=4, n_train=64, n_val=8, **options)
    blocks = [torch.nn.Linear(width, width) for _ in range(layers)]
    task.model = torch.nn.Sequential(*blocks, torch.nn.Linear(width, 4))
    return task


def conv_net(n_train: int = 512, n_val: int = 64) -> Task:
    """A small conv net on random 3x32x32 images, 10 classes.  Its step's peak is in its backward (where DDP
    under gradient accumulation holds two copies of the gradients), not in the optimizer's step."""
    import torch
    from torch.utils.data import TensorDataset

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n_train + n_val, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (n_train + n_val,), generator=gen)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    return Task(model=model, train_dataset=TensorDataset(x[:n_train], y[:n_train]),
                val_dataset=TensorDataset(x[n_train:], y[n_train:]), loss_fn=torch.nn.functional.cross_entropy)


def noting_listeners(note: str, **options) -> Task:
    """The synthetic task; at its first training call rank 0 writes who listens on MASTER_PORT (the
    rendezvous store: "127.0.0.1", "0.0.0.0", ...) to the JSON file `note`."""
    import json

    from tests.support.net import listening

    def write(task: Task) -> None:
        Path(note).write_text(json.dumps(listening(int(os.environ["MASTER_PORT"]))))

    return _on_training_call(synthetic_classification(**options), 0, 1, write)


class _LoadsThenHangs:
    """A dataset whose __getitem__ never returns on rank 1 after `items` items (in its DataLoader worker)."""

    def __init__(self, data, items: int):
        self.data, self.items, self.served = data, items, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        self.served += 1
        if os.environ["RANK"] == "1" and self.served > self.items:
            while True:  # a read that never returns: a stuck file system, a lock, a remote store
                time.sleep(0.05)
        return self.data[index]


def stuck_loader(items: int = 160, **options) -> Task:
    """The synthetic task, except that rank 1's DataLoader worker hangs in __getitem__ after `items` items."""
    task = synthetic_classification(**options)
    task.train_dataset = _LoadsThenHangs(task.train_dataset, items)
    return task
