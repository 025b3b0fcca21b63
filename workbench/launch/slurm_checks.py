"""Checks against the live SLURM cluster before submitting, so bad resources fail early and clearly."""

from __future__ import annotations

import shutil
import subprocess

from workbench.config.sections import JobConfig


def slurm_problems(cfg: JobConfig) -> list[str]:
    """What the cluster says is wrong with cfg's SLURM resources (empty when it looks fine)."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return ["launch.executor: slurm needs sbatch and sinfo on PATH; run from a cluster login node "
                "or use executor: local"]
    partitions = _partitions()
    wanted = cfg.launch.slurm.partition
    if wanted and partitions is not None and wanted not in partitions:
        return [f"launch.slurm.partition: no partition {wanted!r} on this cluster; "
                f"choose one of {', '.join(sorted(partitions)) or '(none)'}"]
    return []


def _partitions() -> set[str] | None:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return {line.strip().rstrip("*") for line in out.stdout.splitlines() if line.strip()}
