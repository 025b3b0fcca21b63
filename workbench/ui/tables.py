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


def header_cell(name: str, style: str) -> str:
    """A <th> for column `name`; its full name is also the cell's tooltip."""
    return f"<th title='{html.escape(name, quote=True)}' style='{style}'>{header_html(name)}</th>"


def scrolling(table: str) -> str:
    """`table` in a box as wide as its widget that scrolls sideways when the table is wider."""
    return f"<div class='wb-table-scroll' style='{SCROLL_STYLE}'>{table}</div>"
