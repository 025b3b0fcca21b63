"""The torchrun contract as read inside a rank, and the device and backend it implies."""

from __future__ import annotations

import os
from dataclasses import dataclass

CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environ(cls) -> DistEnv:
        """Read RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torchrun sets them)."""
        missing = [k for k in CONTRACT if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"missing {', '.join(missing)} in the environment: start ranks with torchrun, "
                "workbench run, or workbench.submit"
            )
        world = int(os.environ["WORLD_SIZE"])
        return cls(
            rank=int(os.environ["RANK"]), local_rank=int(os.environ["LOCAL_RANK"]), world_size=world,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
            master_addr=os.environ["MASTER_ADDR"], master_port=int(os.environ["MASTER_PORT"]),
        )

    def export(self) -> None:
        """Write this contract into os.environ (what torchrun would have set for its ranks)."""
        os.environ.update(
            RANK=str(self.rank), LOCAL_RANK=str(self.local_rank), WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(self.local_world_size), MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port), GROUP_RANK=str(self.rank // self.local_world_size),
            GROUP_WORLD_SIZE=str(self.world_size // self.local_world_size),
            ROLE_RANK=str(self.rank), ROLE_WORLD_SIZE=str(self.world_size), ROLE_NAME="default",
        )


def export_torchelastic(run_id: str, restart_count: int = 0, max_restarts: int = 0) -> None:
    """The TORCHELASTIC_* variables torchrun's agent sets, so that code asking
    torch.distributed.is_torchelastic_launched() (Lightning, Accelerate) sees a torchrun-style rank.
    No agent hosts the store here: every rank's init_process_group meets at MASTER_ADDR:MASTER_PORT."""
    os.environ.update(TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT=str(restart_count),
                      TORCHELASTIC_MAX_RESTARTS=str(max_restarts), TORCHELASTIC_USE_AGENT_STORE="False")


def pick_device_and_backend(local_rank: int, backend: str = "auto") -> tuple[str, str]:
    """("cuda:0"|"xpu:N"|"cpu", backend).  auto: CUDA -> nccl, XPU -> xccl, else gloo.

    On CUDA the launcher has already narrowed CUDA_VISIBLE_DEVICES to this rank's GPU when it
    could; otherwise the rank uses device local_rank."""
    import torch

    if torch.cuda.is_available():
        index = 0 if torch.cuda.device_count() == 1 else local_rank
        device, auto = f"cuda:{index}", "nccl"
    elif getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        device, auto = f"xpu:{local_rank}", _xpu_backend()
    else:
        device, auto = "cpu", "gloo"
    return device, (auto if backend == "auto" else backend)


def _xpu_backend() -> str:
    import torch.distributed as dist

    return "xccl" if "xccl" in getattr(dist.Backend, "backend_list", []) else "ccl"


def join_process_group(backend: str, env: DistEnv, timeout_s: float) -> bool:
    """Bring the default process group up; True when this call made it (the caller destroys it).
    In a warm pool's worker (workbench.engine.warm) it is up already, for the pool's ranks: it is
    used as it is and left up for the next job (False); a job asking another backend is refused."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_initialized():
        held = str(dist.get_backend())
        if held != backend:
            raise RuntimeError(f"dist.backend: the pool's process group is {held}, this job asks {backend}; "
                               f"submit it with dist.backend={held}, or start a pool for {backend}")
        return False
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size, timeout=timedelta(seconds=timeout_s))
    return True
