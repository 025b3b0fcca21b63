"""Where ranks meet: a free port on loopback (local) or on the allocation's first node (SLURM).

For SLURM the port cannot be chosen by the submitter (the node is not known yet), so global rank 0
picks a free port on its node and publishes it in the run folder; the other ranks wait for it."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from workbench.rundir import read_json, write_json_atomic


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def publish_port(path: Path, host: str) -> int:
    port = free_port("")
    write_json_atomic(path, {"host": host, "port": port, "time": time.time()})
    return port


def wait_for_port(path: Path, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = read_json(path)
        if found:
            return int(found["port"])
        time.sleep(0.1)
    raise TimeoutError(f"rank 0 did not publish its rendezvous port in {path} within {timeout_s:.0f} s "
                       "(is the run folder on a filesystem shared by all nodes?)")
