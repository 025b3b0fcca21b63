"""Creating a run folder on the submitting side: name, private permissions, config snapshot."""

from __future__ import annotations

import getpass
import socket
import time
from pathlib import Path
from typing import Any

from workbench.config import JobConfig
from workbench.rundir import RunDir, read_json, write_json_atomic


def default_run_dir(cfg: JobConfig, suffix: str | None = None) -> Path:
    """<run_root>/<name>-<YYYYmmdd-HHMMSS>[-suffix]; name defaults to the task name."""
    name = cfg.launch.name or _safe(cfg.task.name)
    stamp = suffix or time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}"
    return Path(cfg.launch.run_root).expanduser().resolve() / f"{name}-{stamp}"


def prepare_run_dir(run_dir: str | Path, cfg: JobConfig, executor: str, **facts: Any) -> RunDir:
    """Create the folder tree (0700), write config.yaml and run.json; keeps an existing run.json's start."""
    run = RunDir(Path(run_dir)).create()
    cfg.to_yaml(run.config)
    meta = read_json(run.meta, {}) or {}
    if meta:
        forget_last_attempt(run, meta)
    meta.update({"executor": executor, "world_size": cfg.world_size, "nodes": cfg.dist.nodes,
                 "procs_per_node": cfg.dist.procs_per_node, "user": getpass.getuser(),
                 "submit_host": socket.gethostname(), **facts})
    meta.setdefault("created", time.time())
    write_json_atomic(run.meta, meta)
    return run


def forget_last_attempt(run: RunDir, meta: dict[str, Any]) -> None:
    """A run folder used again (continue from its checkpoint): the last attempt's end is history.
    Errors, statuses, stacks, summary and the cancel mark go; metrics, events, logs and
    checkpoints stay."""
    for kind in ("errors", "status", "stacks"):
        for path in (run.root / kind).glob("rank*"):
            path.unlink(missing_ok=True)
    run.summary.unlink(missing_ok=True)
    meta.pop("cancelled", None)


def record_job(run: RunDir, job: Any) -> None:
    """Note the scheduler's job id in run.json, so Run.load can reattach to the job later."""
    meta = read_json(run.meta, {}) or {}
    meta["job_id"] = str(job.job_id)
    meta.setdefault("job_ids", []).append(str(job.job_id))
    write_json_atomic(run.meta, meta)


def _safe(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.split(":")[-1].strip("<>"))
    return keep.strip("-")[:40] or "run"
