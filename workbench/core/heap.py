"""Handing freed heap memory back to the operating system, where the C library can.

glibc's ``malloc`` keeps freed memory inside its heaps and returns to the kernel only the
free space at a heap's top: a tensor freed below one still alive stays resident. A long
pass whose kept tensors (a checkpoint's inputs, gradients gathered as they pass) are
allocated among the larger temporaries of each layer leaves the heap holed, and its
resident size grows with the holes, past what is alive. :func:`release` asks glibc to give
back every whole free page (``malloc_trim(0)``); elsewhere (macOS, musl) it does nothing.

Examples:
    >>> release()  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release() -> None:
    """Give the heap's free pages back to the operating system (glibc only; a few
    milliseconds)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
