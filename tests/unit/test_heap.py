"""glibc's heap: free pages given back, and large allocations mapped alone once asked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from workbench.core import heap

GLIBC = heap._libc() is not None and hasattr(heap._libc(), "mallinfo2")

PROBE = textwrap.dedent("""
    import ctypes
    from workbench.core import heap

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = heap._libc()
    libc.mallinfo2.restype = Info
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def mapped_by(nbytes):
        before = libc.mallinfo2().hblkhd
        p = libc.malloc(nbytes)
        grew = libc.mallinfo2().hblkhd - before
        libc.free(p)
        return grew

    libc.free(libc.malloc(8 << 20))  # a mapped 8 MiB freed: glibc raises its threshold
    print(mapped_by(2 << 20) >= 2 << 20, heap.map_large(1 << 20), mapped_by(2 << 20) >= 2 << 20)
""")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_map_large_maps_what_glibc_would_have_put_on_the_heap():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True)
    # before: the raised threshold puts 2 MiB on the heap; after: mapped alone
    assert out.stdout.split() == ["False", "True", "True"]


def test_release_runs_anywhere():
    heap.release()
