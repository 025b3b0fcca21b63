"""How a submitit process becomes a torchrun-style rank: the torchrun contract, where ranks meet,
and which GPU each rank takes.

Local runs meet on 127.0.0.1 at a port the submitter found free.  On SLURM the port cannot be
chosen by the submitter (the node is not known yet), so global rank 0 picks a free port on its
node and publishes it in the run folder; the other ranks wait for it."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.engine.env import DistEnv, export_torchelastic
from workbench.engine.flight import recorder_env
from workbench.runfolder.layout import RunDir, read_json, write_json_atomic


@dataclass
class RankContract:
    """Made by the submitter, pickled with the entry callable, applied inside each rank."""

    local: bool
    """Rendezvous on 127.0.0.1 with `port` (local) or on the first node of the allocation (SLURM)."""
    port: int = 0
    gpu_ids: list[str] = field(default_factory=list)
    """Device ids the user made visible; the rank with local rank i gets gpu_ids[i]."""
    rendezvous_timeout_s: float = 300.0

    def export(self, run: RunDir) -> DistEnv:
        """Set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ... from submitit's view."""
        import submitit

        job = submitit.JobEnvironment()
        world, nodes = job.num_tasks, job.num_nodes
        host = "127.0.0.1" if self.local else job.hostnames[0]
        port = self.port or self._slurm_port(run, job)
        env = DistEnv(job.global_rank, job.local_rank, world, world // nodes, host, port)
        env.export()
        export_torchelastic(str(job.job_id), attempt())
        if self.gpu_ids:  # one GPU per rank, chosen from the user's own visible set
            os.environ["CUDA_VISIBLE_DEVICES"] = self.gpu_ids[job.local_rank % len(self.gpu_ids)]
        return env

    def _slurm_port(self, run: RunDir, job: Any) -> int:
        path = run.rendezvous(run.start_key(str(job.job_id), attempt()))
        if job.global_rank == 0:
            return publish_port(path, job.hostnames[0])
        return wait_for_port(path, self.rendezvous_timeout_s)


RUN_DIR_ENV = "WORKBENCH_RUN_DIR"
"""The run folder of the job a process belongs to: the local controller's, a script's (workbench.log writes there)."""
REQUEUES_ENV = "WORKBENCH_REQUEUES"
"""Set by workbench's local controller: how many times it started the job's tasks again."""


def attempt() -> int:
    """How many times this job was requeued before (SLURM_RESTART_COUNT; locally the controller's count)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or os.environ.get(REQUEUES_ENV) or 0)


def torchrun_env(error_file: Path) -> dict[str, str]:
    """What torchrun's agent gives each worker besides the rank variables: its error file (where
    torch's @record writes), the signals its handlers turn into a clean exit, NCCL's async error
    handling, and PyTorch's flight recorder on (engine.flight: which collective a hung rank is in);
    a value the user set is kept."""
    return {"TORCHELASTIC_ERROR_FILE": str(error_file),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE",
                                                             "SIGTERM,SIGINT,SIGHUP,SIGQUIT"),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            **recorder_env()}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def publish_port(path: Path, host: str, **facts: Any) -> int:
    """Rank 0: a fresh free port on this node, published at `path` with `host` (and `facts`) for the others."""
    port = free_port("")
    write_json_atomic(path, {"host": host, "port": port, "time": time.time(), **facts})
    return port


def wait_for_port(path: Path, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        port = (read_json(path) or {}).get("port")
        if type(port) is int and 0 < port < 65536:  # a damaged file is waited past, like an absent one
            return port
        time.sleep(0.1)
    raise TimeoutError(f"rank 0 did not publish its rendezvous port in {path} within {timeout_s:.0f} s "
                       "(is the run folder on a filesystem shared by all nodes?)")
