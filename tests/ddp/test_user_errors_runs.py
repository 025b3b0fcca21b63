"""Errors raised by the user's own task factory, model or script: the rank's error file shows the
user's frames and hides the workbench's (WORKBENCH_TRACEBACK=full shows every frame); an error
the workbench raises about the user's input is its one line."""
from __future__ import annotations

import pytest

from workbench.config import JobConfig
from workbench.engine.userframes import HIDDEN_NOTE
from workbench.launch.run import Run

pytestmark = pytest.mark.timeout(60)



@pytest.mark.ddp
@pytest.mark.parametrize("task, expected", [
    ({"name": "tests.support.tasks_for_tests:wrong_return"},
     "TypeError: task factory tests.support.tasks_for_tests.wrong_return returned int; return workbench.Task(model=..., "
     "train_dataset=..., loss_fn=...) or a dict with those keys"),
    ({"name": "synthetic", "options": {"n_train": 8}},
     "workbench.errors.ConfigError: train.micro_batch_size: the training set has 8 samples but one "
     "optimizer step needs 16 (micro_batch_size x grad_accum_steps x world_size); lower micro_batch_size or "
     "grad_accum_steps, or use fewer ranks"),
])
def test_in_a_real_rank_the_users_mistake_is_its_one_line(tmp_path, task, expected):
    """One rank under the torchrun entry (a real process, a gloo group of one): its error file holds
    the one line, no framework frames before it."""
    import os
    import subprocess
    import sys

    cfg = JobConfig.from_dict({"task": task, "train": {"micro_batch_size": 16}, "dist": {"procs_per_node": 1},
                               "launch": {"run_root": str(tmp_path)}})
    cfg.to_yaml(tmp_path / "job.yaml")
    from workbench.engine.rendezvous import free_port

    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    env.pop("WORKBENCH_TRACEBACK", None)
    done = subprocess.run([sys.executable, "-m", "workbench.train", str(tmp_path / "job.yaml"), "--run-dir",
                           str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    failure = Run(tmp_path / "run").exception()
    assert failure.traceback == f"{expected}\n{HIDDEN_NOTE}"

