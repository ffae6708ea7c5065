"""Read the run store from inside a request (pages never read data at import time)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import flask

from workbench.recording.record import Recording
from workbench.store.runs import Run, RunStore


def store() -> RunStore:
    """The run store this app serves (set by ``create_app``)."""
    return RunStore(flask.current_app.config["WORKBENCH_RUNS_DIR"])


def runs(experiment: str | None = None, status: str | None = "complete") -> list[Run]:
    """Runs, newest first."""
    return list(reversed(store().runs(experiment=experiment, status=status)))


def get_run(run_id: str) -> Run:
    return store().get(run_id)


def recording(run_id: str) -> Recording:
    """The recording of a run, opened once per process and run folder."""
    path = get_run(run_id).path
    return _open_recording(str(path), (path / "recording" / "index.json").stat().st_mtime_ns)


@lru_cache(maxsize=8)
def _open_recording(path: str, mtime_ns: int) -> Recording:
    return Recording.open(Path(path))
