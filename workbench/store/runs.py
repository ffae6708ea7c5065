"""The run store: one folder per run, complete only once it is complete.

A run is written in ``RUNS_DIR/.incomplete/<run-id>/`` and renamed to ``RUNS_DIR/<run-id>/``
when it ends. ``run.json`` says what ran (experiment, model and its checksum, the full
config, the seed, library versions, the git revision) and how it ended: ``complete``, or
``failed`` with the error. A run killed outright stays in ``.incomplete`` and is listed as
``interrupted``; no reader mistakes it, or a failed run, for a finished one.

What the store promises, and where it is enforced:

- **Completion cannot lie.** ``status: complete`` is written in the staging folder, then
  every file and folder in it is flushed to disk, then it is renamed into place and the
  parent flushed (:meth:`ActiveRun._complete`). A reader never believes ``complete`` of a
  folder still under ``.incomplete/`` (:meth:`Run.load`: ``running`` while its process
  lives, ``interrupted`` after).
- **A failure records its cause**, a full disk (ENOSPC) or a read-only filesystem (EROFS)
  included: when ``run.json`` itself cannot be written, a small file reserved when the run
  started is overwritten in place with the ``failed`` record (:meth:`ActiveRun._fail`), and
  the error reaches the caller. No temporary file is left behind.
- **Nothing outside the store is served.** :meth:`RunStore.get` resolves a reference only
  to a folder directly inside the store (or in its ``.incomplete/``), after resolving
  symlinks; :meth:`RunStore.runs` lists only such folders; a table path in ``run.json`` must
  name a regular file inside its run folder (:func:`workbench.store.validate.confined_file`).
- **A malformed ``run.json`` damages one run, not the store.** It is read through its one
  typed model, :class:`workbench.store.records.RunMeta` (every field's type and range),
  and its ``run_id`` must be its folder's name; a run that fails is listed with
  ``status == "damaged"`` and ``meta.error`` naming the field, and is never returned by
  :meth:`RunStore.latest` or :meth:`RunStore.find_matching`.
- **Clean removes only what is provably abandoned.** A staged run is removed
  (:meth:`RunStore.remove_leftovers`) only when the writer its ``run.json`` names (pid and
  start time, read even from a record this version cannot validate) no longer runs; a run
  whose writer lives, or whose ``run.json`` names none, is kept (:meth:`RunStore.held_back`).

Tables are Parquet files whose SHA-256 is kept in ``run.json`` and checked on every read.
A run is started with the declarations of the tables it may write
(:mod:`workbench.store.schema`); a table that does not match its declaration is refused.

Examples:
    >>> store = RunStore("data/runs")                                 # doctest: +SKIP
    >>> with store.start("my-experiment", model.info, cfg, tables=TABLES) as run:  # doctest: +SKIP
    ...     run.save_table("head_scores", df)
    >>> store.latest(experiment="my-experiment").table("head_scores")  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import math
import os
import re
import secrets
import shutil
import stat as stat_mode
import time
import traceback
import warnings
from collections import OrderedDict
from collections.abc import Callable, Container, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from workbench.core import attention, checksums, durable
from workbench.core.checksums import RACY_NS
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.files import read_bounded
from workbench.core.options import Status, TakenPath
from workbench.core.records import RecordError
from workbench.store import index as store_index
from workbench.store import provenance, validate
from workbench.store.index import Listing
from workbench.store.records import (
    PID_MAX,
    RUN_ID_PATTERN,
    Interventions,
    ModelInfo,
    RunMeta,
    TableEntry,
    interventions_text,
)
from workbench.store.schema import SchemaError, Table, current_metric_names

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

log = logging.getLogger(__name__)


class Weights(Protocol):
    """What :meth:`RunStore.find_matching` compares of a model: its name and the checksum
    of its weights (a :class:`~workbench.store.records.ModelInfo` has both)."""

    @property
    def name(self) -> str: ...

    @property
    def checksum(self) -> str: ...

RUN_JSON = "run.json"
RECORDING_INDEX = "index.json"
"""What marks a folder inside a run as a recording (its index is anchored in run.json)."""
INCOMPLETE = ".incomplete"
RESERVE = ".run.json.reserve"
"""Room for the ``failed`` record, taken when a run starts, for when the disk fills up."""
RESERVE_BYTES = 64 * 1024
_ID_DRAWS = 64
"""Suffixes drawn for a new run id before giving up (each taken one is drawn again)."""
START_SLACK = 2.0
"""How far (seconds) a live process's start time may differ from the one recorded and it
still be the run's writer (the kernel's clock tick and the float round trip)."""
MAX_RUN_JSON = 32 << 20
"""A ``run.json`` larger than this is damaged (a real one is a few kilobytes)."""
MAX_CACHED_RECORDS = 1 << 15
"""Sound ``run.json`` records kept parsed in a process (a few kilobytes each)."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _slug(text: str) -> str:
    base = Path(text).name if ("/" in text or os.sep in text) else text
    return "".join(c if c.isalnum() or c in "-." else "-" for c in base)[:40].strip("-") or "x"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _read_meta(path: Path) -> tuple[RunMeta | None, bytes | None, str | None]:
    """``run.json`` of folder ``path`` as a :class:`RunMeta`, its bytes, and what is wrong
    with it (``None`` if nothing)."""
    try:
        file = validate.confined_file(path, RUN_JSON, what=f"run {path.name}")
        data = read_bounded(file, MAX_RUN_JSON, what=RUN_JSON)
    except WorkbenchError as exc:
        return None, None, str(exc)
    try:
        meta = _record(data)
    except RecordError as exc:
        return None, data, str(exc)
    if meta.run_id != path.name:
        return None, data, (f"run.json run_id {meta.run_id!r} does not match its folder "
                            f"{path.name!r}")
    return meta, data, None


MAX_CACHED_TABLES = 256
"""Tables kept read in a process (:meth:`Run.table`)."""
MAX_CACHED_TABLE_BYTES = 64 << 20
"""A table file larger than this is read again each time rather than kept."""
_TABLES: OrderedDict[tuple[Any, ...], pd.DataFrame] = OrderedDict()
"""Tables already read and checked in this process, by path, checksum and file status,
least recently used first."""

_RECORDS: dict[bytes, RunMeta] = {}
"""Sound ``run.json`` records already checked in this process, by a digest of their bytes."""


def _record(data: bytes) -> RunMeta:
    """``data`` checked as a :class:`RunMeta`, once per content per process: the file is
    read each time, so a changed record is always seen, but a listing of a large store
    validates only the records it has not met (the checks are most of a read's cost).

    Raises:
        RecordError: it is not a sound record (not kept: it is checked again next time).
    """
    key = hashlib.blake2b(data, digest_size=20).digest()
    meta = _RECORDS.get(key)
    if meta is None:
        meta = RunMeta.from_json(data, what=RUN_JSON)
        if len(_RECORDS) >= MAX_CACHED_RECORDS:
            _RECORDS.clear()
        _RECORDS[key] = meta
    return meta


def _raw(data: bytes | None) -> dict[str, Any]:
    """The JSON object of a ``run.json`` that failed its check, unvalidated (empty when it
    is not one)."""
    try:
        raw = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _salvaged(raw: Mapping[str, Any], key: str) -> str | None:
    """A string field of a ``run.json`` that failed its check, for listing the damaged run
    (``None`` when it cannot be read)."""
    value = raw.get(key)
    return value if isinstance(value, str) and len(value) <= 200 else None


def _salvaged_writer(raw: Mapping[str, Any]) -> tuple[int | None, float | None]:
    """``pid`` and ``pid_started`` of a ``run.json`` that failed its check (another
    version's record, one bad field), each read alone, so that ``workbench clean`` can
    still tell whether the run's writer lives: ``None`` for one that is missing or not
    of its type and range."""
    pid, started = raw.get("pid"), raw.get("pid_started")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 <= pid <= PID_MAX:
        pid = None
    seconds = None
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        try:
            seconds = float(started)
        except OverflowError:  # an integer beyond any float
            seconds = None
    if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
        seconds = None
    return pid, seconds


class Run:
    """A stored run, read-only.

    ``meta`` is its ``run.json`` as a :class:`RunMeta`: a run whose file fails its check
    has ``status == "damaged"``, ``meta.error`` saying why, and no tables.
    """

    def __init__(self, path: Path | str, meta: RunMeta | None = None, *,
                 listing: Listing | None = None) -> None:
        if meta is None and listing is None:
            raise TypeError("a Run needs its record or its listing")
        self._path = path
        self._meta = meta
        self._listing = listing

    @property
    def path(self) -> Path:
        """The run's folder."""
        if not isinstance(self._path, Path):
            self._path = Path(self._path)
        return self._path

    @property
    def meta(self) -> RunMeta:
        """The run's ``run.json`` as a :class:`RunMeta`; a run listed from the store's
        index (:mod:`workbench.store.index`) reads it when first asked."""
        if self._meta is None:
            self._meta = Run.load(self.path).meta
        return self._meta

    @meta.setter
    def meta(self, meta: RunMeta) -> None:
        self._meta = meta

    @property
    def listing(self) -> Listing | None:
        """The run's row of the store's index, while its ``run.json`` is not read."""
        return self._listing if self._meta is None else None

    @classmethod
    def load(cls, path: str | Path) -> Run:
        """Read the run in folder ``path``. Never raises for a bad ``run.json``: such a run
        is returned as ``damaged``. A folder still under ``.incomplete/`` is ``running``
        while its process lives and ``interrupted`` after, whatever its ``status`` says
        (``failed`` excepted: that is already the truth)."""
        path = Path(path)
        meta, data, problem = _read_meta(path)
        if meta is None:
            log.info("run %s is damaged: %s", path.name, problem)
            return cls._damaged(path, data, problem or "unreadable")
        staged = path.parent.name == INCOMPLETE
        if meta.status == "running" or (staged and meta.status == "complete"):
            if _alive(meta.pid, meta.pid_started):
                meta = meta.model_copy(update={"status": "running"})
            else:
                meta = meta.model_copy(update={
                    "status": "interrupted",
                    "error": meta.error or "the process ended without finishing the run"})
        return cls(path, meta)

    @classmethod
    def _damaged(cls, path: Path, data: bytes | None, problem: str) -> Run:
        # Built without validation: the folder's own name may not be a valid run id.
        raw = _raw(data)
        pid, started = _salvaged_writer(raw)
        return cls(path, RunMeta.model_construct(
            run_id=path.name, experiment=_salvaged(raw, "experiment") or "unknown",
            status="damaged", error=problem, model=None, config={},
            started_at=_salvaged(raw, "started_at") or "", tables={}, summary=(),
            pid=pid, pid_started=started))

    def __repr__(self) -> str:
        return f"Run({self.id!r}, {self.status})"

    # What a listing shows is read from the index row while run.json is not read.

    @property
    def id(self) -> str:
        row = self.listing
        return row.run_id if row else self.meta.run_id

    @property
    def experiment(self) -> str:
        row = self.listing
        return row.experiment if row else self.meta.experiment

    @property
    def status(self) -> Status:
        row = self.listing
        return row.status if row else self.meta.status

    @property
    def started_at(self) -> str:
        row = self.listing
        return row.started_at if row else self.meta.started_at

    @property
    def seconds(self) -> float | None:
        """How long the run took (from its start and end times), or ``None`` if it has not
        ended."""
        row = self.listing
        return row.seconds if row else self.meta.seconds

    @property
    def model_name(self) -> str | None:
        row = self.listing
        if row:
            return row.model
        return self.meta.model.name if self.meta.model else None

    @property
    def config(self) -> dict[str, Any]:
        row = self.listing
        return row.config if row else self.meta.config

    @property
    def error(self) -> str | None:
        """Why the run failed, was interrupted or is damaged (``None``: it did not)."""
        row = self.listing
        return row.error if row else self.meta.error

    @property
    def busy(self) -> bool | None:
        """Whether the machine was busy during the run (:attr:`RunMeta.busy`)."""
        row = self.listing
        return row.busy if row else self.meta.busy

    @property
    def cells(self) -> tuple[str, ...] | None:
        """A sweep's cells' run ids (:attr:`RunMeta.cells`)."""
        row = self.listing
        return row.cells if row else self.meta.cells

    @property
    def interventions(self) -> Interventions | None:
        """What was changed in the model for the whole run (:attr:`RunMeta.interventions`)."""
        row = self.listing
        return row.interventions if row else self.meta.interventions

    @property
    def interventions_text(self) -> str:
        """The run's interventions in a few words (``""``: none), as every view names them
        (:func:`workbench.store.records.interventions_text`)."""
        return interventions_text(self.interventions)

    def table_names(self) -> list[str]:
        row = self.listing
        return list(row.tables) if row else sorted(self.meta.tables)

    def _entry(self, name: str) -> TableEntry:
        if self.status == "damaged":
            raise WorkbenchError(f"run {self.id} is damaged: "
                                 f"{self.meta.error or 'no reason recorded'}")
        tables = self.meta.tables
        if name not in tables:
            known = ", ".join(sorted(tables)) or "none"
            raise WorkbenchError(f"run {self.id} has no table '{name}'; its tables: {known}")
        return tables[name]

    def _file(self, name: str) -> Path:
        return validate.confined_file(self.path, self._entry(name).file,
                                      what=f"run {self.id} table '{name}'")

    def table_columns(self, name: str) -> list[str]:
        """A stored table's column names, read from its Parquet footer (no rows are read
        and no checksum is checked).

        Raises:
            WorkbenchError: no such table, or a damaged run.
            OSError, pyarrow.ArrowException: an unreadable file.
        """
        import pyarrow.parquet as pq

        return list(pq.read_schema(self._file(name)).names)

    def table(self, name: str) -> pd.DataFrame:
        """Read a table, checking its SHA-256 and its rows against ``run.json``.

        The file is read once, and the bytes that were hashed are the bytes parsed. A
        ``metric`` column holding the old name of a metric holds its registered name
        instead (:func:`~workbench.store.schema.current_metric_names`). What the table
        holds is checked against its experiment's declaration above the store
        (:func:`workbench.harness.tables.read`, which every reader of the workbench uses).

        A table read once is kept for the life of the process (at most
        :data:`MAX_CACHED_TABLES`, each under :data:`MAX_CACHED_TABLE_BYTES`) by its
        path, the SHA-256 ``run.json`` states and the file's status (size, modification
        and status-change times, inode) as it was when its bytes were hashed; a file
        whose status differs in any of them is read and hashed again (one changed in the
        clock tick it was read in is never kept: :data:`~workbench.core.checksums.RACY_NS`).
        Each call returns its own copy.

        Raises:
            WorkbenchError: no such table (the message lists the run's tables), a damaged
                run, a path that leads outside the run folder or to something that is not a
                regular file, or a file that is not Parquet.
            ChecksumError: the file is missing, or changed since the run wrote it.
            SchemaError: the table does not hold the rows ``run.json`` states.
        """
        path, entry = self._file(name), self._entry(name)
        try:
            st = os.stat(path)
            read_ns = time.time_ns()
            key = (str(path), entry.sha256, entry.rows, st.st_size, st.st_mtime_ns,
                   st.st_ctime_ns, st.st_ino)
            if (kept := _TABLES.get(key)) is not None:
                _TABLES.move_to_end(key)
                return kept.copy()
            data = path.read_bytes()
        except OSError as exc:
            raise ChecksumError(f"cannot read {path} ({exc.strerror})") from None
        frame = self._parsed(name, path, data)
        if read_ns - st.st_ctime_ns >= RACY_NS and len(data) <= MAX_CACHED_TABLE_BYTES:
            _TABLES[key] = frame.copy()
            while len(_TABLES) > MAX_CACHED_TABLES:
                _TABLES.popitem(last=False)
        return frame

    def _parsed(self, name: str, path: Path, data: bytes) -> pd.DataFrame:
        """Table ``name``'s file bytes ``data``, checked against ``run.json``, as a frame."""
        import pandas as pd
        import pyarrow

        if hashlib.sha256(data).hexdigest() != self._entry(name).sha256:
            raise ChecksumError(f"checksum mismatch for {path}: the table was changed or damaged")
        try:
            frame = pd.read_parquet(io.BytesIO(data))
        except (OSError, ValueError, pyarrow.ArrowException) as exc:
            raise WorkbenchError(f"table '{name}' of run {self.id} is not readable Parquet "
                                 f"({_one_line(exc)})") from None
        stated = self._entry(name).rows
        if len(frame) != stated:
            raise SchemaError(f"run {self.id}: table {name} holds {len(frame)} rows; its "
                              f"run.json says {stated}")
        return current_metric_names(frame)

    def figure(self, name: str, **options: Any) -> go.Figure:
        """Deprecated: ``workbench.figure(run, name, **options)`` draws the figure.

        .. deprecated:: 0.1.0
            Goes in the next release; a run no longer knows how it is drawn.
        """
        warnings.warn("Run.figure is deprecated; use workbench.figure(run, name, **options)",
                      DeprecationWarning, stacklevel=2)
        from workbench.views.catalog import figure  # the view sits above the store

        return figure(self, name, **options)

    def verify(self) -> None:
        """Re-hash every table of the run against ``run.json``.

        Raises:
            WorkbenchError / ChecksumError: as :meth:`table`, for the first table that fails.
        """
        for name in self.table_names():
            path = self._file(name)
            try:
                actual = checksums.sha256_file(path)
            except OSError as exc:
                raise ChecksumError(f"cannot read {path} ({exc.strerror})") from None
            if actual != self._entry(name).sha256:
                raise ChecksumError(f"checksum mismatch for {path}: the table was changed "
                                    "or damaged")


def model_sizes(model: ModelInfo | None) -> dict[str, int] | None:
    """The bounds of a table's layer and head indices: the run's model's counts
    (``None`` for a run that names no model)."""
    return None if model is None else {"n_layers": model.n_layers, "n_heads": model.n_heads}


def _alive(pid: int | None, started: float | None = None) -> bool:
    """Whether the process that wrote a run still runs: ``pid`` lives, is not a zombie, and
    (when its start time was recorded) started when the run's process did, so that a pid
    reused after a restart does not keep a dead run ``running`` for ever."""
    if pid is None:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(process.create_time() - started) <= START_SLACK
    except psutil.NoSuchProcess:
        return False
    except (psutil.AccessDenied, OSError):  # it exists, but this user cannot look at it
        return True


def _writer_ended(run: Run) -> bool:
    """Whether the process that wrote ``run`` has provably ended: its ``run.json`` names a
    pid (read even from a damaged record) and that process no longer runs, or another
    process took the pid. A run that names no writer may still have one: not ended."""
    return run.meta.pid is not None and not _alive(run.meta.pid, run.meta.pid_started)


def process_started(pid: int | None = None) -> float | None:
    """When process ``pid`` (default: this one) started, as the kernel says (seconds since
    the epoch), or ``None`` if that cannot be read."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def _recording_indexes(folder: Path) -> dict[str, str]:
    """``{folder name: SHA-256 of its index.json}`` of the recordings directly inside a run
    folder (``recording/``, ``example/``)."""
    found = {}
    for index in sorted(folder.glob(f"*/{RECORDING_INDEX}")):
        if index.is_file() and not index.is_symlink() and not index.parent.is_symlink():
            found[index.parent.name] = checksums.sha256_file(index)
    return found


def _load_tuple() -> tuple[float, float, float] | None:
    """The load average as :class:`RunMeta` holds it (``model_copy`` does not validate)."""
    load = provenance.load_average()
    return None if load is None else (load[0], load[1], load[2])


def _describe(error: BaseException) -> str:
    if _out_of_gpu_memory(error):
        return _gpu_memory_advice(error)
    return f"{type(error).__name__}: {error}".rstrip(": ")


def _out_of_gpu_memory(error: BaseException) -> bool:
    """``torch.cuda.OutOfMemoryError`` (known by name: the store does not import torch)."""
    return any(cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch")
               for cls in type(error).__mro__)


def _gpu_memory_advice(error: BaseException) -> str:
    """The failed run's line for a CUDA out-of-memory error: what was asked for, and what
    to change."""
    text = str(error)
    asked = re.search(r"[Tt]ried to allocate ([0-9.]+ ?[KMGT]?i?B)", text)
    what = f"asked for {asked.group(1)} more than the GPU had free" if asked else \
        "asked for more memory than the GPU had free"
    return (f"CUDA out of memory: the run {what}; run it again with a smaller "
            f"max_batch_tokens (--set max_batch_tokens=N; the run's config holds the one "
            f"it used), fewer layers, or in bfloat16 ({type(error).__name__}: "
            f"{text.strip()[:2000]})")


def _peaks() -> dict[str, float | None]:
    """:func:`provenance.peak_memory`, or nothing where it fails (a failing run's record
    must still be written)."""
    try:
        return provenance.peak_memory()
    except Exception:  # whatever CUDA raises: the failure to record is the run's own
        return {}


class ActiveRun:
    """A run being written. Use through :meth:`RunStore.start`.

    ``dir`` is the staging folder the run writes into; ``final`` where it goes when it ends.
    """

    def __init__(self, staging: Path, final: Path, meta: RunMeta,
                 tables: Mapping[str, Table]) -> None:
        self.dir = staging
        self.final = final
        self.meta = meta
        self.declared = dict(tables)
        self._at = staging  # where the folder is now

    @property
    def id(self) -> str:
        return self.meta.run_id

    def save_table(self, name: str, df: pd.DataFrame) -> None:
        """Check ``df`` against its declaration, write it as ``<name>.parquet`` and record
        its checksum.

        Raises:
            SchemaError: the run declares no table ``name``, or ``df`` does not match it.
            OSError: the file could not be written (nothing partial is left).
        """
        if name not in self.declared:
            known = ", ".join(self.declared) or "none"
            raise SchemaError(f"run {self.id} declares no table '{name}'; declared: {known}")
        self.declared[name].check(df, model_sizes(self.meta.model))
        path = self.dir / f"{name}.parquet"
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            df.to_parquet(tmp, index=False)
            os.replace(tmp, path)
        except BaseException:
            durable.remove_quietly(tmp)
            raise
        entry = TableEntry(file=path.name, rows=len(df), sha256=checksums.sha256_file(path))
        self.meta = self.meta.replace(tables={**self.meta.tables, name: entry})

    def update(self, **facts: Any) -> None:
        """Record more facts in ``run.json`` (``summary=[...]``, a sweep's ``cells=[...]``),
        each checked against :class:`RunMeta`.

        Raises:
            RecordError: a field ``RunMeta`` does not have, or a value of the wrong type.
        """
        self.meta = self.meta.replace(**facts)

    def _write(self) -> None:
        durable.write_atomic(self._at / RUN_JSON, self.meta.to_json())

    def _move_into_place(self) -> None:
        os.replace(self._at, self.final)
        self._at = self.final
        durable.fsync_dir(self.final.parent)
        durable.fsync_dir(self.dir.parent)

    def _complete(self) -> Run:
        """Mark the run complete, flush it, move it into place: in that order, so that a
        kill at any step leaves a folder under ``.incomplete/`` (which no reader believes)
        or a complete run whose every byte is on disk."""
        self.meta = self.meta.replace(status="complete", ended_at=_now(),
                                      load_at_end=provenance.load_average(),
                                      recordings=_recording_indexes(self._at),
                                      **provenance.peak_memory())
        self._write()
        durable.remove_quietly(self._at / RESERVE)
        durable.fsync_tree(self._at)
        self._move_into_place()
        return Run(self.final, self.meta)

    def _fail(self, error: BaseException) -> None:
        """Record ``error`` as the run's cause of failure, by any means the disk allows.

        Never raises: the caller re-raises ``error`` itself.
        """
        self.meta = self.meta.model_copy(update=dict(
            status="failed", ended_at=_now(), load_at_end=_load_tuple(),
            error=_describe(error)[:100_000], **_peaks(),
            traceback="".join(traceback.format_exception(error))[-8000:]))
        try:
            self._write()
        except OSError as exc:  # a full disk or a read-only filesystem
            log.warning("run %s: cannot write run.json (%s); using the reserved space",
                        self.id, exc)
            if not self._write_reserved():
                return
        durable.remove_quietly(self._at / RESERVE)
        try:
            durable.fsync_tree(self._at)
            if self._at != self.final:
                self._move_into_place()
        except OSError as exc:  # marked failed where it is; readers trust "failed"
            log.warning("failed run %s stays in %s: %s", self.id, self._at, exc)

    def _write_reserved(self) -> bool:
        """Overwrite the reserved file with the ``failed`` record, then rename it to
        ``run.json``; ``False`` if even that was impossible (logged)."""
        meta = self.meta
        full = meta.model_copy(update={"traceback": None})
        essential = RunMeta.model_construct(**{k: getattr(meta, k) for k in (
            "run_id", "experiment", "model", "config", "seed", "started_at", "ended_at",
            "status", "error", "pid", "workbench_version")})
        brief = essential.model_copy(update={"model": None, "config": {},
                                             "error": (meta.error or "")[:2000]})
        data = next(d for d in (r.to_json() for r in (full, essential, brief))
                    if len(d) <= RESERVE_BYTES)
        reserve = self._at / RESERVE
        try:
            durable.overwrite_reserved(reserve, data)
            os.replace(reserve, self._at / RUN_JSON)
            durable.fsync_dir(self._at)
        except (OSError, ValueError) as exc:
            log.error("run %s failed (%s) and cannot be marked failed on disk: %s",
                      self.id, self.meta.error, exc)
            return False
        return True




def _merged(listed: list[Run]) -> list[Run]:
    """Runs listed from ``.incomplete/`` and then from the store, one per id (a run listed
    in both places while it finished: the finished one), oldest first."""
    found: dict[str, Run] = {}
    for run in listed:
        if run.id in found and found[run.id].path.parent.name != INCOMPLETE:
            continue
        found[run.id] = run
    return sorted(found.values(), key=lambda r: (r.started_at, r.id))


@dataclasses.dataclass(frozen=True)
class _Kept:
    """A store's unchecked listing kept between calls (:meth:`RunStore._unchecked`)."""

    key: tuple[tuple[int, int, int], Any]
    rows: tuple[tuple[str, Listing], ...]
    """The finished runs of the store folder listed from their index rows, oldest first:
    folder, row."""
    read: tuple[str, ...]
    """The store folder's other runs (no row: damaged), read again at every listing."""

    @classmethod
    def of(cls, key: tuple[tuple[int, int, int], Any], root: Path, listed: list[Run]) -> _Kept:
        mine = [run for run in listed if run.path.parent == root]
        return cls(key, tuple((str(run.path), run.listing) for run in mine
                              if run.listing is not None),
                   tuple(str(run.path) for run in mine if run.listing is None))


_UNCHECKED: dict[str, _Kept] = {}
"""The unchecked listing last made of each store in this process, by its root."""


def _old_info(model: Mapping[str, Any]) -> ModelInfo:
    """A model record passed as a mapping, as ``RunStore.start`` took it before (deprecated)."""
    warnings.warn("RunStore.start(model=) takes a ModelInfo; pass ModelInfo.from_data(record) "
                  "instead of a mapping", DeprecationWarning, stacklevel=4)
    return ModelInfo.from_data(dict(model), what="the run's model")


class RunStore:
    """All runs under one folder (``--out``, ``WORKBENCH_RUNS_DIR`` or ``data/runs``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _claim_id(self, prefix: str) -> tuple[str, Path]:
        """A new run id ``prefix-xxxx`` and its staging folder, which this call creates.

        Processes that start runs in the same second can draw the same 16-bit suffix. The
        staging ``mkdir`` is exclusive, so an id being staged elsewhere is refused there;
        an id already moved into place is seen after it (the move is one atomic rename, so
        one of the two checks always sees the other run).

        Raises:
            WorkbenchError: no free id after many draws.
        """
        (self.root / INCOMPLETE).mkdir(parents=True, exist_ok=True)
        for _ in range(_ID_DRAWS):
            run_id = f"{prefix}-{secrets.token_hex(2)}"
            staging = self.root / INCOMPLETE / run_id
            try:
                staging.mkdir()
            except FileExistsError:
                continue
            if not (self.root / run_id).exists():
                return run_id, staging
            staging.rmdir()
        raise WorkbenchError(f"no free run id {prefix}-xxxx in {self.root} after "
                             f"{_ID_DRAWS} draws")

    @contextmanager
    def start(self, experiment: str, model: ModelInfo | None, config: Any,
              *, tables: Mapping[str, Table] | None = None,
              extra: dict[str, Any] | None = None,
              name: str | None = None) -> Iterator[ActiveRun]:
        """Create a run; mark it complete when the block ends, failed if it raises.

        Args:
            experiment: the experiment's registered name (``record`` for recordings).
            model: the :class:`ModelInfo` of the model used, or ``None``. (Its
                ``to_dict()`` is still taken, with a deprecation warning, for one release:
                ``ModelInfo.from_data`` turns a stored record back into one.)
            config: the experiment's config dataclass (or a dict).
            tables: the declarations of the tables the run may save (none by default).
            extra: more facts for ``run.json`` (fields of :class:`RunMeta`).
            name: what the run id names after the experiment (default the model's name,
                ``none`` without a model; a sweep gives its spec's name).

        Raises:
            RecordError: ``extra`` names no field of ``run.json`` or has a value of the
                wrong type (nothing is left behind).
            OSError: the run could not be created (nothing is left behind), or could not
                be completed (it is then marked failed with this error, if the disk allows).
        """
        cfg = _config_values(config)
        info = model if isinstance(model, ModelInfo) or model is None else _old_info(model)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        model_part = _slug(name) if name else (_slug(info.name) if info else "none")
        run_id, staging = self._claim_id(f"{stamp}-{_slug(experiment)}-{model_part}")
        try:
            meta = _starting_meta(run_id, experiment, info, cfg, extra)
        except BaseException:
            staging.rmdir()
            raise
        active = ActiveRun(staging, self.root / run_id, meta, tables or {})
        provenance.reset_gpu_peak()
        try:
            durable.reserve(staging / RESERVE, RESERVE_BYTES)
            active._write()
        except BaseException:  # no room even to start: leave no trace of a run
            shutil.rmtree(staging, ignore_errors=True)
            raise
        paths_taken: set[TakenPath] = set()
        try:
            with attention.collecting() as paths_taken:
                yield active
        except BaseException as exc:  # Ctrl-C and SystemExit too: never leave it "running"
            active.meta = active.meta.model_copy(update={"attention": attention.taken(
                paths_taken)})
            active._fail(exc)
            log.error("run %s failed: %s", active.id, active.meta.error)
            raise
        try:
            active.meta = active.meta.model_copy(update={"attention": attention.taken(
                paths_taken)})
            active._complete()
        except BaseException as exc:  # the disk filled up or went read-only while finishing
            active._fail(exc)
            log.error("run %s could not be completed: %s", active.id, active.meta.error)
            raise

    def _run_folders(self, unchecked: Container[str] = (), *, store: bool = True
                     ) -> list[tuple[bool, str, os.stat_result | None]]:
        """Folders directly inside the store's ``.incomplete/`` and the store itself that
        hold a ``run.json``: whether each is staged (in ``.incomplete/``), its path, and
        its ``run.json``'s ``lstat`` (``None`` for a folder of the store named in
        ``unchecked``, whose file is not looked at). Symlinks are not followed, so nothing
        outside is listed.

        ``.incomplete/`` is listed first: a run that finishes meanwhile moves from there
        into the store, so it is found in one of the two listings (or both), never in
        neither. ``store=False`` lists ``.incomplete/`` alone."""
        found = []
        parents = ((True, self.root / INCOMPLETE), (False, self.root))
        for staged, parent in parents if store else parents[:1]:
            if parent.is_symlink() or not parent.is_dir():
                continue
            try:
                with os.scandir(parent) as listing:
                    entries = sorted((e.name, e.path) for e in listing
                                     if e.is_dir(follow_symlinks=False)
                                     and (staged or not e.name.startswith(".")))
            except OSError as exc:
                log.warning("cannot list %s: %s", parent, exc.strerror)
                continue
            for name, folder in entries:
                if not staged and name in unchecked:
                    found.append((staged, folder, None))
                    continue
                try:
                    found.append((staged, folder, os.lstat(f"{folder}/{RUN_JSON}")))
                except OSError:  # no run.json: not a run folder
                    continue
        return found

    def runs(self, *, experiment: str | None = None, model: str | None = None,
             status: Status | None = None, checked: bool = True) -> list[Run]:
        """Stored runs, oldest first, optionally filtered. Damaged runs are listed too,
        with ``status == "damaged"`` and the reason in ``meta.error``.

        A finished run is listed from the store's index while its ``run.json`` is the one
        its row was read from (:mod:`workbench.store.index`); the index is rewritten when
        a listing finds it out of date. ``checked=False`` lists a finished run from its
        row without looking at its ``run.json`` at all (a page's run dropdown: a run is
        read in full when it is opened, so one changed since its row was written is
        still caught then); the store is still listed, so new and removed runs show, and
        a run still in ``.incomplete/`` is read every time (:meth:`_unchecked`)."""
        listed = self._listing(checked=True) if checked else self._unchecked()
        return [run for run in listed
                if (not experiment or run.experiment == experiment)
                and (not model or run.model_name == model)
                and (not status or run.status == status)]

    def _listing(self, *, checked: bool) -> list[Run]:
        """Every run of the store, oldest first (:meth:`runs` unfiltered)."""
        indexed = store_index.read(self.root)
        rows: dict[str, Listing] = {}
        listed = []
        for staged, folder, st in self._run_folders(() if checked else indexed):
            listed.append(self._load(Path(folder)) if staged
                          else self._listed(folder, st, indexed, rows))
        if rows.keys() != indexed.keys() or any(rows[k] is not indexed[k] for k in rows):
            store_index.write(self.root, rows)
        return _merged(listed)

    def _unchecked(self) -> list[Run]:
        """``_listing(checked=False)``, with the store's own folders kept in this process
        while the store folder and its index are unchanged (the same status: a run added,
        removed or finished renames a folder in or out of the store folder, which changes
        its times; an index rewritten is a new file).

        What is kept is each finished run's index row, made into a fresh :class:`Run` at
        every call; a folder without a row (a damaged run) is read again, and so is every
        run in ``.incomplete/``. A listing is kept only when the store folder was last
        changed at least :data:`~workbench.core.checksums.RACY_NS` before it was made (a
        change in the same tick of the file clock could leave the times as they were),
        and when making it did not rewrite the index."""
        root = str(self.root)
        key = self._listing_key()
        kept = _UNCHECKED.get(root)
        if key is not None and kept is not None and kept.key == key:
            staged = [self._load(Path(folder))
                      for _, folder, _ in self._run_folders(store=False)]
            # a run that finished between the key and the listing of .incomplete/ is in
            # neither: the store folder changed, so the whole listing is made again
            if self._listing_key() == key:
                finished = [Run(folder, listing=row) for folder, row in kept.rows]
                if not staged and not kept.read:
                    return finished  # kept oldest first, one per id
                return _merged([*staged, *finished, *(Run.load(f) for f in kept.read)])
        started_ns = time.time_ns()
        listed = self._listing(checked=False)
        after = self._listing_key()
        if after is not None and after == key and started_ns - max(after[0][:2]) >= RACY_NS:
            _UNCHECKED[root] = _Kept.of(after, self.root, listed)
        return listed

    def _listing_key(self) -> tuple[tuple[int, int, int], Any] | None:
        """The status of the store folder (mtime, ctime, inode) and of its index file
        (``None``: no index), or ``None`` when the folder cannot be read."""
        try:
            st = os.lstat(self.root)
        except OSError:
            return None
        try:
            index = store_index.stat_of(os.lstat(self.root / store_index.INDEX))
        except OSError:
            index = None
        return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino), index

    @staticmethod
    def _listed(folder: str, st: os.stat_result | None, indexed: dict[str, Listing],
                rows: dict[str, Listing]) -> Run:
        """The finished or damaged run in ``folder`` of the store (its ``run.json`` of
        ``lstat`` ``st``; ``None``: not checked): from its index row when the row was
        read from this very file (or it is not checked), else read (and its row added to
        ``rows`` when it is a finished run)."""
        name = folder.rpartition(os.sep)[2]
        row = indexed.get(name)
        if row is not None and (st is None or (stat_mode.S_ISREG(st.st_mode)
                                and row.current(st))):
            rows[name] = row
            return Run(folder, listing=row)
        read_ns = time.time_ns()
        run = Run.load(folder)
        if run.status in store_index.INDEXED and run.id == name \
                and st is not None and stat_mode.S_ISREG(st.st_mode):
            rows[name] = Listing.of(run.meta, st, read_ns)
        return run

    def _load(self, path: Path) -> Run:
        """:meth:`Run.load`, and for a staged run whose folder moved into the store while it
        was being read (it finished), the finished run."""
        run = Run.load(path)
        if run.status == "damaged" and path.parent.name == INCOMPLETE \
                and not os.path.lexists(path / RUN_JSON):
            moved = self.root / path.name
            if os.path.lexists(moved / RUN_JSON) and not moved.is_symlink():
                return Run.load(moved)
        return run

    def get(self, ref: str | Path) -> Run:
        """A run by id, id prefix, or the path of its folder, which must be directly inside
        the store (``data/runs/<id>``, ``<store>/.incomplete/<id>``), symlinks resolved. A
        whole id opens its folder without listing the store (:meth:`by_id`).

        Raises:
            WorkbenchError: a path outside the store, or no such run (the message lists the
                most recent ids).
        """
        text = str(ref)
        if not text or "\0" in text:
            raise WorkbenchError(f"run reference {text!r} is empty or not a name; "
                                 "give a run id, an id prefix or a run folder in the store")
        if isinstance(ref, Path) or _is_path(text):
            return Run.load(self._folder(ref))
        found = self.by_id(text)
        if found is not None:
            return found
        runs = self.runs()
        matches = [r for r in runs if r.id == text] or [r for r in runs if r.id.startswith(text)]
        if len(matches) == 1:
            return matches[0]
        recent = ", ".join(r.id for r in runs[-5:]) or "none"
        if matches:
            raise WorkbenchError(f"run '{ref}' is ambiguous: {', '.join(r.id for r in matches)}")
        raise WorkbenchError(f"no run '{ref}' in {self.root}; most recent: {recent}")

    def by_id(self, run_id: str) -> Run | None:
        """The run ``run_id`` opened from its own folder, without listing the store: the
        finished run first, then a staged one, as :meth:`runs` lists it. ``None`` when
        ``run_id`` is not a whole run id, or no folder of that name (not a symlink, nor
        under a symlinked ``.incomplete/``) holds a run of that id; the listing then
        decides (:meth:`get`)."""
        if not re.fullmatch(RUN_ID_PATTERN, run_id):
            return None
        for parent in (self.root, self.root / INCOMPLETE):
            folder = parent / run_id
            if parent.is_symlink() or folder.is_symlink() or not folder.is_dir() \
                    or not os.path.lexists(folder / RUN_JSON):
                continue
            run = self._load(folder)
            if run.id == run_id:
                return run
        return None

    def _folder(self, ref: str | Path) -> Path:
        """The run folder a path reference names, in the store's own spelling."""
        path = Path(ref).expanduser()
        outside = WorkbenchError(
            f"run '{ref}' is outside the run store {self.root}; expected a run id or a "
            "folder directly inside the store")
        if os.pardir in path.parts:
            raise outside
        base = validate.real(self.root)
        staging = base / INCOMPLETE
        tries = [path] if path.is_absolute() else [path, self.root / path]
        for candidate in tries:
            real = validate.real(candidate)
            if real.parent == base and not real.name.startswith("."):
                folder = self.root / real.name
            elif real.parent == staging and not (self.root / INCOMPLETE).is_symlink():
                folder = self.root / INCOMPLETE / real.name
            else:
                continue
            if not real.is_dir() or not os.path.lexists(real / RUN_JSON):
                raise WorkbenchError(f"no run at {folder} (expected a folder with {RUN_JSON})")
            return folder
        raise outside

    def latest(self, *, experiment: str | None = None, model: str | None = None) -> Run | None:
        """The newest complete run matching the filters, if any."""
        runs = self.runs(experiment=experiment, model=model, status="complete")
        return runs[-1] if runs else None

    def latest_on_weights(self, experiment: str, model: ModelInfo, *,
                          unmasked: bool = True) -> Run | None:
        """The newest complete run of ``experiment`` on the same model weights (name and
        checksum of ``model``), without interventions unless ``unmasked`` is false;
        ``None`` if there is none."""
        for run in reversed(self.runs(experiment=experiment, status="complete")):
            if not _same_weights(run.meta.model, model):
                continue
            if unmasked and run.meta.interventions:
                continue
            return run
        return None

    def find_matching(self, experiment: str, model: Weights | None, config: Any,
                      interventions: Interventions | None = None, *,
                      check: Callable[[Run], None] | None = None) -> Run | None:
        """The newest complete run with the same experiment, model weights, config,
        interventions and workbench version, for reuse instead of a recomputation.

        A candidate is re-verified before it is returned: every table is re-hashed (and
        ``check(run)`` called, if given, to verify more of its files); one that fails is
        skipped with a warning and the next older match is tried.
        """
        cfg = _config_values(config)
        version = provenance.workbench_version()
        for run in reversed(self.runs(experiment=experiment, status="complete")):
            if model is not None and not _same_weights(run.meta.model, model):
                continue
            if not (run.config == cfg and run.meta.workbench_version == version
                    and run.meta.interventions == interventions):
                continue
            try:
                run.verify()
                if check is not None:
                    check(run)
            except WorkbenchError as exc:
                log.warning("not reusing run %s: %s", run.id, exc)
                continue
            return run
        return None

    def _unfinished(self) -> list[Run]:
        """The runs in ``.incomplete/`` that are not running as this version reads them:
        interrupted, or damaged (a record it cannot validate)."""
        return [r for r in self.runs() if r.path.parent.name == INCOMPLETE
                and r.status in ("interrupted", "damaged")]

    def leftovers(self) -> list[Run]:
        """The runs left in ``.incomplete/`` by processes that provably died, which
        ``workbench clean --yes`` removes: interrupted or damaged runs whose ``run.json``
        names their writer (``pid``, with ``pid_started`` when recorded) and that process
        no longer runs. The writer is read from a damaged ``run.json`` too (one written by
        another version of the workbench sharing the store fails this version's check),
        so a run still being written is never a leftover, whatever its record says."""
        return [r for r in self._unfinished() if _writer_ended(r)]

    def held_back(self) -> list[Run]:
        """The runs in ``.incomplete/`` that look abandoned (interrupted or damaged) but
        are not :meth:`leftovers`: their writer still runs, or their ``run.json`` names no
        writer, so nothing proves that no process is writing them. They are never removed
        by :meth:`remove_leftovers`; once nothing writes one, delete its folder by hand."""
        return [r for r in self._unfinished() if not _writer_ended(r)]

    def remove_leftovers(self) -> list[Run]:
        """Delete :meth:`leftovers` (each read again just before, so a run that finished
        meanwhile, or whose writer turns out to run, is not removed); return what was
        removed."""
        removed = []
        for run in self.leftovers():
            again = Run.load(run.path)
            if again.status in ("interrupted", "damaged") and _writer_ended(again) \
                    and not run.path.is_symlink():
                shutil.rmtree(run.path)
                removed.append(run)
        return removed


def _starting_meta(run_id: str, experiment: str, info: ModelInfo | None,
                   cfg: dict[str, Any], extra: dict[str, Any] | None) -> RunMeta:
    """The ``run.json`` of a run starting now in this process: its provenance, the load,
    ``running``, and ``extra``.

    Raises:
        RecordError: ``extra`` names no field of ``run.json`` or has a value of the wrong
            type.
    """
    seed = cfg.get("seed")
    return RunMeta.from_data({
        "run_id": run_id, "experiment": experiment,
        "model": info.to_data() if info else None, "config": cfg,
        "seed": seed if isinstance(seed, int) else None,
        "workbench_version": provenance.workbench_version(), **provenance.collect(),
        "started_at": _now(), "load_at_start": provenance.load_average(),
        "status": "running", "pid": os.getpid(),
        "pid_started": process_started(), **(extra or {}),
    }, what=RUN_JSON)


def _config_values(config: Any) -> dict[str, Any]:
    """A config (dataclass or mapping) as the JSON values ``run.json`` keeps (tuples as
    lists), so that a stored config compares equal to a fresh one."""
    cfg = dict(config) if isinstance(config, Mapping) else dataclasses.asdict(config)
    return json.loads(json.dumps(cfg, default=str))


def _same_weights(stored: ModelInfo | None, model: Weights) -> bool:
    return stored is not None and (stored.name, stored.checksum) == (model.name, model.checksum)


def _is_path(text: str) -> bool:
    """Whether a run reference is written as a path rather than an id."""
    seps = {"/", os.sep, os.altsep} - {None}
    return any(sep in text for sep in seps) or text in (os.curdir, os.pardir) \
        or text.startswith("~")
