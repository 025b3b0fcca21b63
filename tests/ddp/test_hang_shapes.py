"""Hangs named with their collective across the shapes users run (notes/shapes.md), 2 real gloo ranks on CPU.

Which collective comes from PyTorch's flight recorder, which every rank's agent turns on (engine.flight): each
test asserts the rank, the collective and the user frame the failure names, never how long it took (that is
bench/failure_latency.py's hang column).  The cells, and why the others take the same path:

- stuck in Python in the loss, a factory defined in a notebook cell (nbclient, here): the factory in the
  submitting file (test_failure_causes, comm timing on and off) and the built-in task run the same engine loop;
  only where the code was defined differs, and that is what this cell tests.  The same kind in a script with
  no workbench.log is test_failure_causes' unlogged test, which asserts the collective never entered too.
- skips a collective, a script with no workbench.log that prints without flush (here): a submit_fn function
  issues its own collectives the same way, with no engine hook in between.
- in a different collective, submit_fn in a warm pool (here): submit_fn in fresh ranks is the same function
  runner; in a pool the recorder's numbers carry on from the warm-up step and earlier jobs.
- SIGSTOP, the engine in fresh ranks (test_run_lifecycle): the same in every shape, since the stopped rank runs
  no code and its ring neighbour's watch names it, with the collective the neighbour waits in.

- stuck in a DataLoader worker's __getitem__, a factory named by module (`package.module:function`, as from
  YAML) with data.num_workers 1 (here): the frame is in the worker process, read from the rank
  (engine.loaderstacks); a user's own loop with a DataLoader waits in the same torch iterator.
- stuck in Python in training_step, a Lightning Trainer script (strategy ddp, 2 CPU devices, its one added line
  logger=WorkbenchLogger()) under submit_script (here): Lightning makes its own process group from torchrun's
  variables (no launcher of its own under workbench) and runs the step and backward in its own frames; the
  waiting rank is in DDP's reducer as in any script.  Fabric and Accelerate loops call the same DDP.

On SLURM (tests/slurm/test_slurm_failures.py): a script rank stuck in its loss, two nodes, one rank each.

Collectives of different sizes are no hang on gloo: its own check aborts a rank in native code, named with
gloo's words and the user's line (test_failure_causes' sizes test); on NCCL they hang, and the recorder's
size comparison (engine.hang.mismatch) is unit-tested.

A SIGSTOPped rank has no user frame to name (a stopped process runs nothing and was not stalled before): its
message names the collective the noticing rank waits in and that rank's frame."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import CLI, assert_nothing_left, cfg
from workbench.engine.flight import recorder_env
from workbench.engine.rendezvous import free_port

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]

NO_STEP_STALL_S = 20
"""Before a first step (no workbench.log) a smaller limit named a rank still importing torch on a loaded machine."""
STEP_STALL_S = 10
"""With steps logged, the limit counts from the last step: the ranks are past their start."""

PROBE = """
import json, threading
import torch, torch.distributed as dist
from workbench.engine.flight import last_collective
print(json.dumps(last_collective()))
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
dist.all_reduce(torch.ones(10))
dist.barrier()
seen = []
reader = threading.Thread(target=lambda: seen.append(last_collective()))  # as the heartbeat thread reads it
reader.start()
reader.join()
print(json.dumps(seen[0]))
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_gloo_on_cpu_records_each_collective_with_its_number_op_and_sizes():
    """The probe the design rests on: gloo (not only NCCL) records, read from a thread other than the caller's."""
    done = subprocess.run([sys.executable, "-c", PROBE % free_port()], env={**os.environ, **recorder_env()},
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert before is None  # no process group yet: nothing recorded, nothing raised
    assert after == {"collective": "barrier", "collective_seq": 2, "collective_sizes": "[]", "collective_done": True}


CELL_FACTORY = '''
import json, os, time
import workbench
from workbench.engine.builtin_tasks import synthetic_classification

def stuck_task(**options):  # defined in a notebook cell: pickled by value, its code in the kernel's cell file
    task = synthetic_classification(**options)
    base, calls = task.loss_fn, {"n": 0}

    def stuck_loss(output, target):
        if task.model.training and os.environ["RANK"] == "1":
            calls["n"] += 1
            if calls["n"] == 8:
                time.sleep(3600)
        return base(output, target)

    task.loss_fn = stuck_loss
    return task
'''

CELL_SUBMIT = '''
cfg = workbench.JobConfig.from_dict({
    "task": {"options": {"n_train": 2048, "n_val": 64}},
    "train": {"micro_batch_size": 16, "max_steps": 5000, "checkpoint_every_steps": None},
    "dist": {"procs_per_node": 2, "threads_per_rank": 1, "stall_after_s": %d, "timeout_s": 600},
    "launch": {"run_root": %r},
})
run = workbench.submit(cfg, task=stuck_task)
status = run.wait(timeout=200)
failure = run.exception()
print(json.dumps({"folder": str(run.folder), "state": status.state, "rank": failure and failure.rank,
                  "type": failure and failure.type, "where": failure and failure.where,
                  "message": failure and failure.message}))
'''


def test_a_factory_from_a_notebook_cell_stuck_in_its_loss_names_rank_collective_and_cell_frame(tmp_path):
    """The default engine path (comm timing on) with the factory defined in a real kernel's cell."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL_FACTORY), nbformat.v4.new_code_cell(
        CELL_SUBMIT % (STEP_STALL_S, str(tmp_path / "runs")))])
    NotebookClient(nb, kernel_name="python3", timeout=240, startup_timeout=120,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    said = json.loads(nb.cells[1].outputs[-1]["text"].strip().splitlines()[-1])
    assert said["state"] == "failed" and (said["rank"], said["type"]) == (1, "Hung"), said
    assert said["where"].endswith("in stuck_loss") and not said["where"].startswith("<"), said  # the cell's file
    assert "rank 0 waits for it in a collective (all_reduce #" in said["message"], said
    assert "which rank 1 never entered; its last was " in said["message"], said
    assert_nothing_left(Path(said["folder"]))


def test_a_script_rank_that_skips_a_collective_is_named_where_the_ranks_part(tmp_path):
    """A plain script, no workbench.log, unflushed prints: rank 1 skips one all_reduce, its calls pair one off,
    and at the end it waits at the barrier while rank 0 waits in its last all_reduce: one number, two ops."""
    command = [*CLI, "launch", "--nproc", "2", "--set", f"launch.run_root={tmp_path / 'runs'}",
               "--set", "dist.threads_per_rank=1", "--set", f"dist.stall_after_s={NO_STEP_STALL_S}",
               str(SCRIPTS / "faults.py"), "skip", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, start_new_session=True)
    folder = Path(next(line for line in done.stdout.splitlines() if "run folder:" in line).split("run folder:")[1]
                  .strip())
    failure = workbench.Run.load(folder).exception()
    assert done.returncode == 1 and (failure.rank, failure.type) == (1, "Hung"), (failure.summary(), done.stderr)
    assert "ranks in different collectives at the same number #" in failure.message, failure.message
    assert "rank 0 in all_reduce #" in failure.message and "rank 1 in barrier #" in failure.message, failure.message
    assert "faults.py:" in failure.where and failure.where.endswith("in <module>"), failure.where
    assert "rank 1 (" in done.stderr and "different collectives" in done.stderr, done.stderr[-3000:]
    assert_nothing_left(folder)


def diverging_function() -> None:
    """Defined in this file, run by submit_fn (pickled by value, as from a notebook cell): its own DDP loop."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import workbench

    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(4, 1))
    for step in range(1, 10**6):
        loss = model(torch.randn(8, 4)).sum()
        loss.backward()
        workbench.log(step=step, loss=loss)
        if step == 6:
            if rank == 0:
                dist.all_reduce(torch.ones(3))  # rank 0 sums a metric over the ranks...
            else:
                dist.barrier()  # ...while rank 1 waits at a barrier: a different collective at the same number


@pytest.mark.timeout(400)
def test_a_warm_pool_job_whose_ranks_call_different_collectives_names_both(tmp_path):
    """submit_fn in a warm pool: the pool's process group (and its recorder's numbers) carry on from its warm-up
    step and earlier jobs; the ranks are named by what they are in now."""
    pool = workbench.Pool(cfg(tmp_path, dist={"stall_after_s": STEP_STALL_S, "timeout_s": 600}),
                          idle_timeout_s=300).wait_ready(180)
    try:
        run = pool.submit_fn(diverging_function)
        assert run.wait(timeout=200).state == "failed"
        failure = run.exception()
        assert (failure.rank, failure.type) == (1, "Hung"), failure.summary()
        assert "ranks in different collectives at the same number #" in failure.message, failure.message
        assert "rank 0 in all_reduce #" in failure.message and "of sizes [[3]]" in failure.message, failure.message
        assert "rank 1 in barrier #" in failure.message, failure.message
        assert "test_hang_shapes.py:" in failure.where and failure.where.endswith("in diverging_function"), failure
    finally:
        pool.close()
    assert_nothing_left(pool.dir.root)


def test_a_rank_whose_dataloader_worker_hangs_in_getitem_is_named_at_that_frame(tmp_path):
    """Rank 1's main thread waits for a batch in torch's DataLoader code; the frame that never returns is the
    dataset's __getitem__ in its worker process: named from there, with the collective rank 0 waits in."""
    job = cfg(tmp_path, "tests.support.tasks_for_tests:stuck_loader", max_steps=5000, checkpoint_every_steps=None,
              dist={"stall_after_s": STEP_STALL_S, "timeout_s": 600})
    run = workbench.submit(job.replace(data__num_workers=1))
    assert run.wait(timeout=240).state == "failed"
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "Hung"), failure.summary()
    assert "tasks_for_tests.py:" in failure.where and failure.where.endswith("in __getitem__"), failure.where
    assert "in its DataLoader worker (pid " in failure.message, failure.message
    assert "which rank 1 never entered" in failure.message, failure.message
    assert_nothing_left(run.folder)


def test_a_lightning_script_whose_rank_hangs_in_training_step_names_rank_collective_and_frame(tmp_path):
    """A plain Lightning Trainer script launched as users launch one (submit_script): rank 1 never returns from
    training_step 6 while rank 0 waits for its gradients in DDP's all-reduce, in Lightning's frames."""
    script = SCRIPTS / "integrations" / "lightning_hang.py"
    run = workbench.submit_script(script, [str(tmp_path / "out")],
                                  cfg(tmp_path, dist={"stall_after_s": STEP_STALL_S, "timeout_s": 600}), nproc=2)
    assert run.wait(timeout=240).state == "failed"
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "Hung"), failure.summary()
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "time.sleep(0.05)" in text)
    assert failure.where == f"{script}:{line} in training_step", failure.where  # the user's line, not Lightning's
    assert "rank 0 waits for it in a collective (all_reduce #" in failure.message, failure.message
    assert "which rank 1 never entered" in failure.message, failure.message
    assert [r.state for r in run.status().ranks] == ["aborted", "hung"]
    assert_nothing_left(run.folder)
