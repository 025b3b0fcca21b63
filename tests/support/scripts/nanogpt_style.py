"""A script configured as nanoGPT's train.py is (its configurator.py, verbatim in spirit): globals, then
`exec(open('configurator.py').read())`, which takes a config file and `--key=value` arguments only (a
`--key value` pair fails its assert).  It logs score = 1000 x learning_rate, all-reduced over the ranks."""

import sys
from ast import literal_eval

import torch
import torch.distributed as dist

import workbench

learning_rate = 6e-4
max_iters = 2

for arg in sys.argv[1:]:  # nanoGPT's configurator.py
    if "=" not in arg:
        assert not arg.startswith("--")
        exec(open(arg).read())
    else:
        assert arg.startswith("--")
        key, val = arg.split("=")
        key = key[2:]
        if key in globals():
            try:
                attempt = literal_eval(val)
            except (SyntaxError, ValueError):
                attempt = val
            assert type(attempt) is type(globals()[key])
            globals()[key] = attempt
        else:
            raise ValueError(f"Unknown config key: {key}")

dist.init_process_group("gloo")
for step in range(1, max_iters + 1):
    lr = torch.tensor([learning_rate])
    dist.all_reduce(lr)
    workbench.log(step=step, score=1000 * lr.item() / dist.get_world_size())
dist.destroy_process_group()
