"""Handing freed heap memory back to the operating system, where the C library can.

glibc's ``malloc`` keeps freed memory inside its heaps and returns to the kernel only the
free space at a heap's top: a tensor freed below one still alive stays resident. A long
pass whose kept tensors (a checkpoint's inputs, gradients gathered as they pass) are
allocated among the larger temporaries of each layer leaves the heap holed, and its
resident size grows with the holes, past what is alive. :func:`release` asks glibc to give
back every whole free page (``malloc_trim(0)``); elsewhere (macOS, musl) it does nothing.

glibc serves an allocation from its own mapping (given back whole when freed) above a
threshold that it raises, up to 32 MiB, each time such a mapping is freed: a pass that
makes and frees blocks of a few MiB, each a little larger than the last, then takes them
from the heap, where the holes they leave stay resident. :func:`map_large` fixes the
threshold for the rest of the process (a long pass's memory for some more time, as each
large allocation is mapped and faulted in anew).

Examples:
    >>> release()  # doctest: +SKIP
    >>> map_large(1 << 20)  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter for the size from which an allocation is mapped alone."""

M_TRIM_THRESHOLD = -1
"""glibc's ``mallopt`` parameter for the free space kept at the heap's top."""

TRIM_THRESHOLD = 128 * 1024
"""glibc's default ``M_TRIM_THRESHOLD``, which it raises with the mapping threshold."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    trim = getattr(_libc(), "malloc_trim", None)  # glibc's alone
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release() -> None:
    """Give the heap's free pages back to the operating system (glibc only; a few
    milliseconds)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def map_large(nbytes: int = 1 << 20) -> bool:
    """Serve every allocation of ``nbytes`` or more that the heap's free chunks cannot hold
    from its own mapping, for the rest of the process, as ``MALLOC_MMAP_THRESHOLD_`` set at
    the process's start would: glibc no longer raises that size, the free space it keeps
    at the heap's top goes back to its default (128 KiB), and the heap's free pages are
    given back now (``mallopt``, then :func:`release`).

    Returns:
        Whether it was set (glibc only; elsewhere nothing changes).
    """
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = (mallopt(M_MMAP_THRESHOLD, nbytes) == 1
            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    release()
    return done
