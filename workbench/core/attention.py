"""Which attention path a run asks for, and which its passes took: the choice is set
for a run (:func:`preferring`, ``workbench run --attention``) and read where a scan
chooses its path; the path taken is noted there and read when the run ends
(``attention`` in ``run.json``).

A scan notes its path (:func:`note`); :func:`collecting` gathers the notes of everything
run inside it, in this thread of control; :func:`taken` sums them up: ``fused`` only when
every noted pass was, else ``eager`` when any pass used the bridge's eager attention, else
``blocked``.

Examples:
    >>> with collecting() as notes:
    ...     note("fused"); note("blocked")
    >>> taken(notes)
    'blocked'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from workbench.core.options import AttentionPath, TakenPath

_NOTES: ContextVar[set[TakenPath] | None] = ContextVar("attention_notes", default=None)
_PREFERRED: ContextVar[AttentionPath] = ContextVar("attention_preferred", default="auto")


@contextlib.contextmanager
def preferring(path: AttentionPath) -> Iterator[None]:
    """Inside the block, a scan left to ``auto`` takes ``path`` instead (``fused`` forces
    the kernel where it serves the scan, even on CPU under Triton's interpreter)."""
    token = _PREFERRED.set(path)
    try:
        yield
    finally:
        _PREFERRED.reset(token)


def resolved(path: AttentionPath) -> AttentionPath:
    """``path``, or for ``auto`` the path the run prefers (:func:`preferring`)."""
    return _PREFERRED.get() if path == "auto" else path


@contextlib.contextmanager
def collecting() -> Iterator[set[TakenPath]]:
    """Gather the paths noted inside the block into the set it yields."""
    notes: set[TakenPath] = set()
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def note(path: TakenPath) -> None:
    """Note that a pass took ``path`` (nothing happens outside :func:`collecting`)."""
    notes = _NOTES.get()
    if notes is not None:
        notes.add(path)


def taken(notes: set[TakenPath]) -> TakenPath | None:
    """The run's path from its notes (``None``: no pass noted one)."""
    if not notes:
        return None
    if notes == {"fused"}:
        return "fused"
    return "eager" if "eager" in notes else "blocked"
