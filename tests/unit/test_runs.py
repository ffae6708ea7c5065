"""A run is complete only once it is complete; failures leave a record saying why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pandas as pd
import pytest

from tests.tiny import fake_info
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.store.runs import INCOMPLETE, RunStore, process_started
from workbench.store.schema import SchemaError, Table, columns, tables

MODEL = fake_info()
HEADS = Table("head_scores", "a score per head", columns(
    ("layer", "int", "layer"), ("head", "int", "head"), ("metric", "str", "which score"),
    ("score", "float", "the score")))
ONE = Table("t", "one integer column", columns(("a", "int", "a number")))
TABLES = tables(HEADS, ONE)


@dataclass(frozen=True)
class Cfg:
    n: int = 3
    seed: int = 7


def test_complete_run_has_provenance_and_checked_tables(tmp_path):
    store = RunStore(tmp_path)
    df = pd.DataFrame({"layer": [0, 1], "head": [0, 0], "metric": "x", "score": [0.5, 0.25]})
    with store.start("exp", MODEL, Cfg(), tables=TABLES) as run:
        assert run.dir.parent.name == INCOMPLETE  # not visible as a finished run yet
        run.save_table("head_scores", df)
    done = store.get(run.id)
    assert done.status == "complete" and done.path == tmp_path / run.id
    meta = json.loads((done.path / "run.json").read_text())
    assert meta["config"] == {"n": 3, "seed": 7} and meta["seed"] == 7
    assert meta["model"] == MODEL.to_data()
    assert meta["versions"]["torch"] and meta["started_at"] <= meta["ended_at"]
    pd.testing.assert_frame_equal(done.table("head_scores"), df)
    assert not list((tmp_path / INCOMPLETE).iterdir())


def test_exception_and_ctrl_c_leave_failed_runs_with_the_error(tmp_path):
    store = RunStore(tmp_path)
    with pytest.raises(RuntimeError), store.start("exp", MODEL, Cfg(), tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"a": [1]}))
        raise RuntimeError("out of cheese")
    failed = store.get(run.id)
    assert failed.status == "failed"
    assert failed.meta.error == "RuntimeError: out of cheese"
    assert "out of cheese" in failed.meta.traceback
    with pytest.raises(KeyboardInterrupt), store.start("exp", MODEL, Cfg()) as run2:
        raise KeyboardInterrupt
    assert store.get(run2.id).status == "failed"
    assert store.latest(experiment="exp") is None  # no complete run to find
    assert [r.status for r in store.runs()] == ["failed", "failed"]


def test_killed_process_leaves_an_interrupted_run(tmp_path):
    code = (
        "import time; from workbench.store.runs import RunStore\n"
        f"with RunStore({str(tmp_path)!r}).start('exp', None, {{}}) as run:\n"
        "    print(run.id, flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    run_id = proc.stdout.readline().strip()
    assert RunStore(tmp_path).get(run_id).status == "running"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run = RunStore(tmp_path).get(run_id)
    assert run.status == "interrupted" and "without finishing" in run.meta.error
    assert len(RunStore(tmp_path).remove_leftovers()) == 1


def test_corrupt_table_is_detected(tmp_path):
    store = RunStore(tmp_path)
    with store.start("exp", MODEL, Cfg(), tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"a": range(100)}))
    path = tmp_path / run.id / "t.parquet"
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(ChecksumError):
        store.get(run.id).table("t")
    with pytest.raises(WorkbenchError, match="no table 'nope'; its tables: t"):
        store.get(run.id).table("nope")


def test_lookup_by_prefix_and_unknown_ids(tmp_path):
    store = RunStore(tmp_path)
    with store.start("exp", MODEL, Cfg()) as run:
        pass
    assert store.get(run.id[:-2]).id == run.id
    with pytest.raises(WorkbenchError, match="no run 'zzz'.*most recent: " + run.id):
        store.get("zzz")


def test_find_matching_needs_same_config_and_weights(tmp_path):
    store = RunStore(tmp_path)
    with store.start("exp", MODEL, Cfg()) as run:
        pass
    time.sleep(0.01)
    assert store.find_matching("exp", MODEL, Cfg()).id == run.id
    assert store.find_matching("exp", MODEL, Cfg(n=4)) is None
    assert store.find_matching("exp", MODEL.replace(checksum="other"), Cfg()) is None
    assert store.find_matching("other", MODEL, Cfg()) is None


@pytest.mark.parametrize("name, df, message", [
    ("nope", pd.DataFrame({"a": [1]}), "declares no table 'nope'; declared: head_scores, t"),
    ("t", pd.DataFrame({"b": [1]}), "table t: missing a; undeclared b"),
    ("t", pd.DataFrame({"a": [1.5]}), "column a is declared int but holds float64"),
    ("head_scores", pd.DataFrame({"layer": [0], "head": [0], "metric": [1], "score": [0.5]}),
     "column metric is declared str"),
    ("head_scores", pd.DataFrame({"layer": [0], "head": [0], "metric": ["m"], "score": [True]}),
     "column score is declared float but holds bool"),
])
def test_a_table_that_does_not_match_its_declaration_fails_the_run(tmp_path, name, df, message):
    store = RunStore(tmp_path)
    with pytest.raises(SchemaError, match=message), \
            store.start("exp", MODEL, Cfg(), tables=TABLES) as run:
        run.save_table(name, df)
    assert store.get(run.id).status == "failed"
    assert not (store.get(run.id).path / f"{name}.parquet").exists()


def test_declared_kinds_accept_missing_values_and_integer_floats(tmp_path):
    nullable = Table("n", "kinds with missing values", columns(
        ("i", "int", "nullable integers"), ("x", "float", "integers where floats are declared"),
        ("s", "str", "strings or missing"), ("b", "bool", "booleans or missing")))
    nullable.check(pd.DataFrame({"i": pd.array([1, None], dtype="Int64"), "x": [1, 2],
                                 "s": ["a", None], "b": [True, None]}))
    with pytest.raises(SchemaError, match="column s is declared str"):
        nullable.check(pd.DataFrame({"i": [1], "x": [1.0], "s": [3], "b": [True]}))


def test_an_empty_table_still_matches_its_declaration():
    for table in TABLES.values():
        empty = table.empty()
        table.check(empty)
        assert list(empty.columns) == table.names and len(empty) == 0


def test_a_column_declared_after_a_run_was_stored_reads_as_its_absent_value():
    """A stored table lacking a column its declaration names ``absent`` for gets it back
    with that value; one lacking any other column is refused."""
    from workbench.store.schema import Column, with_legacy_columns

    later = Table("t", "a column added later", (
        *columns(("a", "int", "a number")),
        Column("group", "str", "which group; before groups, every row was 'all'", absent="all"),
        Column("null", "float", "a baseline; NaN: not measured", absent=float("nan"))))
    old = pd.DataFrame({"a": [1, 2]})
    got = with_legacy_columns(old, later, None)
    later.check(got)
    assert list(got.group) == ["all", "all"] and got["null"].isna().all()
    assert list(old.columns) == ["a"]  # the frame read is not changed
    strict = Table("s", "no column added later", columns(("a", "int", "a"), ("b", "str", "b")))
    with pytest.raises(SchemaError, match="missing b"):
        strict.check(with_legacy_columns(old, strict, None))


def test_a_reused_pid_does_not_keep_a_dead_run_running(tmp_path):
    """A staged run whose pid now belongs to another process (this one, started at another
    time) is interrupted; with the start time of this process it is running."""
    store = RunStore(tmp_path)
    folder = tmp_path / INCOMPLETE / "20990101-000000-exp-tiny-beef"
    folder.mkdir(parents=True)
    meta = {"run_id": folder.name, "experiment": "exp", "status": "running", "config": {},
            "started_at": "2099-01-01T00:00:00+00:00", "model": None, "pid": os.getpid()}
    for started, status in [(process_started() - 3600, "interrupted"),
                            (process_started(), "running"), (None, "running")]:
        (folder / "run.json").write_text(json.dumps({**meta, "pid_started": started}))
        assert store.get(folder.name).status == status, started


def test_a_run_that_finishes_while_the_store_is_listed_is_never_damaged(tmp_path, monkeypatch):
    """The listing saw a run staged, and it moved into place before it was read: it is
    listed once, as the finished run, whether or not the store's own listing saw it too."""
    store = RunStore(tmp_path)
    with store.start("exp", MODEL, Cfg()) as run:
        pass
    staged, done = tmp_path / INCOMPLETE / run.id, tmp_path / run.id
    for seen in ([staged], [staged, done]):
        found = [(path == staged, str(path), os.lstat(done / "run.json")) for path in seen]
        monkeypatch.setattr(RunStore, "_run_folders", lambda self, *_, found=found: found)
        listed = [(r.id, r.status, r.path) for r in store.runs()]
        assert listed == [(run.id, "complete", done)], seen


def test_a_whole_id_opens_its_folder_without_listing_the_store(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    with store.start("exp", MODEL, Cfg(), tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"a": [1]}))
    (tmp_path / "outside").mkdir()
    linked = f"{run.id[:-4]}beef"
    (tmp_path / linked).symlink_to(tmp_path / run.id)  # a folder that links elsewhere
    monkeypatch.setattr(RunStore, "runs", lambda *a, **k: pytest.fail("listed the store"))
    assert store.by_id(run.id).path == tmp_path / run.id
    assert store.get(run.id).status == "complete"
    for not_whole in (run.id[:12], str(tmp_path / run.id), f"../{run.id}", "", linked):
        assert store.by_id(not_whole) is None
    monkeypatch.undo()
    with pytest.raises(WorkbenchError, match="no run"):
        store.get(linked)  # the listing does not follow the symlink either


def test_a_record_changed_in_place_is_read_again(tmp_path):
    """A ``run.json`` rewritten in place (same inode, same size) is seen at once: records
    are kept by their content, never by the file's name or times."""
    store = RunStore(tmp_path)
    with store.start("exp", MODEL, Cfg(), tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"a": [1]}))
    path = tmp_path / run.id / "run.json"
    assert store.get(run.id).meta.seed == 7
    text = path.read_text()
    stat = path.stat()
    with open(path, "r+") as f:  # same length, same inode, the old times put back
        f.write(text.replace('\n  "seed": 7,', '\n  "seed": 8,'))  # the record's, not the config's
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = store.get(run.id)
    assert again.status == "damaged" and "is not the config's seed" in again.meta.error
