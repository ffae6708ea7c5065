"""``workbench clean --yes`` removes a staged run only when its writer has provably ended,
whatever its ``run.json`` says: a record this version cannot validate (one field it does
not know, as a newer workbench sharing the store writes) still names its writer, and a
run whose writer lives, or whose ``run.json`` names none, is kept."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.tiny import cli, ended_writer
from workbench.store.runs import INCOMPLETE, RUN_JSON, RunStore, process_started

RUN_ID = "20990101-000000-exp-tiny-beef"
NEWER = {"written_by": "a newer workbench", "shards": [1, 2]}
"""A field this version's record does not know: the run.json is damaged to it."""


@pytest.fixture
def live_child():
    """``pid`` and ``pid_started`` of another process that runs for the whole test."""
    child = subprocess.Popen(["sleep", "120"])
    try:
        yield {"pid": child.pid, "pid_started": process_started(child.pid)}
    finally:
        child.kill()
        child.wait()


def this_process() -> dict[str, Any]:
    return {"pid": os.getpid(), "pid_started": process_started()}


def staged(root: Path, fields: dict[str, Any], *, text: str | None = None) -> Path:
    """A run being written in ``root/.incomplete/``: its ``run.json`` is a running run's
    with ``fields`` added (``None`` drops a field), or ``text`` as it stands; a table is
    half written beside it."""
    folder = root / INCOMPLETE / RUN_ID
    folder.mkdir(parents=True)
    meta = {"run_id": RUN_ID, "experiment": "exp", "status": "running",
            "started_at": "2099-01-01T00:00:00+00:00", "config": {}, "model": None}
    meta.update(fields)
    meta = {k: v for k, v in meta.items() if v is not None}
    (folder / RUN_JSON).write_text(json.dumps(meta) if text is None else text)
    (folder / "t.parquet").write_bytes(b"PAR1 half written")
    return folder


def clean(capsys, *args: str) -> list[str]:
    status, out, err = cli(capsys, "clean", *args)
    assert status == 0 and "Traceback" not in err
    return out


# ---- a record this version cannot read still names its writer --------------------------

@pytest.mark.parametrize("writer", ["this process", "another process"])
def test_a_newer_versions_run_whose_writer_lives_survives_clean(capsys, runs_dir, writer,
                                                               live_child):
    pids = this_process() if writer == "this process" else live_child
    folder = staged(runs_dir, {**pids, **NEWER})
    assert RunStore(runs_dir).get(RUN_ID).status == "damaged"  # listed as damaged ...
    assert RunStore(runs_dir).leftovers() == []                 # ... but not abandoned
    out = clean(capsys)
    assert any(line.startswith(f"kept {RUN_ID} (damaged): its writer, process "
                               f"{pids['pid']}, still runs") for line in out)
    assert "runs left by processes that died" not in "\n".join(out)
    out = clean(capsys, "--yes")
    assert folder.is_dir() and (folder / "t.parquet").read_bytes() == b"PAR1 half written"
    assert not any(line.startswith("removed") for line in out)


def test_the_same_run_whose_writer_ended_is_removed(capsys, runs_dir):
    folder = staged(runs_dir, {**ended_writer(), **NEWER})
    assert [r.id for r in RunStore(runs_dir).leftovers()] == [RUN_ID]
    assert RUN_ID in "\n".join(clean(capsys))
    out = clean(capsys, "--yes")
    assert not folder.exists() and out[-1] == "removed 1 runs left by processes that died"


def test_a_live_pid_that_started_at_another_time_is_not_the_writer(capsys, runs_dir):
    # the pid was reused after the writer died: its start time tells them apart
    pids = this_process()
    folder = staged(runs_dir, {**pids, "pid_started": pids["pid_started"] - 3600, **NEWER})
    clean(capsys, "--yes")
    assert not folder.exists()


@pytest.mark.parametrize("started", ["yesterday", True, -1, 1e400, 10**400],
                         ids=["text", "bool", "negative", "infinite", "huge-int"])
def test_an_unreadable_start_time_leaves_a_live_pid_the_writer(capsys, runs_dir, started):
    # json writes 1e400 as Infinity, which it reads back as inf
    folder = staged(runs_dir, {"pid": os.getpid(), "pid_started": started, **NEWER})
    assert RunStore(runs_dir).get(RUN_ID).status == "damaged"
    clean(capsys, "--yes")
    assert folder.is_dir()


# ---- no writer named: nothing proves the run abandoned, so it is kept ---------------------

NO_WRITER = {
    "no-pid-field": ({**NEWER, "pid": None}, None),
    "pid-is-text": ({**NEWER, "pid": str(os.getpid())}, None),
    "pid-is-a-bool": ({**NEWER, "pid": True}, None),
    "pid-beyond-pid-t": ({**NEWER, "pid": 2**40}, None),
    "not-json": ({}, '{"run_id": "20990101-000000-exp-tiny-beef", "pid": 12'),
    "not-an-object": ({}, "[1, 2, 3]"),
    "valid-record-without-pid": ({"pid": None}, None),
}


@pytest.mark.parametrize("fields, text", NO_WRITER.values(), ids=NO_WRITER)
def test_a_run_naming_no_writer_is_kept_and_said_why(capsys, runs_dir, fields, text):
    folder = staged(runs_dir, fields, text=text)
    assert RunStore(runs_dir).get(RUN_ID).status in ("damaged", "interrupted")
    out = clean(capsys, "--yes")
    assert folder.is_dir()
    assert any(line.startswith(f"kept {RUN_ID} (") and "names no writer" in line
               for line in out)
    assert out[-1].startswith("nothing left behind")


def test_only_the_abandoned_of_several_staged_runs_is_removed(capsys, runs_dir):
    ended = staged(runs_dir, {**ended_writer(), **NEWER})
    live = ended.with_name("20990101-000000-exp-tiny-cafe")
    live.mkdir()
    (live / RUN_JSON).write_text(json.dumps({"run_id": live.name, **this_process(), **NEWER}))
    clean(capsys, "--yes")
    assert not ended.exists() and live.is_dir()
