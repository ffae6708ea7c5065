"""One stored value of the wrong type or out of range damages only its own run: every
command that lists or reads the store, and every dashboard page, keeps working, and the
damaged run is named with its field."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from dashboards.app import create_app
from tests.tiny import cli, fake_info
from workbench.store import provenance
from workbench.store.runs import RUN_JSON, RunStore
from workbench.store.schema import Table, columns, tables

TABLES = tables(Table("t", "one integer column", columns(("a", "int", "a number"))))

BAD_VALUES = {
    "pid-beyond-pid-t": ("pid", 4294967296, "'pid': expected at most 2147483647"),
    "pid-negative": ("pid", -5, "'pid': expected at least 1"),
    "pid-a-float": ("pid", 12.5, "'pid': expected a valid integer"),
    "pid-started-negative": ("pid_started", -1.0, "'pid_started': expected at least 0"),
    "started-at-not-a-time": ("started_at", "yesterday", "'started_at': expected an ISO 8601"),
    "ended-at-a-number": ("ended_at", 3, "'ended_at': expected a valid string"),
    "seed-a-string": ("seed", "0", "'seed': expected a valid integer"),
    "summary-a-string": ("summary", "done", "'summary': expected a valid array"),
    "summary-nested": ("summary", [["a"]], "'summary.0': expected a valid string"),
    "versions-a-list": ("versions", [], "'versions': expected an object"),
    "model-layers-zero": ("model", {**fake_info().to_data(), "n_layers": 0},
                          "'model.n_layers': expected at least 1"),
    "model-dtype-unknown": ("model", {**fake_info().to_data(), "dtype": "int4"},
                            "'model.dtype': expected 'float32', 'bfloat16' or 'float16'"),
    "interventions-a-list": ("interventions", [], "'interventions': expected an object"),
    "machine-cpus-string": ("machine", {"platform": "x", "cpu_count": "2",
                                        "torch_threads": 2, "argv": []},
                            "'machine.cpu_count': expected a valid integer"),
    "cells-not-run-ids": ("cells", ["../x"], "'cells.0'"),
    "recordings-escaping": ("recordings", {"../x": "0" * 64},
                            "'recordings.../x': expected a path inside its folder"),
}
COMMANDS = {
    "runs": lambda healthy: ["runs"],
    "show-healthy": lambda healthy: ["show", healthy],
    "verify-healthy": lambda healthy: ["verify", healthy],
    "reproduce-list": lambda healthy: ["reproduce", "--list"],
    "run-help": lambda healthy: ["run", "head-overview", "--help"],
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    provenance_collect = provenance.collect
    provenance.collect = lambda: {"versions": {}, "git": None, "machine": None}
    try:
        root = tmp_path_factory.mktemp("one-bad") / "runs"
        store = RunStore(root)
        ids = []
        for n in (3, 4):
            with store.start("head-overview", fake_info(), {"n": n}, tables=TABLES) as run:
                run.save_table("t", pd.DataFrame({"a": range(n)}))
            ids.append(run.id)
    finally:
        provenance.collect = provenance_collect
    return root, ids


@pytest.fixture(params=list(BAD_VALUES))
def damaged(request, pristine, tmp_path, monkeypatch):
    root, (healthy, victim) = pristine
    copy = tmp_path / "runs"
    shutil.copytree(root, copy)
    key, value, message = BAD_VALUES[request.param]
    meta = json.loads((copy / victim / RUN_JSON).read_text())
    meta[key] = value
    (copy / victim / RUN_JSON).write_text(json.dumps(meta))
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", str(copy))
    return copy, healthy, victim, message


def test_the_damaged_run_is_named_with_its_field(damaged):
    root, healthy, victim, message = damaged
    runs = {r.id: r for r in RunStore(root).runs()}
    assert runs[healthy].status == "complete"
    assert runs[victim].status == "damaged" and message in runs[victim].meta.error


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_keeps_working(capsys, damaged, command):
    _, healthy, victim, _ = damaged
    status, out, err = cli(capsys, *COMMANDS[command](healthy))
    assert status == 0, err
    assert "Traceback" not in err and "internal error" not in err
    if command == "runs":
        listed = {line.split()[0]: line for line in out if line[:1].isdigit()}
        assert "damaged" in listed[victim] and "complete" in listed[healthy]


def test_every_page_keeps_working(damaged):
    root, _, victim, _ = damaged
    client = create_app(root).server.test_client()
    for path in ("/", "/overview", "/heads", "/recording", "/sinks", "/pruning"):
        response = client.get(path)
        assert response.status_code == 200, path
    assert client.get(f"/overview?run={victim}").status_code == 200


WRITER = """
import sys
sys.path.insert(0, sys.argv[3])
from tests.tiny import fake_info
from workbench.store import provenance
from workbench.store.runs import RunStore
provenance.collect = lambda: {"versions": {}, "git": None, "machine": None}
store = RunStore(sys.argv[1])
for i in range(int(sys.argv[2])):
    with store.start("exp", fake_info(), {"i": i}) as run:
        run.update(summary=[str(i)])
"""


def test_listing_while_two_processes_finish_runs_sees_none_damaged(tmp_path):
    """Two processes finish runs as fast as they can while the store is listed again and
    again: a run is seen staged or finished, never damaged, and none is lost at the end."""
    import subprocess
    import sys

    from workbench.core.paths import REPO_ROOT

    root, per_writer = tmp_path / "runs", 25
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(per_writer),
                                 str(REPO_ROOT)]) for _ in range(2)]
    store, seen = RunStore(root), 0
    while any(w.poll() is None for w in writers):
        listed = store.runs()
        seen += len(listed)
        assert [r.id for r in listed if r.status == "damaged"] == []
    assert [w.returncode for w in writers] == [0, 0]
    final = store.runs()
    assert len(final) == 2 * per_writer and {r.status for r in final} == {"complete"}
    assert seen > 0


def test_a_new_run_never_takes_an_id_staged_or_finished_elsewhere(tmp_path, monkeypatch):
    """Two processes starting runs in the same second can draw the same suffix: the id
    another run is staging and the id of a finished run are both drawn again."""
    from workbench.store import runs

    store = RunStore(tmp_path / "runs")
    (tmp_path / "runs" / runs.INCOMPLETE / "p-aaaa").mkdir(parents=True)  # being staged
    (tmp_path / "runs" / "p-bbbb").mkdir()                                # finished
    drawn = iter(["aaaa", "bbbb", "cccc"])
    monkeypatch.setattr(runs.secrets, "token_hex", lambda n: next(drawn))
    run_id, staging = store._claim_id("p")
    assert (run_id, staging) == ("p-cccc", tmp_path / "runs" / runs.INCOMPLETE / "p-cccc")
    assert staging.is_dir() and (tmp_path / "runs" / runs.INCOMPLETE / "p-aaaa").is_dir()
    assert not (tmp_path / "runs" / runs.INCOMPLETE / "p-bbbb").exists()  # given back
