"""What the ranks run, pickled by value with the file names of its code kept.

cloudpickle 3 writes every code object it pickles by value (a notebook cell's function, one from the
submitting script) with the file name "<dynamic-code>", so that a payload does not depend on where it
was defined.  In the ranks that name is all Python knows of the user's code: a hung rank was named
"<dynamic-code>:16 in stuck_loss" and a traceback lost its cell's file.  `dumps` is cloudpickle.dumps
with cloudpickle's own code reducer, the file name put back (cloudpickle 2 kept it: nothing changes)."""

from __future__ import annotations

import io
import pickle
import types
from collections import ChainMap
from typing import Any

import cloudpickle

_DYNAMIC = "<dynamic-code>"
_reduce_code = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_keeping_its_file(code: types.CodeType) -> Any:
    constructor, args = _reduce_code(code)
    return constructor, tuple(code.co_filename if arg == _DYNAMIC else arg for arg in args)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_keeping_its_file}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """cloudpickle.dumps(obj), the pickled code keeping the file names it was defined in."""
    with io.BytesIO() as buffer:
        _Pickler(buffer, protocol=pickle.DEFAULT_PROTOCOL).dump(obj)
        return buffer.getvalue()
