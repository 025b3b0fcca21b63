"""``%%ranks``: run a notebook cell on every rank of a warm pool and see each rank's answer.

    %load_ext workbench
    pool = workbench.Pool(cfg)

    %%ranks            (or %%ranks pool: a Pool by its variable name; default the last one made)
    batch = next(iter(loader))
    batch[0].shape

Each rank runs the cell in its own namespace, kept from cell to cell, with ``rank``,
``world_size``, ``dist`` and ``torch`` defined; collectives work (every rank runs the cell).  The
output of each rank is printed tagged ``[rank R]``, then the value of its last line and its
traceback: the cell's own frames (``WORKBENCH_TRACEBACK=full`` shows the workbench's too).  An
exception does not restart the ranks, unless another rank has not answered within a few seconds
(it may wait in a collective the raising rank never reached): then the ranks are restarted and
their namespaces start empty (the output says so)."""

from __future__ import annotations

import os
import sys
from typing import Any

from workbench.engine.userframes import HIDDEN_NOTE


def load_ipython_extension(ipython: Any) -> None:
    def ranks(line: str, cell: str) -> None:
        pool = find_pool(line.strip(), ipython.user_ns)
        try:
            outcomes = pool.run_cell(cell)
        except KeyboardInterrupt:
            print("interrupted: the pool's ranks were restarted (their namespaces are empty again)", file=sys.stderr)
            return
        show(outcomes)

    ipython.register_magic_function(ranks, "cell", "ranks")


def find_pool(name: str, namespace: dict[str, Any]) -> Any:
    from workbench.errors import ConfigError
    from workbench.launch.pool import Pool, last_pool

    if name:
        found = namespace.get(name)
        if not isinstance(found, Pool):
            raise ConfigError([f"%%ranks {name}: {name} is not a workbench.Pool in this notebook; "
                               "give a Pool's variable name, or nothing for the last one made"])
        return found
    pool = last_pool()
    if pool is None:
        raise ConfigError(["%%ranks: no open pool; make one first: pool = workbench.Pool(cfg)"])
    return pool


def show(outcomes: list[dict[str, Any]]) -> None:
    """Print each rank's output, value and traceback, tagged with its rank.  A traceback shows the
    cell's own frames (and what they called); WORKBENCH_TRACEBACK=full shows the workbench's too."""
    hidden = False
    for rank, outcome in enumerate(outcomes):
        for stream, key in ((sys.stdout, "stdout"), (sys.stderr, "stderr")):
            text = outcome.get(key) or ""
            for line in text.splitlines():
                print(f"[rank {rank}] {line}", file=stream)
        if outcome.get("result") is not None:
            print(f"[rank {rank}] Out: {outcome['result']}")
        error, cut = cell_traceback(outcome)
        hidden = hidden or cut
        for line in error.rstrip().splitlines():
            print(f"[rank {rank}] {line}", file=sys.stderr)
        if outcome.get("outcome") not in ("finished", "raised"):
            why = outcome.get("error") or "it did not answer (waiting in a collective?)"
            print(f"[rank {rank}] no answer: {why}; the ranks were restarted (their namespaces are empty again)",
                  file=sys.stderr)
    if hidden:
        print(HIDDEN_NOTE.rstrip(), file=sys.stderr)  # once, not once per rank


def cell_traceback(outcome: dict[str, Any]) -> tuple[str, bool]:
    """(the traceback to show, whether workbench frames were hidden from it)."""
    if not outcome.get("error"):
        return "", False
    if os.environ.get("WORKBENCH_TRACEBACK") == "full":
        return str(outcome.get("error_full") or outcome["error"]), False
    text = str(outcome["error"])
    return (text[: -len(HIDDEN_NOTE)], True) if text.endswith(HIDDEN_NOTE) else (text, False)
