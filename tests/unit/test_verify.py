"""`workbench verify` re-hashes models, runs (tables, recordings, checkpoints) and
recording folders: a clean store is ok, one flipped byte is named, bad names exit 2, and no
model is ever loaded."""

from __future__ import annotations

import importlib
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.tiny import cli, fake_info
from workbench.harness.verify import Check, damage_summary
from workbench.inputs.prompts import Prompt
from workbench.models import checkpoints, native
from workbench.recording.writer import record
from workbench.store.runs import INCOMPLETE, RUN_JSON, RunStore
from workbench.store.schema import Table, columns, tables

MODEL = fake_info()
TABLES = tables(Table("t", "one integer column", columns(("a", "int", "a number"))))
PROMPTS = [Prompt(text="the cat sat on the mat"), Prompt(text="bread")]
CHUNK = Path("recording.zarr/attn/L001/c/1/0/0/0")  # layer 1, prompt 1: a real chunk file


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, llama, tokenizer):
    """A run store with a record run, a run with a table and a checkpoint, a failed run
    and an interrupted one; and a recording folder outside any store."""
    root = tmp_path_factory.mktemp("verify")
    store = RunStore(root / "runs")
    with store.start("record", MODEL, {"n": 2}) as rec_run:
        record(llama, PROMPTS, rec_run.dir / "recording")
    with store.start("exp", MODEL, {"n": 3}, tables=TABLES) as table_run:
        table_run.save_table("t", pd.DataFrame({"a": range(3)}))
        tokenizer.save_pretrained(str(table_run.dir / checkpoints.TOKENIZER))
        spec = native.ModelSpec(n_layers=1, d_model=16, n_heads=2, n_ctx=32,
                                d_vocab=len(tokenizer), seed=3)
        checkpoints.save(table_run.dir, native.build_bridge(spec, tokenizer), spec, step=0,
                         tokens=0)
    with pytest.raises(RuntimeError), store.start("exp", MODEL, {"n": 4}, tables=TABLES) as bad:
        bad.save_table("t", pd.DataFrame({"a": range(4)}))
        raise RuntimeError("the disk caught fire")
    staged = store.root / INCOMPLETE / "20990101-000000-exp-tiny-dead"
    staged.mkdir()
    (staged / RUN_JSON).write_text(json.dumps({
        "run_id": staged.name, "experiment": "exp", "status": "running",
        "started_at": "2099-01-01T00:00:00+00:00",
        "config": {}, "model": None, "pid": None}))  # no live process: interrupted
    record(llama, PROMPTS, root / "rec")
    return {"root": root, "record": rec_run.id, "table": table_run.id, "failed": bad.id,
            "interrupted": staged.name}


@pytest.fixture
def where(pristine, tmp_path, monkeypatch):
    """A fresh copy of the pristine store and recording, an empty model cache, and a
    loader that fails the test if anything loads a model."""
    shutil.copytree(pristine["root"], tmp_path, dirs_exist_ok=True)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))

    def refuse(*args, **kwargs):
        raise AssertionError("verify loaded a model")

    importlib.import_module("workbench.harness.experiment")  # bind before patching
    monkeypatch.setattr("workbench.models.load.load_model", refuse)
    monkeypatch.setattr("workbench.harness.experiment.load_model", refuse)
    monkeypatch.setattr("workbench.models.checkpoints.load", refuse)
    return {**pristine, "runs": tmp_path / "runs", "rec": tmp_path / "rec"}


def verify(capsys, where, *names: str) -> tuple[int, dict[str, tuple[str, str, str]], str]:
    """Exit status, ``{name: (kind, status, detail)}`` from the table, and stderr."""
    status, out, err = cli(capsys, "verify", *names, "--out", str(where["runs"]))
    assert status == 2 or out[0].split() == ["name", "kind", "status", "detail"]
    rows = {}
    for line in out[2:]:
        name, kind, state, detail = re.split(r"\s{2,}", line, maxsplit=3)
        rows[name] = (kind, state, detail)
    return status, rows, err


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_clean_store_verifies_ok_and_reports_unfinished_runs(capsys, where):
    status, rows, err = verify(capsys, where)
    assert status == 0 and err == ""
    stored = {r.id for r in RunStore(where["runs"]).runs()}
    assert stored == {where[k] for k in ("record", "table", "failed", "interrupted")}
    assert {n for n, (kind, _, _) in rows.items() if kind == "run"} == stored
    assert rows["minilm"][:2] == ("model", "not fetched")  # the cache is empty
    assert rows[where["record"]][1:] == ("ok", "1 recording re-hashed")
    assert rows[where["table"]][1:] == ("ok", "1 table, 1 checkpoint re-hashed")
    _, state, detail = rows[where["failed"]]
    assert state == "failed" and "the disk caught fire" in detail and "1 table re-hashed" in detail
    assert rows[where["interrupted"]][1] == "interrupted"


@pytest.mark.parametrize("victim, named", [
    (lambda w: w["runs"] / w["record"] / "recording" / CHUNK, "checksum mismatch for chunk file"),
    (lambda w: w["runs"] / w["table"] / "t.parquet", "the table was changed"),
    (lambda w: checkpoints.step_dir(w["runs"] / w["table"], 1, 0) / checkpoints.WEIGHTS,
     "does not match the SHA-256"),
], ids=["recording-chunk", "table", "checkpoint"])
def test_one_flipped_byte_is_named_and_exits_1(capsys, where, victim, named):
    path = victim(where)
    flip(path)
    status, rows, err = verify(capsys, where)
    damaged = {n: row for n, row in rows.items() if row[1] == "damaged"}
    assert status == 1 and len(damaged) == 1
    [(name, (kind, _, detail))] = damaged.items()
    assert kind == "run" and named in detail  # naming the file (a checkpoint: by folder)
    assert str(path.parent) in detail and path.name in detail
    assert err.count("\n") == 1
    assert err.startswith(f"error: damaged: {name} (run); rerun the damaged runs")


def test_a_damaged_run_json_is_reported_not_raised(capsys, where):
    (where["runs"] / where["table"] / RUN_JSON).write_text("{not json")
    status, rows, err = verify(capsys, where, where["table"])
    assert status == 1 and rows[where["table"]][1] == "damaged"
    assert "not valid JSON" in rows[where["table"]][2] and "rerun the damaged runs" in err


def test_run_ids_prefixes_and_folders_in_the_store(capsys, where):
    run_id = where["record"]
    for ref in (run_id, run_id[:-2], str(where["runs"] / run_id)):
        status, rows, _ = verify(capsys, where, ref)
        assert status == 0 and list(rows) == [run_id] and rows[run_id][:2] == ("run", "ok")
    status, rows, _ = verify(capsys, where, run_id, run_id[:-2])
    assert status == 0 and list(rows) == [run_id]  # one thing, named twice: one row


def test_recording_folders_verify_in_and_outside_a_store(capsys, where):
    inside = str(where["runs"] / where["record"] / "recording")
    status, rows, _ = verify(capsys, where, str(where["rec"]), inside)
    assert status == 0
    assert rows[str(where["rec"])][:2] == rows[inside][:2] == ("recording", "ok")
    flip(where["rec"] / CHUNK)
    status, rows, err = verify(capsys, where, str(where["rec"]))
    assert status == 1 and str(where["rec"] / CHUNK) in rows[str(where["rec"])][2]
    assert err == f"error: damaged: {where['rec']} (recording); record the damaged " \
                  "recordings again\n"


@pytest.mark.parametrize("name, message", [
    ("smollm", "unknown name 'smollm' (did you mean 'smollm2'?): not a bundled model "
               "(gemma3, minilm, smollm2), a run id or id prefix in "),
    ("{typo}", "(did you mean '{record}'"),
    ("nothing-here", "nor a recording folder (holding index.json)"),
    ("{runs}/../rec/recording.zarr", "no recording or run in "),
    ("/no/such/folder", "no recording or run in /no/such/folder: no such folder"),
])
def test_a_bad_name_exits_2_naming_the_kinds(capsys, where, name, message):
    typo = where["record"][:-1] + ("0" if where["record"][-1] != "0" else "1")
    name = name.format(typo=typo, runs=where["runs"])
    status, _, err = verify(capsys, where, "minilm", name)
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("error: ") and message.format(record=where["record"]) in err


def test_a_run_folder_outside_the_store_is_refused(capsys, where, tmp_path):
    shutil.copytree(where["runs"] / where["table"], tmp_path / "elsewhere" / where["table"])
    status, _, err = verify(capsys, where, str(tmp_path / "elsewhere" / where["table"]))
    assert status == 2 and "outside the run store" in err and err.count("\n") == 1


def test_the_summary_names_every_damaged_thing_with_the_fix_for_its_kind():
    checks = [Check("minilm", "model", "damaged", "x"), Check("smollm2", "model", "ok", ""),
              Check("r1", "run", "damaged", "y"), Check("r2", "run", "failed", "z"),
              Check("/tmp/rec", "recording", "damaged", "w")]
    summary = damage_summary(checks)
    assert summary.startswith("damaged: minilm (model), r1 (run), /tmp/rec (recording); ")
    assert "run `workbench fetch minilm --force`" in summary and "smollm2" not in summary
    assert "rerun the damaged runs" in summary and "record the damaged recordings again" in summary
    assert damage_summary([c for c in checks if c.status != "damaged"]) is None
