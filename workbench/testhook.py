"""A test hook, and nothing else: stop this process dead at a named point of its work.

The fault-injection tests need a process killed exactly between two steps (a sweep driver between
Optuna's ask and the trial's values, say), which no timing from outside can hit every time.  With
WORKBENCH_KILL_AT=<point> in its environment, a process that reaches `kill_point(<point>)` sends
itself SIGKILL there: what it leaves is what any killed process leaves.  Only tests set the variable;
unset, a point costs one dictionary lookup.  The points:

    sweep.asked       the driver asked Optuna for a trial; no values suggested yet
    sweep.values      the trial's values are suggested; its run folder is not named yet
    submit.prepared   the trial's run folder and run.json are written; nothing is started
    submit.controller its local controller is started; submitit has not yet given the job's pickle
                      the name the controller waits for (JOB_submitted.pkl)
    submit.started    its local controller is started; run.json does not name it yet
    sweep.submitted   the trial's run is started; the driver has not noted it yet
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "WORKBENCH_KILL_AT"


def kill_point(point: str) -> None:
    """SIGKILL this process if WORKBENCH_KILL_AT names `point` (tests only)."""
    if os.environ.get(KILL_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
