"""A reproduction, not a benchmark: why user code is never forked from a process that imported
torch._dynamo (workbench.engine.forked.ENGINE_PRELOAD).  No workbench code runs here.

A parent imports torch (and, with `dynamo`, torch._dynamo) and forks two children; each runs a
torchrun-style DDP script through runpy (gloo, 5 steps, destroy_process_group, then its globals go).
With torch._dynamo imported before the fork a child can hang as its DDP model is freed: the gloo
group's destructor joins its work thread holding the GIL, and that thread waits for the GIL to free a
work (gdb: ~ProcessGroupGloo -> std::thread::join; pt_gloo_runloop -> ~AsyncAllreduceWork ->
~ThreadLocalState -> take_gil).  Measured 2026-11-28, torch 2.13.0+cpu: 3 of 7 tries hung with
`dynamo`, 0 of 16 with `torch` or `fsdp`, 0 of 4 with `dynamo-in-child`.

    python bench/fork_after_dynamo.py --tries 8 [--preload dynamo|torch|fsdp|dynamo-in-child|none]
"""

from __future__ import annotations

import argparse
import os
import runpy
import socket
import sys
import tempfile
import textwrap
import time

SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    dist.destroy_process_group()
    """)


def one_try(script: str, preload: str, wait_s: float) -> bool:
    """Fork two ranks of the script; True when both ended within wait_s (the hung ones are killed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pids = []
    for rank in range(2):
        pid = os.fork()
        if pid == 0:
            os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            if preload == "dynamo-in-child":
                import torch._dynamo  # noqa: F401
            runpy.run_path(script, run_name="__main__")
            os._exit(0)
        pids.append(pid)
    left, deadline = set(pids), time.monotonic() + wait_s
    while left and time.monotonic() < deadline:
        left = {pid for pid in left if not os.waitpid(pid, os.WNOHANG)[0]}
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return not left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=8)
    parser.add_argument("--preload", default="dynamo", choices=("dynamo", "torch", "fsdp", "dynamo-in-child", "none"))
    parser.add_argument("--wait-s", type=float, default=20.0)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    if args.preload != "none":
        import torch

        torch.set_num_threads(1)
    if args.preload == "dynamo":
        import torch._dynamo  # noqa: F401
    if args.preload == "fsdp":
        import torch.distributed.fsdp  # noqa: F401
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "ddp_script.py")
        with open(script, "w") as fh:
            fh.write(SCRIPT)
        hung = sum(not one_try(script, args.preload, args.wait_s) for _ in range(args.tries))
    print(f"preload {args.preload}: {hung} of {args.tries} tries hung", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
