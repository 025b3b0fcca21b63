"""A plain torchrun-style script (no workbench import) for bench/failure_latency.py.

    failing_script.py print LINES EVERY_S   rank 0 prints LINES lines "tick I T" (T: Unix time when
                                            printed) every EVERY_S seconds, without flush
    failing_script.py fail OUT.json         both ranks train a tiny model; after a few steps rank 1
                                            raises, having written the time of the raise to OUT.json
    failing_script.py hang OUT.json         the same, but rank 1 hangs in Python (a loop that sleeps) instead
"""
import json
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
if mode == "print":
    lines, every_s = int(sys.argv[2]), float(sys.argv[3])
    for i in range(lines):
        if rank == 0:
            print(f"tick {i} {time.time():.6f}")  # no flush: as nanoGPT and the PyTorch examples print
        time.sleep(every_s)
    dist.barrier()
else:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    for step in range(1000):
        if rank == 1 and step == 20:
            with open(sys.argv[2], "w") as fh:
                json.dump({"raised_at": time.time()}, fh)
            while mode == "hang":  # a bug that never returns: rank 0 waits in the gradient all-reduce
                time.sleep(0.05)
            raise ValueError("injected failure in the loss")
        model(torch.randn(4, 8)).sum().backward()
        time.sleep(0.01)
dist.destroy_process_group()
