"""What the ranks run is pickled by value with its code's file names (workbench.launch.pickling): with
cloudpickle 3 a plain dumps names all of it "<dynamic-code>", and a hung rank's frame lost its file."""

from __future__ import annotations

import cloudpickle
import pytest

from workbench.launch.pickling import dumps

pytestmark = pytest.mark.timeout(30)

CELL = '''
def factory():
    def loss_fn(x):
        return x + 1
    return loss_fn
'''


def _a_cells_function():
    """A function as a notebook cell defines it: its module cannot be imported, so it travels by value."""
    namespace = {"__name__": "cell_not_importable"}
    exec(compile(CELL, "/tmp/ipykernel_1/2914.py", "exec"), namespace)  # noqa: S102 - the cell's own code
    return namespace["factory"]


def test_code_pickled_by_value_keeps_its_file_names_nested_ones_too():
    factory = cloudpickle.loads(dumps(_a_cells_function()))
    assert factory.__code__.co_filename == "/tmp/ipykernel_1/2914.py"
    assert factory().__code__.co_filename == "/tmp/ipykernel_1/2914.py"
    assert factory()(1) == 2


def test_it_pickles_what_cloudpickle_pickles():
    value = {"task": None, "fn": _a_cells_function(), "fn_args": (1, "a")}
    loaded = cloudpickle.loads(dumps(value))
    assert loaded["fn_args"] == (1, "a") and loaded["fn"]()(2) == 3
