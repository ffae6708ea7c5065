"""Read the run store from inside a request (pages never read data at import time).

A page opens only runs the store lists. A run id from the client (a dropdown value, a
``?run=`` in the URL, or a request crafted by hand) is matched exactly against the ids of
the listed runs and never resolved as a path: an absolute or relative path, ``..``, an id
prefix, or a folder inside the store that is a symlink leading out of it is refused with a
:class:`WorkbenchError`, which the page shows as a message (:mod:`.messages`).

Examples:
    >>> run = get_run(run_id, shows=["record"])       # doctest: +SKIP
    >>> rec = recording(run_id)                         # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import flask
import pandas as pd

from workbench.core.errors import WorkbenchError
from workbench.core.options import Status
from workbench.harness import tables
from workbench.harness.live import LiveQueue
from workbench.recording.reader import Recording
from workbench.store.runs import INCOMPLETE, Run, RunStore


def live_device() -> str:
    """The torch device the app's Live page loads its models on (``create_app(device=)``)."""
    return flask.current_app.config.get("WORKBENCH_LIVE_DEVICE") or "cpu"


def live_queue() -> LiveQueue:
    """The app's queue of live recordings (``create_app(..., live=True)``).

    Raises:
        WorkbenchError: the Live page is off (the message says why).
    """
    off = flask.current_app.config.get("WORKBENCH_LIVE_OFF")
    queue = flask.current_app.extensions.get("workbench_live")
    if off or queue is None:
        raise WorkbenchError(off or "the Live page is off in this app")
    return queue


def store() -> RunStore:
    """The run store this app serves (set by ``create_app``)."""
    return RunStore(flask.current_app.config["WORKBENCH_RUNS_DIR"])


def _resolved(path: Path) -> Path | None:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return None


def _inside(root: Path, run: Run) -> bool:
    """Whether the run's folder, symlinks resolved, is a direct child of the store (or of
    its ``.incomplete`` folder): a folder linking out of the store is not one of its runs."""
    base, path = _resolved(root), _resolved(run.path)
    return (base is not None and path is not None
            and path.parent in (base, base / INCOMPLETE) and path.name == run.path.name)


def listed(*, checked: bool = False) -> list[Run]:
    """Every run the store lists, damaged ones too, oldest first, listed once per request.

    A page's run dropdown lists finished runs from the store's index without reading
    their ``run.json`` (``checked=False``: :meth:`RunStore.runs`); a page reads its run in
    full when it opens it (:func:`listed_run`), so a run damaged since it was indexed is
    refused there. The Runs page, which shows every run's status, asks for ``checked``.
    Every run listed is inside the store: the listing takes only folders directly in it
    or in its ``.incomplete/``, and follows no symlink."""
    key = f"workbench_listed_{checked}"
    if key not in flask.g:
        setattr(flask.g, key, store().runs(checked=checked))
    return getattr(flask.g, key)


def runs(experiment: str | None = None, status: Status | None = "complete", *,
         checked: bool = False) -> list[Run]:
    """Runs, newest first: complete ones unless ``status`` says otherwise (``None``: all,
    damaged ones included). Within a request the store is listed once (:func:`listed`),
    however many times a page asks."""
    return [r for r in reversed(listed(checked=checked))
            if (experiment is None or r.experiment == experiment)
            and (status is None or r.status == status)]


def _shown(run_id: object) -> str:
    text = run_id if isinstance(run_id, str) else repr(run_id)
    return text if len(text) <= 80 else text[:77] + "..."


def listed_run(run_id: object) -> Run:
    """The listed run whose id is exactly ``run_id``, whatever its status: a whole run id
    opens its own folder (:meth:`RunStore.by_id`), so a callback does not list the store;
    anything else (a damaged run's folder name) is looked up in the listing.

    Raises:
        WorkbenchError: the store lists no run with that id (a path, a prefix and a
            symlink leading out of the store are never one).
    """
    if isinstance(run_id, str) and run_id:
        opened = flask.g.setdefault("workbench_opened", {})
        if run_id in opened:  # one request's callbacks share the run they open
            return opened[run_id]
        st = store()
        run = st.by_id(run_id)
        if run is None or not _inside(st.root, run):
            run = next((r for r in listed() if r.id == run_id), None)
        if run is not None:
            opened[run_id] = run
            return run
    raise WorkbenchError(f"no such run '{_shown(run_id)}' in {store().root}; "
                         "choose one of the runs the store lists")


def get_run(run_id: object, *, shows: Sequence[str] | None = None) -> Run:
    """The complete, listed run ``run_id``, for reading its tables.

    Args:
        run_id: a run id exactly as the store lists it.
        shows: the experiments the asking page shows (``None``: any).

    Raises:
        WorkbenchError: no such run; the run is damaged, failed, interrupted or still
            running; or it is a run of an experiment the page does not show.
    """
    run = listed_run(run_id)
    if run.status == "damaged":
        raise WorkbenchError(f"run {run.id} is damaged: {run.meta.error or 'no reason'}")
    if run.status != "complete":
        why = f" ({run.meta.error})" if run.meta.error else ""
        raise WorkbenchError(f"run {run.id} is {run.status}{why}; pages show complete runs")
    if shows is not None and run.experiment not in shows:
        article = "an" if run.experiment[:1] in tuple("aeiou") else "a"
        raise WorkbenchError(f"run {run.id} is {article} {run.experiment} run; this page "
                             f"shows {' or '.join(shows)} runs")
    return run


def choose(requested: object, runs: Sequence[Run], *, shows: Sequence[str]) -> str:
    """The run a page opens with: ``requested`` (its ``?run=``) if it is one of ``runs``,
    else the first of ``runs`` (the newest complete one) when nothing was requested.

    Raises:
        WorkbenchError: ``requested`` is not a complete run the page shows (the message
            says why, as :func:`get_run` does).
    """
    if requested is None and runs:
        return runs[0].id
    if any(r.id == requested for r in runs):
        return str(requested)
    return get_run(requested, shows=shows).id


def open_recording(run: Run, part: str = "recording") -> Recording:
    """The recording in folder ``part`` of a listed run, opened once per process and
    version of its index.

    Raises:
        WorkbenchError: the folder or its index leads outside the run's folder, there is
            no recording, or its index is unreadable or does not match its files.
    """
    folder = run.path / part
    base, target = _resolved(run.path), _resolved(folder)
    index = _resolved(folder / "index.json")
    if base is None or target is None or index is None or not (
            target.is_relative_to(base) and index.is_relative_to(base)):
        raise WorkbenchError(f"run {run.id}: its {part} folder leads outside the run")
    try:
        version = (folder / "index.json").stat().st_mtime_ns
    except FileNotFoundError:
        raise WorkbenchError(f"run {run.id} has no {part}") from None
    except OSError as exc:
        raise WorkbenchError(f"run {run.id}: cannot read its {part} ({exc.strerror})") from None
    try:
        return _open_recording(str(folder), version)
    except WorkbenchError:
        raise
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        # an index.json that is not JSON or lacks its keys is damage, not a bug here
        raise WorkbenchError(f"run {run.id}: its {part} is damaged "
                             f"({type(exc).__name__}: {exc})") from None


def recording(run_id: object) -> Recording:
    """The recording of the complete ``record`` run ``run_id`` (see :func:`get_run`)."""
    return open_recording(get_run(run_id, shows=["record"]))


@lru_cache(maxsize=8)
def _open_recording(path: str, mtime_ns: int) -> Recording:
    return Recording.open(Path(path))


def table(run: Run, name: str) -> pd.DataFrame:
    """Table ``name`` of ``run`` read through its declaration (its columns, kinds,
    ranges and keys: :func:`workbench.harness.tables.read`): a table that does not hold
    what it declares is a one-line error the page shows, never an HTTP 500. Its bytes are
    checked against the SHA-256 in ``run.json`` when first read, and read and hashed again
    whenever the file changes (:meth:`workbench.store.runs.Run.table`), so a table changed
    since it was last drawn is caught."""
    return tables.read(run, name)
