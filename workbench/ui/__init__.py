"""Notebook widgets over the public workbench API: a config form, a scaling table, a live dashboard.

    from workbench.ui import Workbench
    Workbench()                  # form -> scaling table -> Submit -> live dashboard

Only this package imports ipywidgets; ``import workbench`` never does.  Each widget class is a thin
mapping of plain-Python state (``fields``, ``scaling_view.scaling_frame``, ``state.DashboardState``)
onto widgets, so the logic is testable without a browser.
"""

from __future__ import annotations

try:
    import ipywidgets  # noqa: F401
except ImportError:
    raise ImportError(
        "workbench.ui needs ipywidgets, which is not installed: pip install \"workbench[lab]\" (or ipywidgets) "
        "(everything else in workbench, e.g. run.plot() and the CLI, works without it)"
    ) from None

from workbench.ui.dashboard import Dashboard
from workbench.ui.form import ConfigForm
from workbench.ui.plotview import MetricsPlot
from workbench.ui.runs_view import RunsView
from workbench.ui.scaling_view import ScalingView
from workbench.ui.sweepview import SweepView
from workbench.ui.workbench_app import Workbench

__all__ = ["ConfigForm", "ScalingView", "Dashboard", "MetricsPlot", "RunsView", "SweepView", "Workbench"]
