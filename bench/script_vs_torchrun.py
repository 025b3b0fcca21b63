"""A plain DDP script's throughput under `workbench launch` vs under `torchrun`, side by side.

The same script (bench/plain_ddp_script.py, no workbench import), 2 ranks on this machine, launched
alternately by `torchrun --standalone --nproc_per_node 2` and `workbench launch --nproc 2`; it times
its own steady steps, so only what the launcher gives the ranks (threads, environment) differs.

    python bench/script_vs_torchrun.py [--rounds 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).with_name("plain_ddp_script.py")


def measure(launcher: str, steps: int, folder: Path) -> dict:
    out = folder / f"{launcher}-{len(list(folder.iterdir()))}.json"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # each launcher's own rule
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    else:
        cmd = [sys.executable, "-m", "workbench.cli", "launch", "--nproc", "2", "--quiet",
               "--set", f"launch.run_root={folder / 'runs'}"]
    subprocess.run([*cmd, str(SCRIPT), str(out), str(steps)], check=True, env=env, capture_output=True,
                   timeout=600)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="script-bench-"))
    ratios, seen = [], {"torchrun": [], "workbench": []}
    for i in range(args.rounds):
        order = ("torchrun", "workbench") if i % 2 == 0 else ("workbench", "torchrun")
        found = {name: measure(name, args.steps, folder) for name in order}
        for name, result in found.items():
            seen[name].append(result["samples_per_s"])
        ratios.append(found["workbench"]["samples_per_s"] / found["torchrun"]["samples_per_s"])
        print(f"round {i + 1}: torchrun {found['torchrun']['samples_per_s']:,.0f} samples/s "
              f"({found['torchrun']['threads']} thread/rank), workbench launch "
              f"{found['workbench']['samples_per_s']:,.0f} ({found['workbench']['threads']} thread/rank), "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"median samples/s: torchrun {statistics.median(seen['torchrun']):,.0f}, "
          f"workbench launch {statistics.median(seen['workbench']):,.0f}")
    print(f"median ratio workbench launch / torchrun: {statistics.median(ratios):.3f} (target >= 0.97)")


if __name__ == "__main__":
    main()
