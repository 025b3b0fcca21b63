"""A tiny harness for real multi-process tests: spawn `world_size` fresh processes with the
torchrun environment, init a gloo process group, run a module-level function, collect results."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import traceback
from typing import Any, Callable

from workbench.engine.rendezvous import free_port


def run_ranks(fn: Callable[..., Any], world_size: int = 2, timeout: float = 120, **kwargs: Any) -> list[Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(fn, rank, world_size, port, queue, kwargs)) for rank in range(world_size)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = {r: v for r, v in results.items() if isinstance(v, _Failure)}
    if errors:
        raise AssertionError("\n".join(f"rank {r}:\n{e.text}" for r, e in errors.items()))
    return [pickle.loads(results[r]) for r in range(world_size)]


class _Failure:
    def __init__(self, text: str):
        self.text = text


def _worker(fn: Callable[..., Any], rank: int, world: int, port: int, queue: Any, kwargs: dict) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        queue.put((rank, pickle.dumps(fn(rank, **kwargs))))  # by value: no shared-memory tensors
    except BaseException:  # noqa: BLE001 - report every failure to the parent
        queue.put((rank, _Failure(traceback.format_exc())))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
