"""The store's listing index: what a listing shows of each finished run, in one file.

Listing a store of 10,000 runs would otherwise read and validate 10,000 ``run.json``
files. ``<store>/.index.json`` keeps, for each finished run (``complete`` or ``failed``,
in the store itself, not under ``.incomplete/``), the facts a listing shows (its
:class:`Listing`) beside the status of the ``run.json`` they were read from: its size,
modification and status-change times and inode, trusted as
:func:`workbench.core.checksums.unchanged` trusts a stamp (a file changed in the same
clock tick as its row was read is read again). A listing still visits every run folder,
but opens a ``run.json`` only when its file is not the one its row was read from.

The index is a cache, never the source of truth:

- a run folder without a row, or whose ``run.json`` changed since its row was written, is
  read from its folder (and its row written);
- a row whose folder is gone is dropped;
- a missing, unreadable, damaged or hostile index is ignored (the store is read as if it
  had none), and an index written by other code (the workbench package's sources differ:
  :func:`code_key`) is rebuilt, so a record the code now reads differently is read again;
- anything beyond a listing (tables, provenance, the summary) is read from ``run.json``
  when first asked for (:attr:`workbench.store.runs.Run.meta`).

It is rewritten only under the store's index lock (``<store>/.index.lock``, a
:class:`filelock.FileLock`), by one atomic rename, so a reader never sees half of one; a
process that finds the lock taken or the store read-only lists without writing it.

Examples:
    >>> rows = read(Path("data/runs"))                       # doctest: +SKIP
    >>> write(Path("data/runs"), rows)                       # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

import filelock
from pydantic import Field

from workbench.core.checksums import RACY_NS, sources_key
from workbench.core.errors import WorkbenchError
from workbench.core.files import read_bounded
from workbench.core.records import Count, Json, Record, RecordError
from workbench.store.records import Interventions, RunId, RunMeta, Text, Timestamp

log = logging.getLogger(__name__)

INDEX = ".index.json"
LOCK = ".index.lock"
MAX_INDEX = 256 << 20
"""An index larger than this is not read (a row is a few hundred bytes)."""
INDEXED = ("complete", "failed")
"""The statuses whose rows the index keeps: a finished run's record no longer changes."""

Stat = tuple[Count, Count, Count, Count]
"""A ``run.json``'s size, modification and status-change times (nanoseconds) and inode."""


class Listing(Record):
    """What a listing shows of a finished run (the fields of its ``run.json`` of the same
    names, and ``model``: the model's name)."""

    run_id: RunId
    stat: Stat
    read_ns: Count
    """When its ``run.json`` was about to be read (nanoseconds since the epoch)."""
    experiment: Annotated[str, Field(min_length=1, max_length=200)]
    status: Literal["complete", "failed"]
    started_at: Timestamp
    seconds: Annotated[float, Field(ge=0)] | None
    model: Annotated[str, Field(max_length=200)] | None
    config: dict[str, Json]
    busy: bool | None
    cells: tuple[RunId | Literal[""], ...] | None
    error: Text | None
    tables: tuple[Annotated[str, Field(max_length=200)], ...]
    """The names of its tables, sorted."""
    interventions: Interventions | None = None
    """What was changed in the model for the whole run (its head mask)."""

    @classmethod
    def of(cls, meta: RunMeta, st: os.stat_result, read_ns: int) -> Listing:
        """The row of run ``meta``, read at ``read_ns`` from a ``run.json`` of status
        ``st`` (taken before it was read)."""
        return cls.model_construct(
            run_id=meta.run_id, stat=stat_of(st), read_ns=read_ns,
            experiment=meta.experiment, status=meta.status, started_at=meta.started_at,
            seconds=meta.seconds,
            model=meta.model.name if meta.model else None, config=meta.config,
            busy=meta.busy, cells=meta.cells, error=meta.error,
            tables=tuple(sorted(meta.tables)), interventions=meta.interventions)

    def current(self, st: os.stat_result) -> bool:
        """Whether a ``run.json`` of status ``st`` is the file this row was read from."""
        return self.stat == stat_of(st) and self.read_ns - st.st_ctime_ns >= RACY_NS


class IndexFile(Record):
    """``<store>/.index.json``."""

    version: Literal[1]
    code: Annotated[str, Field(max_length=64)]
    """The :func:`code_key` of the workbench that wrote it."""
    rows: tuple[Listing, ...]



def stat_of(st: os.stat_result) -> Stat:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino



@cache
def code_key() -> str:
    """The :func:`~workbench.core.checksums.sources_key` of the workbench package: an
    index written by other code (an upgrade, an edited checkout) is not trusted to read
    records as this code does."""
    return sources_key(Path(__file__).resolve().parents[1])


_READ: dict[str, tuple[tuple[Stat, str], dict[str, Listing]]] = {}
"""The index last read or written at each path in this process, by its file's status and
the code that read it."""


def read(root: Path) -> dict[str, Listing]:
    """The rows of ``root``'s index by run id; empty when it has none this code can use
    (missing, unreadable, not an index, or written by other code). An index file whose
    status (size, times, inode) is the one last read or written in this process is not
    parsed again: rows are only ever used after their own ``run.json`` is checked
    (:meth:`Listing.current`), so an index older than the file is only slower."""
    path = root / INDEX
    try:
        st = os.lstat(path)
    except OSError:
        return {}
    seen = _READ.get(str(path))
    if seen is not None and seen[0] == (stat_of(st), code_key()):
        return seen[1]
    try:
        data = read_bounded(path, MAX_INDEX, what="the store's index", follow=False)
        index = IndexFile.from_json(data, what=INDEX)
    except (WorkbenchError, RecordError) as exc:
        log.info("not using the index of %s: %s", root, str(exc).splitlines()[0])
        return {}
    if index.code != code_key():
        log.info("the index of %s was written by other code; it is rebuilt", root)
        return {}
    rows = {row.run_id: row for row in index.rows}
    _READ[str(path)] = ((stat_of(st), code_key()), rows)
    return rows


def write(root: Path, rows: dict[str, Listing]) -> None:
    """Replace ``root``'s index with ``rows``, under the store's index lock; nothing when
    another process holds the lock or the store cannot be written (the next listing
    writes it)."""
    if os.path.islink(root / LOCK):  # taking the lock would truncate what it points to
        log.warning("the index lock of %s is a symbolic link; the index is not written", root)
        return
    lock = filelock.FileLock(root / LOCK, timeout=0, is_singleton=False)
    temp = root / f"{INDEX}.{secrets.token_hex(4)}.tmp"
    try:
        with lock:
            body = IndexFile.model_construct(version=1, code=code_key(),
                                             rows=tuple(rows.values()))
            temp.write_bytes(body.model_dump_json().encode())
            os.replace(temp, root / INDEX)
            st = os.lstat(root / INDEX)
            _READ[str(root / INDEX)] = ((stat_of(st), code_key()), rows)
    except (OSError, filelock.Timeout) as exc:  # filelock.Timeout is an OSError too
        log.info("the index of %s is not rewritten: %s", root, exc)
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
