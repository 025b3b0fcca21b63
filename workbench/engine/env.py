"""The torchrun contract as read inside a rank, and the device and backend it implies."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
    serve_store_on_loopback()
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size, timeout=timedelta(seconds=timeout_s))
    return True


@contextlib.contextmanager
def borrowed_group(advice: str) -> Iterator[None]:
    """User code's own init_process_group() and destroy_process_group() (a torchrun-style script in
    a warm pool, a function given to submit_fn) around a default group workbench holds: the first
    finds the group up (the same backend: nothing to do; another: refused with `advice`, formatted
    with held= and asked=), the second leaves it up for workbench to end.  Put back afterwards."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    held = str(dist.get_backend())
    real = c10d.init_process_group, c10d.destroy_process_group

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> None:
        if backend is not None and str(backend).lower() != held:
            raise RuntimeError(f"init_process_group({backend!r}): " + advice.format(held=held, asked=backend))

    def destroy_process_group(group: Any = None) -> None:
        if group is not None and group is not dist.group.WORLD:
            real[1](group)

    modules: tuple[Any, ...] = (dist, c10d)
    for module in modules:
        module.init_process_group, module.destroy_process_group = init_process_group, destroy_process_group
    try:
        yield
    finally:
        for module in modules:
            module.init_process_group, module.destroy_process_group = real


_loopback_store: tuple[int, Any] | None = None
"""(port, the TCPStore rank 0 serves on loopback), kept for the life of the process."""


def serve_store_on_loopback() -> None:
    """Rank 0 of ranks that meet on loopback (a local run or pool: MASTER_ADDR 127.0.0.1) serves the
    rendezvous store on loopback alone.  torch's env:// rendezvous has rank 0 listen on every
    interface (`*:MASTER_PORT`), and the store has no authentication: anyone who reaches the port can
    read and write its keys.  The TCPStore made here listens on a socket bound to MASTER_ADDR
    (`master_listen_fd`) and is multi-tenant, as the rendezvous' own rank-0 TCPStore is, so that one
    shares its server: init_process_group(), the engine's or a script's own, meets here.  Called
    before the group is made (the engine, a function, a pool) and before a script runs.  Ranks that
    meet at a node's address (SLURM) or whose store torchrun's agent hosts are left to torch."""
    global _loopback_store
    addr, port = os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT") or 0)
    if os.environ.get("RANK") != "0" or not port or not _is_loopback(addr) \
            or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return
    if _loopback_store is not None and _loopback_store[0] == port:
        return
    from datetime import timedelta

    import torch.distributed as dist

    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((addr, port))  # a port taken meanwhile: EADDRINUSE, which the agents meet again after
        listener.listen(512)
        store = dist.TCPStore(addr, port, None, True, timedelta(seconds=60), wait_for_workers=False,
                              multi_tenant=True, master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store's server owns the socket now
    _loopback_store = (port, store)


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False  # a host name (SLURM's first node): its interfaces are torch's to choose
