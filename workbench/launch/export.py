"""Equivalent commands for people who run outside the notebook: a torchrun line, an sbatch script."""

from __future__ import annotations

import shlex

from workbench.config.sections import JobConfig
from workbench.launch.executors import slurm_parameters

RDZV_PORT = 29500


def torchrun_command(cfg: JobConfig, config_path: str, run_dir: str | None = None) -> str:
    """A torchrun command running `config_path` with the engine (per node, for multi-node)."""
    parts = ["torchrun", f"--nnodes={cfg.dist.nodes}", f"--nproc_per_node={cfg.dist.procs_per_node}"]
    if cfg.dist.nodes == 1:
        parts.append("--standalone")
    else:
        parts += ["--rdzv_backend=c10d", f"--rdzv_endpoint=$MASTER_ADDR:{RDZV_PORT}", "--rdzv_id=$RUN_ID"]
    parts += ["-m", "workbench.train", shlex.quote(config_path)]
    if run_dir:
        parts += ["--run-dir", run_dir]
    return " ".join(parts)


def sbatch_script(cfg: JobConfig, config_path: str) -> str:
    """An sbatch script: one torchrun per node (srun), rendezvous on the allocation's first node."""
    params = slurm_parameters(cfg)
    s = cfg.launch.slurm
    lines = ["#!/bin/bash", f"#SBATCH --job-name={params['job_name']}", f"#SBATCH --nodes={cfg.dist.nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --cpus-per-task={s.cpus_per_task * cfg.dist.procs_per_node}",
             f"#SBATCH --time={params['time']}", f"#SBATCH --signal=USR2@{params['signal_delay_s']}",
             "#SBATCH --output=%x-%j.out"]
    for key in ("partition", "account", "qos", "mem", "constraint", "gpus_per_node"):
        if key in params:
            lines.append(f"#SBATCH --{key.replace('_', '-')}={params[key]}")
    lines += [f"#SBATCH --{k.replace('_', '-')}={v}" for k, v in s.sbatch_options.items()]
    lines += ["", "set -euo pipefail", *s.setup,
              'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "export RUN_ID=$SLURM_JOB_ID",
              f"RUN_DIR={shlex.quote(cfg.launch.run_root)}/{cfg.launch.name or 'run'}-$SLURM_JOB_ID",
              "srun " + torchrun_command(cfg, config_path, '"$RUN_DIR"')]
    return "\n".join(lines) + "\n"
