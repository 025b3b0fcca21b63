"""A sweep folder as a killed driver leaves it, made without starting a run (Optuna's ask and tell
on the sweep's own journal): the resume and damaged-file tests start from it."""

from __future__ import annotations

import time
from pathlib import Path

from workbench.config import JobConfig
from workbench.runfolder.layout import SweepDir
from workbench.runfolder.private import write_atomic
from workbench.sweeps import space as sp

SPACE = {"train.lr": [1e-3, 2e-3, 3e-3]}


def sweep_folder(root: Path, asked: int = 0, told: int = 0) -> SweepDir:
    """A sweep folder as workbench.sweep makes one, its driver gone after `told` trials finished
    and `asked` more were asked for and given nothing (a driver killed after Optuna's ask)."""
    import optuna

    from workbench.sweeps.study import make_pruner, make_sampler, storage

    folder = SweepDir.new(root / "runs", "resumed").create()
    write_atomic(folder.config, JobConfig.from_dict({"launch": {"run_root": str(root / "runs")}}).to_yaml().encode())
    folder.update_meta(name=folder.root.name, space=sp.space_to_json(SPACE), metric="val_loss",
                       direction="minimize", trials=len(SPACE["train.lr"]), parallel=1, executor="local",
                       sampler="grid", pruner="none", script=None, created=time.time())
    sampler = make_sampler(None, SPACE)
    study = optuna.create_study(storage=storage(folder), study_name="sweep", direction="minimize", sampler=sampler,
                                pruner=make_pruner(None, sampler))
    for _ in range(told):
        trial = study.ask()
        trial.suggest_categorical("train.lr", SPACE["train.lr"])
        trial.set_user_attr("run_dir", f"trial-{trial.number}")
        study.tell(trial, 1.0)
    for _ in range(asked):
        study.ask()
    return folder


