"""The run store cannot be escaped and does not break on a bad file: hostile references,
malformed ``run.json``, escaping table paths, damaged recording indexes and checkpoints,
and ``--reuse`` of a run whose table was altered."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
from pathlib import Path

import pandas as pd
import pytest

from tests.recordings import write_format1
from tests.tiny import cli, fake_info
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.models import checkpoints, native
from workbench.recording.reader import Recording
from workbench.recording.writer import record
from workbench.store import provenance
from workbench.store.runs import INCOMPLETE, RUN_JSON, RunStore
from workbench.store.schema import Table, columns, tables

MODEL = fake_info()
ONE = Table("t", "one integer column", columns(("a", "int", "a number")))
TABLES = tables(ONE)


@pytest.fixture(autouse=True)
def quick_provenance(monkeypatch):
    """Skip torch and git lookups: these tests make many runs."""
    monkeypatch.setattr(provenance, "collect",
                        lambda: {"versions": {}, "git": None, "machine": None})


@pytest.fixture
def deadline():
    """Fail, rather than hang, if a reader opens ``/dev/zero`` or a FIFO it should refuse."""
    def expire(signum, frame):
        raise TimeoutError("a reader opened a file it should have refused")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def make_run(store: RunStore, n: int = 3, experiment: str = "exp"):
    with store.start(experiment, MODEL, {"n": n}, tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"a": range(n)}))
    return store.get(run.id)


def rewrite(run, **changes) -> None:
    path = run.path / RUN_JSON
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps(meta))


def _symlink(target):
    def apply(path: Path) -> None:
        path.unlink()
        path.symlink_to(target)
    return apply


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _altered(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "runs")


# ---- a malformed run.json damages that run only -------------------------------------------

def _meta(fn):
    def apply(meta: dict, folder: Path) -> str:
        fn(meta)
        return json.dumps(meta)
    return apply


def _table(**entry):
    def edit(meta):
        meta["tables"]["t"].update(entry)
        meta["tables"]["t"] = {k: v for k, v in meta["tables"]["t"].items() if v is not None}
    return _meta(edit)


MALFORMED = {
    "empty-object": (lambda m, f: "{}", "run.json has no 'run_id'"),
    "list": (lambda m, f: "[]", "run.json: expected an object, got []"),
    "empty-file": (lambda m, f: "", "run.json is not valid JSON"),
    "not-json": (lambda m, f: "{'run_id': oops", "run.json is not valid JSON"),
    "not-utf8": (lambda m, f: b"\xff\xfe{\x00".decode("latin-1"), "run.json is not valid JSON"),
    "nested-too-deep": (lambda m, f: "[" * 200_000, "run.json is not valid JSON"),
    "missing-run-id": (_meta(lambda m: m.pop("run_id")), "run.json has no 'run_id'"),
    "run-id-of-another-folder": (
        _meta(lambda m: m.update(run_id="20990101-000000-exp-tiny-beef")),
        "run_id '20990101-000000-exp-tiny-beef' does not match its folder"),
    "run-id-not-an-id": (_meta(lambda m: m.update(run_id="20990101-other")),
                         "run.json 'run_id': expected a run id"),
    "run-id-with-newline": (_meta(lambda m: m.update(run_id=m["run_id"] + "\nx")),
                            "run.json 'run_id': expected a run id"),
    "started-at-number": (_meta(lambda m: m.update(started_at=12345)),
                          "run.json 'started_at': expected a valid string, got 12345"),
    "unknown-status": (_meta(lambda m: m.update(status="done")),
                       "run.json 'status': expected 'running', 'complete'"),
    "status-missing": (_meta(lambda m: m.pop("status")), "run.json has no 'status'"),
    "config-is-list": (_meta(lambda m: m.update(config=[1, 2])),
                       "run.json 'config': expected an object, got [1, 2]"),
    "model-is-string": (_meta(lambda m: m.update(model="tiny")),
                        "run.json 'model': expected an object, got \"tiny\""),
    "model-without-name": (_meta(lambda m: m.update(model={"checksum": "x"})),
                           "run.json has no 'model.name'"),
    "tables-is-list": (_meta(lambda m: m.update(tables=["t"])),
                       "run.json 'tables': expected an object, got [\"t\"]"),
    "summary-not-strings": (_meta(lambda m: m.update(summary=[1, 2])),
                            "run.json 'summary.0': expected a valid string, got 1"),
    "pid-is-string": (_meta(lambda m: m.update(pid="123")),
                      "run.json 'pid': expected a valid integer, got \"123\""),
    "pid-beyond-pid-t": (_meta(lambda m: m.update(pid=4294967296)),
                         "run.json 'pid': expected at most 2147483647, got 4294967296"),
    "table-without-sha256": (_table(sha256=None), "run.json has no 'tables.t.sha256'"),
    "table-short-sha256": (_table(sha256="abc"),
                           "run.json 'tables.t.sha256': expected a SHA-256"),
    "table-rows-string": (_table(rows="3"), "run.json 'tables.t.rows': expected a valid integer"),
    "table-rows-negative": (_table(rows=-1), "run.json 'tables.t.rows': expected at least 0"),
    "table-file-number": (_table(file=7), "run.json 'tables.t.file': expected a valid string"),
    "table-file-dev-zero": (_table(file="/dev/zero"),
                            "run.json 'tables.t.file': expected a path inside its folder"),
    "table-file-etc-hostname": (_table(file="/etc/hostname"),
                                "run.json 'tables.t.file': expected a path inside its folder"),
    "table-file-climbs-out": (_table(file="../other/x.parquet"),
                              "run.json 'tables.t.file': expected a path inside its folder"),
    "unknown-field": (_meta(lambda m: m.update(colour="blue")),
                      "run.json has an unknown field 'colour'"),
}


def test_a_model_record_as_a_mapping_still_starts_a_run_with_a_deprecation_warning(store):
    with pytest.warns(DeprecationWarning, match="takes a ModelInfo"), \
            store.start("exp", MODEL.to_dict(), {"n": 1}) as run:
        pass
    assert store.get(run.id).meta.model == MODEL


@pytest.mark.parametrize("variant", MALFORMED, ids=list(MALFORMED))
def test_a_malformed_run_json_damages_only_its_run(store, variant, deadline):
    healthy, victim = make_run(store), make_run(store)
    mutate, message = MALFORMED[variant]
    meta = json.loads((victim.path / RUN_JSON).read_text())
    (victim.path / RUN_JSON).write_text(mutate(meta, victim.path), encoding="latin-1")

    listed = {r.id: r for r in store.runs()}
    assert set(listed) == {healthy.id, victim.id}
    damaged = listed[victim.id]
    assert damaged.status == "damaged" and message in damaged.meta.error
    assert "\n" not in damaged.meta.error
    assert [r.id for r in store.runs(status="damaged")] == [victim.id]
    assert store.get(victim.id).status == "damaged"  # served by id, as damaged
    with pytest.raises(WorkbenchError, match=f"run {victim.id} is damaged"):
        store.get(victim.id).table("t")
    # the healthy run is untouched by its neighbour
    assert store.latest(experiment="exp").id == healthy.id
    assert store.find_matching("exp", MODEL, {"n": 3}).id == healthy.id
    assert list(store.get(healthy.id).table("t").a) == [0, 1, 2]


@pytest.mark.parametrize("damage, message", [
    (_symlink("/dev/zero"), "leads outside"),
    (_symlink("run.json"), "Too many levels of symbolic links"),
    (_folder, "is not a regular file"),
], ids=["symlink-to-dev-zero", "symlink-loop", "a-folder"])
def test_a_run_json_that_is_not_a_file_damages_the_run_unread(store, deadline, damage, message):
    healthy, victim = make_run(store), make_run(store)
    damage(victim.path / RUN_JSON)
    run = store.get(victim.id)
    assert run.status == "damaged" and message in run.meta.error
    assert store.get(healthy.id).status == "complete"


def test_cli_lists_damaged_runs_and_shows_healthy_ones(capsys, runs_dir):
    store = RunStore(runs_dir)
    healthy, victim = make_run(store), make_run(store)
    (victim.path / RUN_JSON).write_text("[]")
    status, out, err = cli(capsys, "runs")
    assert status == 0 and "Traceback" not in err
    assert any(victim.id in line and "damaged" in line for line in out)
    status, out, err = cli(capsys, "show", healthy.id, "--table", "t")
    assert status == 0 and "Traceback" not in err
    assert any(line.startswith("status     complete") for line in out)


# ---- a table path must name a regular file inside its run folder ----------------------------

TABLE_FILES = {
    "symlink-to-dev-zero": (_symlink("/dev/zero"), WorkbenchError, "leads outside"),
    "symlink-to-etc-hostname": (_symlink("/etc/hostname"), WorkbenchError, "leads outside"),
    "symlink-to-other-run": (_symlink("../other/t.parquet"), WorkbenchError, "leads outside"),
    "symlink-loop": (lambda p: (p.unlink(), p.symlink_to(p.name)), WorkbenchError,
                     "Too many levels of symbolic links"),
    "fifo": (_fifo, WorkbenchError, "is not a regular file"),
    "folder": (_folder, WorkbenchError, "is not a regular file"),
    "missing-parquet": (lambda p: p.unlink(), ChecksumError, "t.parquet is missing"),
    "altered": (_altered, ChecksumError, "checksum mismatch"),
}


@pytest.mark.parametrize("variant", TABLE_FILES, ids=list(TABLE_FILES))
def test_a_bad_table_file_is_one_clear_error_before_any_read(store, variant, deadline):
    run = make_run(store)
    (store.root / "other").mkdir()
    (store.root / "other" / "t.parquet").write_bytes((run.path / "t.parquet").read_bytes())
    damage, error, message = TABLE_FILES[variant]
    damage(run.path / "t.parquet")
    with pytest.raises(error, match=re.escape(message)) as caught:
        store.get(run.id).table("t")
    assert "\n" not in str(caught.value) and run.id in str(caught.value)
    with pytest.raises(error, match=re.escape(message)):
        store.get(run.id).verify()


def test_garbage_with_a_matching_checksum_is_not_parquet(store):
    run = make_run(store)
    (run.path / "t.parquet").write_bytes(b"not parquet at all")
    from workbench.core.checksums import sha256_file

    rewrite(run, tables={"t": {"file": "t.parquet", "rows": 3,
                               "sha256": sha256_file(run.path / "t.parquet")}})
    with pytest.raises(WorkbenchError, match=r"table 't' of run \S+ is not readable Parquet"):
        store.get(run.id).table("t")


def test_a_symlink_inside_the_run_folder_is_followed(store):
    run = make_run(store)
    (run.path / "t.parquet").rename(run.path / "real.parquet")
    (run.path / "t.parquet").symlink_to("real.parquet")
    assert list(store.get(run.id).table("t").a) == [0, 1, 2]


# ---- a run reference resolves only to a folder directly inside the store --------------------

@pytest.fixture
def outside(tmp_path, store):
    """A healthy run, and a copy of it outside the store (same id in its run.json)."""
    run = make_run(store)
    away = tmp_path / "elsewhere" / run.id
    shutil.copytree(run.path, away)
    return run, away


REFS = {
    "absolute-outside": lambda root, run, away: str(away),
    "absolute-path-object": lambda root, run, away: away,
    "relative-outside": lambda root, run, away: f"elsewhere/{run.id}",
    "dotdot-out-of-store": lambda root, run, away: f"{root}/../elsewhere/{run.id}",
    "dotdot-back-into-store": lambda root, run, away: f"{root}/../runs/{run.id}",
    "dotdot-alone": lambda root, run, away: "..",
    "the-store-itself": lambda root, run, away: str(root),
    "the-staging-folder": lambda root, run, away: str(root / INCOMPLETE),
    "filesystem-root": lambda root, run, away: "/",
    "etc": lambda root, run, away: "/etc",
    "grandchild": lambda root, run, away: f"{root}/{run.id}/sub",
}


@pytest.mark.parametrize("variant", REFS, ids=list(REFS))
def test_a_reference_outside_the_store_is_refused(store, outside, tmp_path, monkeypatch, variant):
    run, away = outside
    (run.path / "sub").mkdir()
    (run.path / "sub" / RUN_JSON).write_text((run.path / RUN_JSON).read_text())
    monkeypatch.chdir(tmp_path)
    ref = REFS[variant](store.root, run, away)
    with pytest.raises(WorkbenchError, match="outside the run store") as caught:
        store.get(ref)
    assert "\n" not in str(caught.value)


def test_a_symlinked_run_folder_pointing_outside_is_neither_listed_nor_served(store, outside):
    run, away = outside
    (store.root / "evil").symlink_to(away, target_is_directory=True)
    (store.root / INCOMPLETE / "evil").symlink_to(away, target_is_directory=True)
    assert [r.id for r in store.runs()] == [run.id]
    for ref in (store.root / "evil", str(store.root / INCOMPLETE / "evil")):
        with pytest.raises(WorkbenchError, match="outside the run store"):
            store.get(ref)
    with pytest.raises(WorkbenchError, match="no run 'evil'"):
        store.get("evil")
    (store.root / "loop").symlink_to("loop")  # a loop is neither listed nor a traceback
    assert [r.id for r in store.runs()] == [run.id]
    with pytest.raises(WorkbenchError, match=r"no run at \S+loop"):
        store.get(store.root / "loop")


def test_a_symlinked_staging_folder_is_not_listed(store, tmp_path):
    make_run(store)
    staged = tmp_path / "staged"
    (store.root / INCOMPLETE).rename(staged)
    (store.root / INCOMPLETE).symlink_to(staged, target_is_directory=True)
    away = staged / "20990101-x"
    away.mkdir()
    (away / RUN_JSON).write_text(json.dumps({"run_id": "20990101-x"}))
    assert "20990101-x" not in [r.id for r in store.runs()]
    with pytest.raises(WorkbenchError, match="outside the run store"):
        store.get(store.root / INCOMPLETE / "20990101-x")


def test_folder_references_inside_the_store_still_work(store, tmp_path, monkeypatch):
    run = make_run(store)
    monkeypatch.chdir(tmp_path)
    for ref in (run.id, run.id[:-2], f"runs/{run.id}", store.root / run.id,
                str((store.root / run.id).resolve())):
        found = store.get(ref)
        assert found.id == run.id and found.path == store.root / run.id
    staged = store.root / INCOMPLETE / "20990101-000000-exp-tiny-dead"
    staged.mkdir()
    (staged / RUN_JSON).write_text(json.dumps({
        "run_id": staged.name, "experiment": "exp", "status": "running",
        "started_at": "2099-01-01T00:00:00+00:00",
        "config": {}, "model": None, "pid": None}))
    assert store.get(f"{INCOMPLETE}/{staged.name}").status == "interrupted"
    assert store.get(staged).path == staged


def test_cli_show_refuses_a_path_outside_the_store(capsys, runs_dir, tmp_path):
    run = make_run(RunStore(runs_dir))
    shutil.copytree(run.path, tmp_path / "copy")
    status, _, err = cli(capsys, "show", str(tmp_path / "copy"))
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("error: ") and "outside the run store" in err
    assert "Traceback" not in err


# ---- a staged folder never looks complete --------------------------------------------------

def test_a_complete_status_under_incomplete_is_not_believed(store):
    run = make_run(store)
    staged = store.root / INCOMPLETE / run.id
    run.path.rename(staged)
    rewrite(store.get(staged), pid=None)
    assert store.get(run.id).status == "interrupted"
    assert store.latest() is None and store.find_matching("exp", MODEL, {"n": 3}) is None
    rewrite(store.get(staged), pid=os.getpid())  # its process is still finishing it
    assert store.get(run.id).status == "running"
    assert store.runs(status="complete") == []


# ---- --reuse re-verifies what it returns ---------------------------------------------------

def test_reuse_skips_a_run_whose_table_was_altered(store, caplog):
    older, newer = make_run(store), make_run(store)
    rewrite(older, started_at="2000-01-01T00:00:00+00:00")
    assert store.find_matching("exp", MODEL, {"n": 3}).id == newer.id
    _altered(newer.path / "t.parquet")
    with caplog.at_level(logging.WARNING, logger="workbench.store.runs"):
        assert store.find_matching("exp", MODEL, {"n": 3}).id == older.id
    assert f"not reusing run {newer.id}: checksum mismatch" in caplog.text
    (older.path / "t.parquet").unlink()
    assert store.find_matching("exp", MODEL, {"n": 3}) is None


def test_cli_reuse_runs_again_when_the_stored_table_was_altered(capsys, runs_dir, llama_folder):
    args = ("run", "head-overview", "--model", str(llama_folder), "--set", "n_boot=20",
            "--reuse")
    status, out, _ = cli(capsys, *args)
    assert status == 0
    first = RunStore(runs_dir).get(out[-1])
    status, out, _ = cli(capsys, *args)
    assert status == 0 and RunStore(runs_dir).get(out[-1]).id == first.id  # reused
    _altered(first.path / first.meta.tables["head_scores"].file)
    status, out, err = cli(capsys, *args)
    assert status == 0 and "Traceback" not in err
    second = RunStore(runs_dir).get(out[-1])
    assert second.id != first.id and second.status == "complete"
    second.verify()


def _alter_recording(run_dir: Path) -> None:
    _altered(run_dir / "example" / "attn" / "L001.bin")


def _alter_recording_chunk(run_dir: Path) -> None:
    _altered(run_dir / "example_zarr" / "recording.zarr" / "attn" / "L001" / "c" / "1" / "0"
             / "0" / "0")


def _alter_checkpoint(run_dir: Path) -> None:
    _altered(checkpoints.step_dir(run_dir, 1, 0) / checkpoints.WEIGHTS)


@pytest.mark.parametrize("alter, message", [
    (_alter_recording, "checksum mismatch for"),
    (_alter_recording_chunk, "checksum mismatch for chunk file"),
    (_alter_checkpoint, "model.safetensors does not match the SHA-256"),
], ids=["recording-block", "recording-chunk", "checkpoint-weights"])
def test_reuse_skips_a_run_whose_recording_or_checkpoint_was_altered(
        store, recorded, recorded_zarr, trained, caplog, alter, message):
    from workbench.harness.experiment import verify_stored_files

    def make(started_at):
        with store.start("exp", MODEL, {"n": 3}, tables=TABLES) as run:
            run.save_table("t", pd.DataFrame({"a": range(3)}))
            shutil.copytree(recorded, run.dir / "example")
            shutil.copytree(recorded_zarr, run.dir / "example_zarr")
            shutil.copytree(trained / checkpoints.TOKENIZER, run.dir / checkpoints.TOKENIZER)
            shutil.copytree(trained / checkpoints.CHECKPOINTS, run.dir / checkpoints.CHECKPOINTS)
        rewrite(store.get(run.id), started_at=started_at)
        return store.get(run.id)

    older, newer = make("2000-01-01T00:00:00+00:00"), make("2001-01-01T00:00:00+00:00")
    assert store.find_matching("exp", MODEL, {"n": 3}, check=verify_stored_files).id == newer.id
    alter(newer.path)
    with caplog.at_level(logging.WARNING, logger="workbench.store.runs"):
        found = store.find_matching("exp", MODEL, {"n": 3}, check=verify_stored_files)
    assert found.id == older.id
    assert f"not reusing run {newer.id}" in caplog.text and message in caplog.text


# ---- a damaged recording index is one clear error ------------------------------------------

@pytest.fixture(scope="module")
def recorded_zarr(tmp_path_factory, llama):
    folder = tmp_path_factory.mktemp("recorded") / "recording"
    record(llama, [Prompt(text="the cat sat on the mat"), Prompt(text="bread")], folder)
    return folder


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, recorded_zarr):
    """A format-1 recording (index.json + block files), whose index is checked field by
    field (format 2's arrays are checked in tests/unit/test_recording_format.py)."""
    folder = tmp_path_factory.mktemp("recorded1") / "recording"
    return write_format1(Recording.open(recorded_zarr), folder)


def _index(fn):
    def apply(root: Path) -> None:
        index = json.loads((root / "index.json").read_text())
        fn(index)
        (root / "index.json").write_text(json.dumps(index))
    return apply


def _raw_index(text):
    def apply(root: Path) -> None:
        (root / "index.json").write_text(text)
    return apply


def _file(rel, how):
    def apply(root: Path) -> None:
        how(root / rel)
    return apply


def _extra_file(rel):
    def edit(index):
        index["files"][rel] = dict(index["files"]["attn/L000.bin"])
    return edit


def _block(value):
    def edit(index):
        index["blocks"]["attn/0"][1] = value
    return edit


INDEXES = {
    "empty-object": (_raw_index("{}"), "index.json has no 'format_version'"),
    "list": (_raw_index("[]"), "index.json: expected an object, got []"),
    "not-json": (_raw_index("{nope"), "is not valid JSON"),
    "n-layers-string": (_index(lambda i: i.update(n_layers="2")),
                        "index.json 'n_layers': expected a valid integer, got \"2\""),
    "no-prompts": (_index(lambda i: i.pop("prompts")), "index.json has no 'prompts'"),
    "empty-prompts": (_index(lambda i: i.update(prompts=[])),
                      "index.json 'prompts': expected at least 1 item(s), got []"),
    "token-ids-strings": (_index(lambda i: i["prompts"][0].update(token_ids=["a"])),
                          "index.json 'prompts.0.token_ids.0': expected a valid integer"),
    "tokens-length-mismatch": (_index(lambda i: i["prompts"][1]["tokens"].append("x")),
                               "index.json 'prompts.1': 'tokens' has 4 strings for 3 token"),
    "files-not-object": (_index(lambda i: i.update(files=[])),
                         "index.json 'files': expected an object, got []"),
    "file-size-string": (_index(lambda i: i["files"]["attn/L000.bin"].update(size="9")),
                         "index.json 'files.attn/L000.bin.size': expected a valid integer"),
    "file-not-listed": (_index(lambda i: i["files"].pop("attn/L001.bin")),
                        "data file attn/L001.bin is not listed"),
    "block-missing": (_index(lambda i: i["blocks"].pop("attn/1")),
                      "'blocks' has no attn/1 entry for each prompt"),
    "block-dtype-object": (_index(_block([0, "object"])),
                           "index.json 'blocks.attn/0.1.1': expected 'float16' or 'float32'"),
    "block-beyond-file": (_index(_block([10**9, "float16"])),
                          "a block of attn/0 lies beyond the end of attn/L000.bin"),
    "file-path-etc-hostname": (_index(_extra_file("/etc/hostname")),
                               "index.json 'files./etc/hostname': expected a path inside"),
    "file-path-climbs-out": (_index(_extra_file("../../x.bin")),
                             "index.json 'files.../../x.bin': expected a path inside"),
    "data-file-symlink-to-dev-zero": (_file("attn/L000.bin", _symlink("/dev/zero")),
                                      "leads outside"),
    "data-file-fifo": (_file("attn/L000.bin", _fifo), "is not a regular file"),
    "data-file-missing": (_file("attn/L000.bin", lambda p: p.unlink()),
                          "attn/L000.bin is missing"),
}


@pytest.mark.parametrize("variant", INDEXES, ids=list(INDEXES))
def test_a_damaged_recording_index_is_one_clear_error(recorded, tmp_path, variant, deadline):
    root = tmp_path / "recording"
    shutil.copytree(recorded, root)
    Recording.open(root)  # the copy is healthy
    damage, message = INDEXES[variant]
    damage(root)
    # a WorkbenchError naming the file, never a KeyError or TypeError
    with pytest.raises(WorkbenchError, match=re.escape(message)) as caught:
        Recording.open(root)
    assert "\n" not in str(caught.value) and str(root) in str(caught.value)


def test_a_recording_folder_symlinked_out_of_its_run_is_refused(store, recorded, tmp_path):
    run = make_run(store)
    shutil.copytree(recorded, tmp_path / "elsewhere")
    (run.path / "recording").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    for ref in (run.path, run.path / "recording"):
        with pytest.raises(WorkbenchError, match="leads outside its run folder"):
            Recording.open(ref)
    Recording.open(tmp_path / "elsewhere")  # on its own, outside any run, it opens


# ---- a damaged checkpoint.json is one clear error ------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    tokenizer.save_pretrained(str(run_dir / checkpoints.TOKENIZER))
    spec = native.ModelSpec(n_layers=1, d_model=16, n_heads=2, n_ctx=32,
                            d_vocab=len(tokenizer), seed=3)
    checkpoints.save(run_dir, native.build_bridge(spec, tokenizer), spec, step=0, tokens=0)
    return run_dir


def _ckpt(fn):
    def apply(folder: Path) -> None:
        meta = json.loads((folder / checkpoints.META).read_text())
        fn(meta)
        (folder / checkpoints.META).write_text(json.dumps(meta))
    return apply


def _raw_ckpt(text):
    def apply(folder: Path) -> None:
        (folder / checkpoints.META).write_text(text)
    return apply


def _hash_entry(rel):
    def edit(meta):
        meta["sha256"][rel] = meta["sha256"][checkpoints.WEIGHTS]
    return edit


CHECKPOINTS = {
    "empty-object": (_raw_ckpt("{}"), "is not a workbench checkpoint"),
    "list": (_raw_ckpt("[]"), "is not a workbench checkpoint"),
    "not-json": (_raw_ckpt("{nope"), "is not a readable checkpoint"),
    "missing-step": (_ckpt(lambda m: m.pop("step")), "checkpoint.json has no 'step'"),
    "step-string": (_ckpt(lambda m: m.update(step="0")), "'step': expected a valid integer"),
    "sha256-list": (_ckpt(lambda m: m.update(sha256=[])), "'sha256': expected an object, got []"),
    "model-not-a-spec": (_ckpt(lambda m: m.update(model={"n_layers": 1})),
                         "'model': not a model spec"),
    "weights-not-listed": (_ckpt(lambda m: m["sha256"].pop(checkpoints.WEIGHTS)),
                           "'sha256': does not list model.safetensors"),
    "digest-short": (_ckpt(lambda m: m["sha256"].update({checkpoints.WEIGHTS: "abc"})),
                     "'sha256.model.safetensors': expected a SHA-256"),
    "hashed-file-absolute": (_ckpt(_hash_entry("/etc/hostname")),
                             "'/etc/hostname' is not a relative path"),
    "hashed-file-climbs-out": (_ckpt(_hash_entry("../../../../outside.bin")), "leads outside"),
    "tokenizer-absolute": (_ckpt(lambda m: m.update(tokenizer="/etc")),
                           "tokenizer: '/etc' is not a relative path"),
    "tokenizer-climbs-out": (_ckpt(lambda m: m.update(tokenizer="../../../..")),
                             "tokenizer: '../../../..' leads outside"),
    "weights-symlink-outside": (_file(checkpoints.WEIGHTS, _symlink("/etc/hostname")),
                                "leads outside"),
}


@pytest.mark.parametrize("variant", CHECKPOINTS, ids=list(CHECKPOINTS))
def test_a_damaged_checkpoint_json_is_one_clear_error(trained, tmp_path, variant, deadline):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir, symlinks=True)
    folder = checkpoints.step_dir(run_dir, 1, 0)
    checkpoints.verify(folder)  # the copy is healthy
    damage, message = CHECKPOINTS[variant]
    damage(folder)
    # a WorkbenchError naming the file, never a KeyError or TypeError
    with pytest.raises(WorkbenchError, match=re.escape(message)) as caught:
        checkpoints.verify(folder)
    assert "\n" not in str(caught.value) and str(folder) in str(caught.value)
