"""HTML tables that fit their widget: cells on one line, column names that wrap after an underscore
(never inside a word), and a box that scrolls sideways when the table is still wider than the widget."""

from __future__ import annotations

import html

_COVER = "var(--jp-layout-color0,#fff)"
_SHADOW = "var(--jp-border-color0,#bdbdbd)"  # light grey on a light theme, mid grey on a dark one
SCROLL_SHADOWS = (f"background:linear-gradient(to right,{_COVER} 30%,transparent) left/24px 100% no-repeat local,"
                  f"linear-gradient(to left,{_COVER} 30%,transparent) right/24px 100% no-repeat local,"
                  f"radial-gradient(farthest-side at 0 50%,{_SHADOW},transparent) left/10px 100% no-repeat scroll,"
                  f"radial-gradient(farthest-side at 100% 50%,{_SHADOW},transparent) right/10px 100% no-repeat "
                  "scroll")
"""A shadow at an edge with more table behind it (scroll shadows: the covers move with the table, the
shadows stay), so a cut column reads as "scroll for more" where scrollbars are hidden until used."""
SCROLL_STYLE = f"width:0;min-width:100%;overflow-x:auto;line-height:1.3;{SCROLL_SHADOWS}"
"""width:0 keeps the table's width out of the widget's own (the widget's flex box would otherwise grow
to the table and be cut off at the output's edge); min-width:100% then makes the box the widget's width."""


def header_html(name: str) -> str:
    """A column name that may wrap after an underscore (steps_per_ / epoch), never inside a word; a
    unit of one or two letters stays with its word (duration_s)."""
    parts = name.split("_")
    if len(parts) > 1 and len(parts[-1]) < 3:
        parts[-2:] = [f"{parts[-2]}_{parts[-1]}"]
    return "_<wbr>".join(html.escape(part) for part in parts)


RUN_LABELS = {
    "lr": ("lr used", "the lr the job used: the peak it logged, or train.lr scaled by the rule to its ranks"),
    "base_lr": ("base lr", "train.lr as configured, before the scaling rule (tuned at train.lr_ref_batch)"),
    "scaled_lr": ("scaled lr", "train.lr scaled by the rule to the run's effective batch"),
    "train.lr": ("train.lr (base)", "train.lr as configured, before the scaling rule scales it to the run's ranks"),
}
"""Columns of a run's or a trial's row whose bare name reads two ways (which lr?): the words shown and the
tooltip that says which (the runs and sweep views)."""
TABLE_LABELS = {"lr": ("lr", "train.lr scaled by the rule to this row's effective batch")}
"""The scaling table's: its lr is the scaled one at each row's world size."""


def header_cell(name: str, style: str, labels: dict[str, tuple[str, str]] | None = None) -> str:
    """A <th> for column `name`; its full name (or what `labels` says of it) is also the cell's tooltip."""
    shown, tip = (labels or {}).get(name, (None, name))
    text = html.escape(shown) if shown else header_html(name)
    return f"<th title='{html.escape(tip, quote=True)}' style='{style}'>{text}</th>"


def scrolling(table: str) -> str:
    """`table` in a box as wide as its widget that scrolls sideways when the table is wider."""
    return f"<div class='wb-table-scroll' style='{SCROLL_STYLE}'>{table}</div>"
