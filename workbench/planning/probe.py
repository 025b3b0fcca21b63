"""The link probe, from the submitting side: starts `world_size` probe ranks on this host
(planning.probe_rank), reads what rank 0 measured, makes a Link of it, and keeps it in a cache file per
backend, world size, host, torch version and the settings that change the engine's own work, so that a
plan measures a link once.  On CPU it also measures the user's model's own step at each world size
whose ranks share this host (measured_step: not cached, a model's step is its own).  The ranks are
this module's children: ended on every path."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from workbench.planning.cost import Link, fit_link

TIMEOUT_S = 180.0


def cache_path() -> Path:
    """$XDG_CACHE_HOME/workbench/links.json (default ~/.cache): delete it to measure again."""
    from workbench.runfolder.layout import user_cache

    return user_cache("links.json")


def probe_settings(cfg: Any, threads: int) -> dict[str, Any]:
    """What of the config changes the engine's per-step work (and so the cache's key)."""
    t, d = cfg.train, cfg.dist
    return {"threads": threads,
            "train": {"log_every_steps": t.log_every_steps, "grad_clip_norm": t.grad_clip_norm},
            "dist": {"strategy": d.strategy, "measure_comm": d.measure_comm, "comm_hook": d.comm_hook,
                     "check_every_steps": d.check_every_steps, "threads_per_rank": threads}}


def measured_link(world_size: int, settings: dict[str, Any], refresh: bool = False) -> Link:
    """The gloo link at `world_size` ranks on this host, from the cache or measured now (a few seconds)."""
    import torch

    key = json.dumps({"backend": "gloo", "world_size": world_size, "host": socket.gethostname(),
                      "torch": torch.__version__, **settings}, sort_keys=True)
    cache = _read_cache()
    if key not in cache or refresh:
        cache[key] = _run_ranks(world_size, settings)
        _write_cache(cache)
    return link_of(cache[key])


def measured_step(cfg: Any, factory: Any, world_size: int, threads: int, bare: bool = False) -> dict[str, Any]:
    """The engine's step of `factory`'s model under `cfg` with `world_size` ranks stepping at once on this
    host, and with `bare` its compute so stepped (probe_rank.model_step): {"step_s", "steps", "load",
    "bare_step_s", "bare_steps"}."""
    import cloudpickle

    cfg = cfg.replace(dist__procs_per_node=world_size, dist__nodes=1)
    payload = cloudpickle.dumps((cfg, factory))  # a notebook's factory by value, as submit ships it
    settings = {"threads": threads, "bare": bare}
    return _run_ranks(world_size, settings, payload, f"the step probe of {cfg.task.name!r}")


def link_of(result: dict[str, Any]) -> Link:
    """A Link from a probe's result: latency and bandwidth fitted on its two all-reduces; the engine's
    overhead is the main thread's CPU time its tiny model's engine step adds to the bare step."""
    n = int(result["world_size"])
    overhead = max(0.0, result["engine_cpu_s"] - result["bare_cpu_s"])
    return fit_link(n, tuple(result["small"]), tuple(result["large"]), overhead,
                    source=f"measured {result.get('when', '')} at load {result.get('load', float('nan')):.1f}")


def _run_ranks(world_size: int, settings: dict[str, Any], payload: bytes | None = None,
               what: str = "the link probe") -> dict[str, Any]:
    from workbench.engine.rendezvous import free_port

    with tempfile.TemporaryDirectory(prefix="workbench-link-") as tmp:  # mode 0700: the ranks unpickle from it
        out = os.path.join(tmp, "result.json")
        base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")),
                "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                "OMP_NUM_THREADS": str(settings["threads"])}
        command = [sys.executable, "-m", "workbench.planning.probe_rank", out, json.dumps(settings)]
        if payload is not None:
            command.append(os.path.join(tmp, "model.pkl"))
            Path(command[-1]).write_bytes(payload)
        procs: list[subprocess.Popen[bytes]] = []
        logs = [open(os.path.join(tmp, f"rank{rank}.err"), "wb") for rank in range(world_size)]  # noqa: SIM115
        try:
            for rank, log in enumerate(logs):
                env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
                # in the submitting process's folder, as a run's ranks start: a factory named by module from
                # there (`package.module:function`, as from YAML) imports in the probe as in the run
                procs.append(subprocess.Popen(command, env=env, cwd=os.getcwd(), stdout=subprocess.DEVNULL,
                                              stderr=log))
            _wait_all(procs, time.monotonic() + TIMEOUT_S)
        finally:
            for p in procs:  # ours: none outlives the probe, on any path
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()
        if not os.path.exists(out):
            why = _first_error([Path(log.name).read_text(errors="replace") for log in logs])
            raise RuntimeError(f"{what} at {world_size} ranks wrote nothing: {why}")
        result = dict(json.loads(Path(out).read_text()))
    result["when"] = time.strftime("%Y-%m-%d %H:%M")
    return result


def _first_error(logs: list[str]) -> str:
    """The exception a rank's stderr ends with (its line and what follows), else the log's last line."""
    for text in logs:
        lines = [re.sub(r"^\[rank\d+\]:\s*", "", line) for line in text.strip().splitlines()]  # torch's prefix
        for i in range(len(lines) - 1, -1, -1):
            if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", lines[i]):
                return " ".join(lines[i:])[:400]
    last = [text.strip().splitlines()[-1] for text in logs if text.strip()]
    return last[0][:400] if last else "no rank said why"


def _wait_all(procs: list[subprocess.Popen[bytes]], deadline: float) -> None:
    """Until every rank has exited; the first to fail, or the deadline, ends the wait (the caller
    ends the rest: a rank whose peer died would wait in its collective until gloo's timeout)."""
    while any(p.poll() is None for p in procs):
        if any(p.returncode for p in procs) or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _read_cache() -> dict[str, Any]:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(cache: dict[str, Any]) -> None:
    from workbench.runfolder.private import write_atomic

    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=1).encode())
    except OSError:  # a read-only home: measured again next time, no worse
        pass
