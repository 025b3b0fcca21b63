"""Where a run came from, as the submitting process sees it: Python, torch, the command or notebook
that submitted it, the git commit of the working folder, and the environment variables that change
how ranks meet and communicate.  The ranks add what only they see (CUDA and NCCL versions, hosts:
``runtime`` in run.json, written by rank 0)."""

from __future__ import annotations

import os
import platform
import re
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


REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASS|KEY|CREDENTIAL|AUTH|COOKIE|PRIVATE|SIGNATURE|CERT", re.IGNORECASE)
"""A variable so named holds a secret whatever its value looks like."""
SETTING = re.compile(r"[\w.,:;=/@%+{}-]{0,256}")
"""What a setting's value looks like: a number, a word, an interface, a host, a path, OMP_PLACES'
{0:4}, a list of them."""
TOKEN = re.compile(r"(?=[A-Za-z0-9+/_=-]*[0-9])(?=[A-Za-z0-9+/_=-]*[a-z])(?=[A-Za-z0-9+/_=-]*[A-Z])"
                   r"[A-Za-z0-9+/_=-]{20,}")
"""A run of 20 or more letters and digits with upper and lower case and digits: a key or token."""


def dist_env(environ: Any) -> dict[str, str]:
    """The variables that change distributed behaviour (DIST_ENV_PREFIXES), each name kept; a value
    that looks like a secret (its name says so, or it is no setting's shape, or it holds a token) is
    recorded as REDACTED: run.json is read by whoever can read the run root."""
    return {k: _shown_value(k, v) for k, v in sorted(environ.items()) if k.startswith(DIST_ENV_PREFIXES)}


def _shown_value(name: str, value: str) -> str:
    if SECRET_NAME.search(name) or not SETTING.fullmatch(value) or TOKEN.search(value):
        return REDACTED
    return value


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
