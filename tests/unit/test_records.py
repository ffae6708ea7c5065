"""Typed records: one model per stored file, strict, with one-line errors, and JSON Schemas
that other tools can validate the store with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import jsonschema
import pytest

from tests.tiny import fake_info
from workbench.core.paths import data_dir
from workbench.core.records import Count, Record, RecordError, RelPath
from workbench.harness import schemas
from workbench.harness.sweeps.spec import load_spec
from workbench.inputs.prompts import Prompt
from workbench.recording.writer import record
from workbench.store.records import RunMeta
from workbench.store.runs import RunStore


class Point(Record):
    x: Count
    kind: Literal["a", "b"] = "a"
    where: RelPath | None = None
    path: tuple[int, ...] = ()


@pytest.mark.parametrize(("data", "message"), [
    (b'{"x": -1}', "p.json 'x': expected at least 0, got -1"),
    (b'{"x": 1.5}', "p.json 'x': expected a valid integer, got 1.5"),
    (b'{"x": true}', "p.json 'x': expected a valid integer, got true"),
    (b'{"x": "1"}', "p.json 'x': expected a valid integer, got \"1\""),
    (b'{"x": 1, "kind": "c"}', "p.json 'kind': expected 'a' or 'b', got \"c\""),
    (b'{"x": 1, "y": 2}', "p.json has an unknown field 'y'"),
    (b"{}", "p.json has no 'x'"),
    (b"[", "p.json is not valid JSON"),
    (b'{"x": 1, "where": "../up"}', "p.json 'where': expected a path inside its folder"),
    (b'{"x": 1, "where": "/etc/passwd"}', "p.json 'where': expected a path inside its folder"),
    (b'{"x": 1, "path": [1, "a"]}', "p.json 'path.1': expected a valid integer, got \"a\""),
    (b'{"x": 99999999999999999999}', "p.json 'x': expected at most 9223372036854775807"),
    (b'{"x": NaN}', "p.json 'x': expected a valid integer, got NaN"),
    (b"[" * 100_000, "p.json"),
])
def test_nothing_is_coerced_and_every_refusal_is_one_line(data, message):
    with pytest.raises(RecordError) as caught:
        Point.from_json(data, what="p.json")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_data_goes_through_the_same_rule_and_records_are_frozen():
    point = Point.from_data({"x": 1, "path": [1, 2]}, what="p")
    assert point.path == (1, 2)
    with pytest.raises(RecordError, match="'x': expected a valid integer, got NaN"):
        Point.from_data({"x": float("nan")}, what="p")
    with pytest.raises(RecordError, match="is not a JSON value"):
        Point.from_data({"x": 1, "where": Path("a")}, what="p")
    with pytest.raises(Exception, match="frozen"):
        point.x = 2
    assert point.replace(path=[3]).path == (3,) and point.path == (1, 2)


def test_an_unknown_field_suggests_the_close_one():
    with pytest.raises(RecordError, match=r"'kinds' \(did you mean 'kind'\?\); fields there"):
        Point.from_data({"x": 1, "kinds": "a"}, what="p")


def test_the_committed_schemas_are_the_records_own():
    assert schemas.stale() == [], "run `python -m workbench.harness.schemas`"


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((schemas.folder() / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_real_files_validate_against_the_schemas_with_a_plain_json_schema_tool(
        llama, tmp_path):
    """An independent reader (jsonschema, not pydantic) accepts what the workbench writes
    and refuses what the workbench refuses."""
    store = RunStore(tmp_path / "runs")
    with store.start("record", llama.info, {"source": "test"}) as run:
        record(llama, [Prompt(text="the cat sat"), Prompt(text="a dog")], run.dir / "rec")
    meta = json.loads((store.get(run.id).path / "run.json").read_text())
    index = json.loads((store.get(run.id).path / "rec" / "index.json").read_text())
    _validator("run").validate(meta)
    _validator("recording-index").validate(index)
    for path in sorted((data_dir() / "claims").glob("*.json")):
        _validator("claims").validate(json.loads(path.read_text()))
    for path in sorted((data_dir() / "sweeps").glob("*.toml")):
        _validator("sweep-spec").validate(load_spec(path).to_data())
    bad = {**meta, "pid": "1"}
    assert not _validator("run").is_valid(bad)
    with pytest.raises(RecordError):
        RunMeta.from_data(bad, what="run.json")


def test_a_run_record_reads_back_equal(tmp_path):
    store = RunStore(tmp_path)
    with store.start("exp", fake_info(), {"n": 1, "layers": (1, 2)}) as run:
        run.update(summary=["one line"])
    stored = store.get(run.id)
    again = RunMeta.from_json(stored.meta.to_json(), what="run.json")
    assert again == stored.meta and stored.meta.config == {"n": 1, "layers": [1, 2]}
    assert stored.meta.summary == ("one line",) and stored.meta.model == fake_info()
    with pytest.raises(RecordError, match="unknown field 'colour'"):
        run.update(colour="blue")


def test_a_run_without_its_load_stays_valid_and_says_so(tmp_path):
    store = RunStore(tmp_path)
    with store.start("exp", fake_info(), {"n": 1}) as run:
        pass
    data = json.loads((store.get(run.id).path / "run.json").read_text())
    assert len(data["load_at_start"]) == 3 and len(data["load_at_end"]) == 3
    older = {k: v for k, v in data.items() if not k.startswith("load_at")}
    meta = RunMeta.from_data(older, what="run.json")
    assert meta.load_at_start is None and meta.busy is None
    assert meta.load_note == "load not recorded"
    cores = meta.machine.cpu_count
    busy = meta.replace(load_at_start=[0.0, 0.0, 0.0], load_at_end=[cores + 0.5, 0.0, 0.0])
    assert busy.busy is True and busy.load_note.startswith("busy (load 0.0 at start")
    idle = meta.replace(load_at_start=[cores, 0.0, 0.0])  # at the cores is not above them
    assert idle.busy is False and idle.load_note == f"idle (load {cores:.1f} at start, " \
        f"{cores} cores)"
