"""Where a run came from, as the submitting process sees it: Python, torch, the command or notebook
that submitted it, the git commit of the working folder, and the environment variables that change
how ranks meet and communicate.  The ranks add what only they see (CUDA and NCCL versions, hosts:
``runtime`` in run.json, written by rank 0)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

DIST_ENV_PREFIXES = ("OMP_", "NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "MASTER_", "MKL_NUM_THREADS",
                     "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING")
"""Variables that change distributed behaviour (threads, NCCL/gloo, meeting point, visible GPUs)."""


def submit_provenance() -> dict[str, Any]:
    return {"python": platform.python_version(), "python_executable": sys.executable,
            "torch": _version("torch"), "workbench": _version("workbench"), "submitted_by": submitted_by(),
            "git": git_state(os.getcwd()), "dist_env": dist_env(os.environ)}


def submitted_by() -> dict[str, Any]:
    """The notebook (JupyterLab names it in JPY_SESSION_NAME) or the command line, and the folder."""
    notebook = os.environ.get("JPY_SESSION_NAME")
    found: dict[str, Any] = {"cwd": os.getcwd(), "pid": os.getpid()}
    if notebook:
        found["notebook"] = notebook
    else:
        found["command"] = [sys.executable, *sys.argv]
    return found


def git_state(folder: str) -> dict[str, Any] | None:
    """{"commit", "dirty"} of the git work tree holding `folder`, or None outside one."""
    try:
        commit = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def dist_env(environ: Any) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith(DIST_ENV_PREFIXES)}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
