"""A torchrun-style script: its own init_process_group() (env://), then rank 0 notes who listens on
MASTER_PORT (the rendezvous store) in the file named by its argument."""

import json
import os
import sys

import torch.distributed as dist

from tests.support.net import listening

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as fh:
        json.dump(listening(int(os.environ["MASTER_PORT"])), fh)
dist.barrier()
dist.destroy_process_group()
