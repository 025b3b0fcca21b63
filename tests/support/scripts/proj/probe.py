"""Writes what a rank sees (its environment, threads, sys.argv, working folder) to OUT/rank{R}.json."""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

try:
    from helper import GREETING  # `python proj/probe.py`: the script's folder is on sys.path
except ImportError:
    from proj.helper import GREETING  # `python -m proj.probe`: the working folder is

dist.init_process_group("gloo")
out = Path(sys.argv[1])
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
        "PROBE")
seen = {"env": {k: os.environ.get(k) for k in keys}, "threads": torch.get_num_threads(), "argv": sys.argv[1:],
        "cwd": os.getcwd(), "elastic": dist.is_torchelastic_launched(), "greeting": GREETING, "name": __name__}
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen))
dist.barrier()  # all ranks must reach this: a rank that left first would close gloo's pair under its peer
dist.destroy_process_group()
