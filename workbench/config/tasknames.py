"""How a task is named in a config: a built-in name or "package.module:factory".  The one place that
says whether a name can name a task (the config's target checks and the ranks both ask it)."""

from __future__ import annotations

import importlib.util

BUILTINS = {
    "synthetic": "workbench.engine.builtin_tasks:synthetic_classification",
    "charlm": "workbench.engine.builtin_tasks:char_lm",
}

BUILTIN_OPTIONS = {
    "synthetic": ("n_train", "n_val", "dim", "classes", "hidden", "noise", "dropout", "data_seed"),
    "charlm": ("block_size", "d_model", "n_head", "n_layer", "dropout", "val_fraction"),
}
"""The options each built-in task takes (its factory's parameters, read here without importing torch;
tests/unit/test_task_binding.py holds them to the signatures)."""


def runs_own_code(name: str) -> bool:
    """A run's task name that stands for the user's own script or function (submit_script,
    submit_fn, `workbench launch`), not a task the engine trains."""
    return name.startswith(("<function", "<script"))


def task_name_problem(name: str) -> str | None:
    """Why `name` cannot name a task (None when it looks usable); imports nothing."""
    if name in BUILTINS or name.startswith("<"):
        return None
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr.isidentifier():
        return (f"unknown task {name!r}; use a built-in ({', '.join(BUILTINS)}) "
                "or a factory as package.module:function")
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        return f"module {module!r} is not importable; install it or add it to PYTHONPATH"
    return None
