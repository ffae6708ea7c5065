"""The store's listing index is a cache, never the source of truth: a listing reads no
record its index holds, any record changed since is read again, a missing, damaged or
hostile index is ignored, and tables read once are kept only while their file is the
file that was hashed."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from types import SimpleNamespace

import pandas as pd
import pytest

from tests.tiny import fake_info
from workbench.core.errors import ChecksumError
from workbench.harness import run_facts
from workbench.store import index as store_index
from workbench.store import runs as store_runs
from workbench.store.runs import RunStore
from workbench.store.schema import Table, columns, tables

MODEL = fake_info()
ONE = Table("t", "one integer column", columns(("a", "int", "a number")))


@dataclass(frozen=True)
class Cfg:
    n: int = 3
    seed: int = 7


def _store(tmp_path, n=3) -> tuple[RunStore, list[str]]:
    store = RunStore(tmp_path)
    ids = []
    for i in range(n):
        with store.start("exp", MODEL, Cfg(n=i), tables=tables(ONE)) as run:
            run.save_table("t", pd.DataFrame({"a": [i]}))
        ids.append(run.id)
    started = {i: json.loads((tmp_path / i / "run.json").read_text())["started_at"] for i in ids}
    return store, sorted(ids, key=lambda i: (started[i], i))  # as listed


@pytest.fixture
def settled(monkeypatch):
    """Rows and tables read at any time after their file's last change are trusted (the
    one-second guard against a change in the same clock tick is tested on its own)."""
    monkeypatch.setattr(store_index, "RACY_NS", 0)
    monkeypatch.setattr(store_runs, "RACY_NS", 0)


def test_a_listing_reads_no_record_its_index_holds(tmp_path, monkeypatch, settled):
    store, ids = _store(tmp_path)
    first = [(r.id, r.experiment, r.status, r.config, r.table_names()) for r in store.runs()]
    assert (tmp_path / store_index.INDEX).is_file()
    monkeypatch.setattr(store_runs, "_read_meta", lambda path: pytest.fail(f"read {path}"))
    listed = store.runs()
    assert [r.listing is not None for r in listed] == [True] * 3
    assert [(r.id, r.experiment, r.status, r.config, r.table_names()) for r in listed] == first
    assert sorted(r.config["n"] for r in listed) == [0, 1, 2] and [r.id for r in listed] == ids
    monkeypatch.undo()
    assert listed[1].meta.run_id == ids[1] and listed[1].listing is None  # read when asked


def test_a_record_changed_after_its_row_is_read_again(tmp_path, settled):
    store, ids = _store(tmp_path)
    store.runs()
    path = tmp_path / ids[0] / "run.json"
    text, stat = path.read_text(), path.stat()
    with open(path, "r+") as f:  # same length and inode, the old modification time put back
        f.write(text.replace('"seed": 7,', '"seed": 8,', 1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_ctime_ns != stat.st_ctime_ns or pytest.skip("ctime did not move")
    listed = {r.id: r for r in store.runs()}
    assert listed[ids[0]].status == "damaged" and listed[ids[1]].status == "complete"
    assert ids[0] not in store_index.read(tmp_path)  # a damaged run has no row


def test_a_row_read_in_the_clock_tick_of_its_change_is_not_trusted():
    st = SimpleNamespace(st_size=10, st_mtime_ns=5, st_ctime_ns=7_000_000_000, st_ino=3)
    row = SimpleNamespace(stat=store_index.stat_of(st))
    for read_ns, trusted in ((7_000_000_000, False), (7_999_999_999, False),
                             (8_000_000_000, True)):
        row.read_ns = read_ns
        assert store_index.Listing.current(row, st) is trusted


@pytest.mark.parametrize("body", [b"not json", b'{"version": 1}', b"[]",
                                  b'{"version": 2, "code": "x", "rows": []}'])
def test_a_damaged_index_is_ignored_and_rewritten(tmp_path, body, settled):
    store, ids = _store(tmp_path)
    (tmp_path / store_index.INDEX).write_bytes(body)
    assert [r.id for r in store.runs()] == ids
    assert sorted(store_index.read(tmp_path)) == sorted(ids)


def test_rows_that_lie_are_never_believed(tmp_path, settled):
    """An index whose rows name folders that do not exist, or hold another file's stat,
    lists only what the folders hold."""
    store, ids = _store(tmp_path)
    store.runs()
    index = json.loads((tmp_path / store_index.INDEX).read_text())
    ghost = dict(index["rows"][0], run_id=ids[0][:-4] + "beef")
    lying = dict(index["rows"][1], status="failed", stat=[1, 2, 3, 4])
    index["rows"] = [ghost, lying, index["rows"][2]]
    (tmp_path / store_index.INDEX).write_text(json.dumps(index))
    listed = store.runs()
    assert [r.id for r in listed] == ids
    assert [r.status for r in listed] == ["complete"] * 3


def test_an_index_from_other_code_is_rebuilt(tmp_path, monkeypatch, settled):
    store, ids = _store(tmp_path)
    store.runs()
    monkeypatch.setattr(store_index, "code_key", lambda: "other")
    assert store_index.read(tmp_path) == {}
    assert [r.id for r in store.runs()] == ids
    assert json.loads((tmp_path / store_index.INDEX).read_text())["code"] == "other"


def test_the_index_and_its_lock_are_never_followed_out_of_the_store(tmp_path, settled):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    store, ids = _store(tmp_path / "runs")
    (tmp_path / "runs" / store_index.LOCK).symlink_to(outside)
    (tmp_path / "runs" / store_index.INDEX).symlink_to(outside)
    assert [r.id for r in store.runs()] == ids
    assert outside.read_text() == "keep me"
    assert store_index.read(tmp_path / "runs") == {}  # the symlinked index is not read


def test_a_store_that_cannot_be_written_is_listed_without_an_index(tmp_path, monkeypatch):
    store, ids = _store(tmp_path)
    monkeypatch.setattr(store_index.filelock.FileLock, "acquire",
                        lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    assert [r.id for r in store.runs()] == ids
    assert not (tmp_path / store_index.INDEX).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_an_unchecked_listing_trusts_its_rows_and_opening_a_run_reads_it(tmp_path, settled):
    """A page's dropdown lists from rows alone; the run it opens is read in full, so a
    record damaged after it was indexed is caught there."""
    store, ids = _store(tmp_path)
    store.runs()
    (tmp_path / ids[1] / "run.json").write_text("{}")
    assert [r.status for r in store.runs(checked=False)] == ["complete"] * 3
    assert store.get(ids[1]).status == "damaged"
    assert {r.id: r.status for r in store.runs()} == {
        ids[0]: "complete", ids[1]: "damaged", ids[2]: "complete"}


def _unchecked(store: RunStore) -> list[tuple[str, str]]:
    return [(r.id, r.status) for r in store.runs(checked=False)]


def test_a_kept_unchecked_listing_sees_runs_added_removed_and_finishing(tmp_path, monkeypatch,
                                                                        settled):
    """A page's listing is kept between requests while the store folder and its index are
    unchanged, and nothing that changes what it lists is missed: each case below is
    compared with a listing made from nothing."""
    store, ids = _store(tmp_path)
    store.runs(checked=False)  # writes the index
    store.runs(checked=False)  # made from the rows, and kept
    assert str(tmp_path) in store_runs._UNCHECKED

    def fresh() -> list[tuple[str, str]]:
        store_runs._UNCHECKED.pop(str(tmp_path), None)
        return _unchecked(RunStore(tmp_path))

    reads = []
    read_meta = store_runs._read_meta
    monkeypatch.setattr(store_runs, "_read_meta",
                        lambda path: reads.append(path) or read_meta(path))
    assert _unchecked(store) == [(i, "complete") for i in ids] and reads == []  # kept: no read
    with store.start("exp", MODEL, Cfg(n=9)) as running:
        assert dict(_unchecked(store)) == {**dict.fromkeys(ids, "complete"),
                                           running.id: "running"}
        assert _unchecked(store) == fresh()
    assert dict(_unchecked(store))[running.id] == "complete"
    assert _unchecked(store) == fresh()
    shutil.rmtree(tmp_path / ids[0])
    assert {i for i, _ in _unchecked(store)} == {ids[1], ids[2], running.id}
    assert _unchecked(store) == fresh()


def test_a_damaged_run_in_a_kept_listing_is_read_every_time(tmp_path, settled):
    store, ids = _store(tmp_path)
    record = (tmp_path / ids[1] / "run.json").read_bytes()
    (tmp_path / ids[1] / "run.json").write_text("{}")
    store_runs._UNCHECKED.pop(str(tmp_path), None)
    store.runs(checked=False)
    assert dict(_unchecked(store))[ids[1]] == "damaged"
    assert str(tmp_path) in store_runs._UNCHECKED
    (tmp_path / ids[1] / "run.json").write_bytes(record)  # mended in place: the store
    assert dict(_unchecked(store))[ids[1]] == "complete"  # folder itself is unchanged


def test_a_listing_made_in_the_clock_tick_of_a_change_is_not_kept(tmp_path):
    store, _ = _store(tmp_path)  # the store folder changed a moment ago
    store.runs(checked=False)
    store.runs(checked=False)
    assert str(tmp_path) not in store_runs._UNCHECKED


def test_a_table_is_kept_only_while_its_file_is_the_one_hashed(tmp_path, monkeypatch, settled):
    store, ids = _store(tmp_path, n=1)
    run = store.get(ids[0])
    first = run.table("t")
    first.loc[0, "a"] = 99  # a caller's copy: the kept table is not changed
    reads = []
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: reads.append(1))
    assert run.table("t")["a"].tolist() == [0] and not reads  # kept: not parsed again
    monkeypatch.undo()
    path = tmp_path / ids[0] / "t.parquet"
    pd.DataFrame({"a": [5]}).to_parquet(path, index=False)  # another file, same name
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        run.table("t")


def test_a_table_read_in_the_clock_tick_of_its_change_is_read_again(tmp_path, monkeypatch):
    store, ids = _store(tmp_path, n=1)  # RACY_NS as it is: the files are a moment old
    run = store.get(ids[0])
    run.table("t")
    reads = []
    real = pd.read_parquet
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: reads.append(1) or real(*a, **k))
    run.table("t")
    assert reads == [1]


def test_run_kinds_are_read_from_their_cache_while_the_code_is_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv("WORKBENCH_EXPERIMENTS", raising=False)
    run_facts.run_kinds.cache_clear()
    try:
        kinds = run_facts.run_kinds()
        assert kinds["sweep"] is None and kinds["previous-token-heads"]["seed"] == 0
        assert (tmp_path / run_facts.KINDS_CACHE).is_file()
        run_facts.run_kinds.cache_clear()
        monkeypatch.setattr(run_facts, "_imported_kinds", lambda: pytest.fail("imported"))
        assert run_facts.run_kinds() == kinds
        run_facts.run_kinds.cache_clear()
        monkeypatch.setattr(run_facts, "_code_key", lambda: "other code")
        with pytest.raises(pytest.fail.Exception, match="imported"):
            run_facts.run_kinds()
    finally:
        run_facts.run_kinds.cache_clear()


def test_a_run_dropdown_offers_the_newest_runs_and_the_one_shown():
    from dashboards.components import controls

    runs = [SimpleNamespace(id=f"20260101-000000-exp-x-{i:04x}", experiment="exp",
                            model_name="x", config={}, started_at="2026-01-01T00:00:00",
                            interventions_text="")
            for i in range(controls.MAX_RUN_CHOICES + 5)]
    options = controls.run_options(runs, runs[-1].id)
    values = [o["value"] for o in options]
    assert values[:controls.MAX_RUN_CHOICES] == [r.id for r in runs[:controls.MAX_RUN_CHOICES]]
    assert values[controls.MAX_RUN_CHOICES] == runs[-1].id
    assert options[-1] == {"label": "type to search 4 older runs", "value": "",
                           "disabled": True}
    assert len(controls.run_options(runs[:3])) == 3
