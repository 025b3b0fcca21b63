"""Inside each rank started by plain torchrun: the engine, with the same run folder a submitted run writes.

    torchrun --nproc_per_node=2 -m workbench.train CONFIG.yaml [--run-dir DIR] [--set train.lr=1e-3 ...]

Every rank must be given the same run folder; without --run-dir, <run_root>/<name>-torchrun-<id>
is used, the id taken from TORCHELASTIC_RUN_ID (same on all ranks of one torchrun)."""

from __future__ import annotations

import argparse
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from workbench.config.sections import JobConfig
from workbench.runfolder.layout import RunDir, default_run_dir, safe_name
from workbench.runfolder.provenance import submit_provenance


@record  # a failure writes torchrun's error file: torchrun prints this rank's traceback
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--run-dir")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = parser.parse_args(argv)
    cfg = JobConfig.from_yaml(args.config).with_overrides(args.set)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id == "none" and not args.run_dir:
        parser.error("every rank must write to the same run folder: give --run-dir DIR, or run torchrun "
                     "with --standalone (or --rdzv-id) so the run id names a fresh folder")
    run_dir = args.run_dir or str(default_run_dir(cfg, suffix=safe_name(f"torchrun-{run_id}")))
    if os.environ.get("RANK", "0") == "0":
        RunDir(run_dir).prepare(cfg, executor="torchrun", **submit_provenance())
    from workbench.engine.rank import run_rank

    summary = run_rank(cfg, run_dir)
    if summary.get("rank") == 0:
        print(f"[workbench] finished {summary['steps']} steps; run folder: {run_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
