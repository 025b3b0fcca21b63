"""One shape of user code whose rank 1 hangs, for bench/failure_latency.py's hang column: prints one JSON line,
the seconds from the hang to the user holding the named failure, and what was named.

    python bench/bench_hang.py SHAPE RUN_ROOT STALL_S

SHAPE: factory | submit_fn | script | pool | collectives | sigstop | lightning | loader | slurm
(failure_latency.SHAPES says each; slurm needs a cluster: WORKBENCH_SLURM_PARTITION and SLURM's variables).  The hung
code notes when it hangs in the file BENCH_HANG_MARK names (the ranks inherit the environment); the Lightning script in
OUT/hung_at."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import workbench
from workbench.engine.builtin_tasks import synthetic_classification
from workbench.runfolder.layout import read_json

MARK = "BENCH_HANG_MARK"
SCRIPT = Path(__file__).with_name("failing_script.py")
LIGHTNING = Path(__file__).parent.parent / "tests" / "support" / "scripts" / "integrations" / "lightning_hang.py"
PARTITION = "WORKBENCH_SLURM_PARTITION"


def _mark() -> None:
    with open(os.environ[MARK], "w") as fh:
        fh.write(repr(time.time()))


def stuck_task(**options):
    """A factory defined in the submitting file: rank 1 sleeps in its 8th training loss."""
    task = synthetic_classification(**options)
    base, calls = task.loss_fn, {"n": 0}

    def stuck_loss(output, target):
        if task.model.training and os.environ["RANK"] == "1":
            calls["n"] += 1
            if calls["n"] == 8:
                _mark()
                time.sleep(3600)
        return base(output, target)

    task.loss_fn = stuck_loss
    return task


class HangingItems:
    """A dataset whose items rank 1's DataLoader worker stops giving after 100 (it notes when, and sleeps in
    __getitem__): the frame that never returns is in the worker process, not the rank."""

    def __init__(self, base, items: int = 100):
        self.base, self.items, self.given = base, items, 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index):
        self.given += 1  # counted in the worker process, where __getitem__ runs
        if os.environ["RANK"] == "1" and self.given == self.items:
            _mark()
            time.sleep(3600)
        return self.base[index]


def loader_task(**options):
    """The synthetic task with rank 1's DataLoader worker stuck in __getitem__ (data.num_workers 1)."""
    task = synthetic_classification(**options)
    task.train_dataset = HangingItems(task.train_dataset)
    return task


def own_loop(diverge: bool = False) -> None:
    """A submit_fn function with its own DDP loop: rank 1 sleeps at step 8, or calls a barrier where rank 0
    calls an all_reduce (diverge)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(4, 1))
    for step in range(1, 10**6):
        loss = model(torch.randn(8, 4)).sum()
        loss.backward()
        workbench.log(step=step, loss=loss)
        if step == 8 and rank == 1:
            _mark()
            if diverge:
                dist.barrier()
            time.sleep(3600)
        elif step == 8 and diverge:
            dist.all_reduce(torch.ones(3))
        time.sleep(0.01)


def config(root: str, stall_s: float) -> workbench.JobConfig:
    return workbench.JobConfig.from_dict({
        "task": {"options": {"n_train": 2048, "n_val": 64}},
        "train": {"micro_batch_size": 16, "epochs": 1000, "max_steps": 5000, "checkpoint_every_steps": None},
        "dist": {"procs_per_node": 2, "threads_per_rank": 1, "stall_after_s": stall_s, "lost_after_s": stall_s,
                 "timeout_s": 600},
        "launch": {"run_root": root}})


def submitted(run: workbench.Run) -> tuple[float, dict]:
    run.wait(timeout=600)
    seen = time.time()
    failure = run.exception()
    return seen, {"rank": failure and failure.rank, "type": failure and failure.type,
                  "message": failure and failure.message}


def sigstop(run: workbench.Run) -> tuple[float, dict]:
    while (read_json(run.dir.status(1)) or {}).get("step", 0) < 8:  # 64 steps an epoch, 1000 epochs
        time.sleep(0.1)
    _mark()
    os.kill(read_json(run.dir.status(1))["pid"], signal.SIGSTOP)  # its agent kills it once it is named
    return submitted(run)


def launched(root: str, stall_s: float, mark: str) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "workbench.cli", "launch", "--nproc", "2", "--set", f"launch.run_root={root}",
           "--set", "dist.threads_per_rank=1", "--set", f"dist.stall_after_s={stall_s}",
           str(SCRIPT), "hang", mark]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    seen, said = float("nan"), ""
    for line in proc.stderr:
        if line.startswith("[workbench] rank 1 (") and "hung" in line and not said:
            seen, said = time.time(), line.strip()
    proc.wait(timeout=120)
    return seen, {"rank": 1 if said else None, "type": "Hung" if said else None, "message": said}


def on_slurm(cfg: workbench.JobConfig, mark: str) -> tuple[float, dict]:
    """The script through the SLURM executor: two nodes, one rank each; it notes its hang in `mark` (JSON)."""
    cfg = cfg.with_overrides(["dist.nodes=2", "dist.procs_per_node=1", "launch.executor=slurm",
                              f"launch.slurm.partition={os.environ[PARTITION]}", "launch.slurm.cpus_per_task=1"])
    return submitted(workbench.submit_script(SCRIPT, ["hang", mark], cfg))


def main() -> None:
    shape, root, stall_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    os.environ[MARK] = mark = os.path.join(tempfile.mkdtemp(), "hung_at")
    cfg = config(root, stall_s)
    if shape == "factory":
        seen, said = submitted(workbench.submit(cfg, task=stuck_task))
    elif shape == "loader":
        seen, said = submitted(workbench.submit(cfg.replace(data__num_workers=1), task=loader_task))
    elif shape == "sigstop":
        seen, said = sigstop(workbench.submit(cfg))  # the built-in task
    elif shape in ("submit_fn", "collectives"):
        seen, said = submitted(workbench.submit_fn(own_loop, cfg=cfg, diverge=shape == "collectives"))
    elif shape == "pool":
        pool = workbench.Pool(cfg, idle_timeout_s=300).wait_ready(300)
        try:
            seen, said = submitted(pool.submit_fn(own_loop))
        finally:
            pool.close()
    elif shape == "lightning":
        out = tempfile.mkdtemp()
        seen, said = submitted(workbench.submit_script(LIGHTNING, [out], cfg))
        mark = os.path.join(out, "hung_at")
    elif shape in ("script", "slurm"):
        os.environ[MARK] = mark = os.path.join(tempfile.mkdtemp(), "hung_at.json")
        seen, said = on_slurm(cfg, mark) if shape == "slurm" else launched(root, stall_s, mark)
        print(json.dumps({"latency_s": seen - json.loads(Path(mark).read_text())["raised_at"], **said}))
        return
    else:
        raise SystemExit(f"unknown shape {shape}")
    print(json.dumps({"latency_s": seen - float(Path(mark).read_text()), **said}))


if __name__ == "__main__":
    main()
