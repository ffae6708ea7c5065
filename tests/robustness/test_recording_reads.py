"""A recording is checked at every read, not only when it is opened: a chunk replaced
afterwards (by a symlink out of the store, a FIFO, nothing), array metadata edited (even
re-hashed in the manifest), an index edited and re-hashed: each is refused in one line,
never served and never drawn as data."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.tiny import fake_info
from workbench.core import checksums
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.harness.verify import verify
from workbench.inputs.prompts import Prompt
from workbench.recording import zarr_store
from workbench.recording.reader import Recording
from workbench.recording.writer import record
from workbench.store.runs import RunStore

TEXTS = ["the cat sat on the mat and the dog sat on the rug", "a quick brown fox"]


@pytest.fixture(scope="module")
def pristine(llama, tmp_path_factory):
    """A store with one complete recording run (patterns and residuals, float32)."""
    root = tmp_path_factory.mktemp("reads") / "runs"
    with RunStore(root).start("record", llama.info, {"source": "test"}) as run:
        record(llama, [Prompt(text=t) for t in TEXTS], run.dir / "recording",
               store_dtype="float32")
    return root, run.id


@pytest.fixture
def store(pristine, tmp_path):
    root, run_id = pristine
    copy = tmp_path / "runs"
    shutil.copytree(root, copy, symlinks=True)
    return copy, copy / run_id / "recording"


def chunk(folder: Path, array: str = "attn/L000") -> Path:
    """The first chunk file of an array (prompt 0, its first block)."""
    dims = 4 if array.startswith("attn") else 3
    path = folder / zarr_store.GROUP / array / "c" / "/".join(["0"] * dims)
    assert path.is_file()
    return path


def test_an_intact_recording_reads_and_verifies(store):
    _, folder = store
    rec = Recording.open(folder.parent)
    assert rec.pattern(0, 0, 0).sum() > 0
    rec.verify()


def test_a_chunk_replaced_by_a_symlink_after_open_is_refused_not_served(store, tmp_path):
    _, folder = store
    rec = Recording.open(folder)  # opened (and cached, as the dashboard does) first
    target = chunk(folder)
    secret = tmp_path / "secret"
    secret.write_bytes(target.read_bytes())  # a valid chunk, so only the path can betray it
    target.unlink()
    target.symlink_to(secret)
    with pytest.raises(WorkbenchError, match="is not a regular file inside the recording"):
        rec.pattern(0, 0)


def test_a_fifo_in_place_of_a_chunk_is_refused_without_blocking(store):
    _, folder = store
    rec = Recording.open(folder)
    target = chunk(folder)
    target.unlink()
    os.mkfifo(target)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            rec.pattern(0, 0)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=300)  # a bound on a hang, not a speed
    assert not thread.is_alive(), "reading a FIFO chunk blocked"
    assert isinstance(outcome[0], WorkbenchError)
    assert "is not a regular file" in str(outcome[0])


def test_a_deleted_chunk_is_an_error_never_zero_attention(store):
    _, folder = store
    rec = Recording.open(folder)
    chunk(folder).unlink()
    with pytest.raises(ChecksumError, match="is missing: the recording is damaged"):
        rec.pattern(0, 0)


def test_a_chunk_added_after_open_is_not_read_as_data(store):
    _, folder = store
    rec = Recording.open(folder)
    resid = chunk(folder, "resid/B000")
    extra = resid.with_name("9")
    shutil.copy(resid, extra)
    rec.resid(0, 0)  # the chunks it reads are the listed ones
    with pytest.raises(ChecksumError, match="is not listed in the manifest"):
        Recording.open(folder).verify()


def _endianness_flipped(meta: Path) -> None:
    """A same-size edit of an array's zarr.json: little-endian becomes big-endian."""
    text = meta.read_text()
    assert '"little"' in text
    meta.write_text(text.replace('"little"', '"big"   ', 1))


def test_array_metadata_edited_after_open_is_refused(store):
    _, folder = store
    rec = Recording.open(folder)
    meta = folder / zarr_store.GROUP / "attn" / "L000" / "zarr.json"
    size = meta.stat().st_size
    _endianness_flipped(meta)
    assert meta.stat().st_size == size
    with pytest.raises(ChecksumError, match="changed since it was written"):
        rec.pattern(0, 0)


def _rehash(folder: Path, rel: str) -> None:
    """Update the index's manifest entry of ``rel`` to the file's new SHA-256."""
    index = json.loads((folder / "index.json").read_text())
    index["files"][rel]["sha256"] = checksums.sha256_file(folder / rel)
    (folder / "index.json").write_text(json.dumps(index))


def test_metadata_edited_and_rehashed_is_not_the_writers_and_is_refused(store):
    root, folder = store
    rel = f"{zarr_store.GROUP}/attn/L000/zarr.json"
    _endianness_flipped(folder / rel)
    _rehash(folder, rel)
    with pytest.raises(WorkbenchError, match="not the index its run recorded"):
        Recording.open(folder)  # the run's run.json anchors the old index
    # outside any run, the index passes its own check, and the metadata does not
    alone = root.parent / "alone"
    shutil.copytree(folder, alone)
    with pytest.raises(WorkbenchError, match="metadata the writer does not write"):
        Recording.open(alone)


def test_verify_names_a_recording_whose_index_was_edited_and_rehashed(store, capsys):
    root, folder = store
    rel = f"{zarr_store.GROUP}/attn/L000/zarr.json"
    _endianness_flipped(folder / rel)
    _rehash(folder, rel)
    checks = verify([folder.parent.name], runs_dir=root)
    assert [c.status for c in checks] == ["damaged"]
    assert "not the index its run recorded" in checks[0].detail


def test_the_index_anchor_is_kept_when_the_run_completes(pristine):
    root, run_id = pristine
    run = RunStore(root).get(run_id)
    index = run.path / "recording" / "index.json"
    assert run.meta.recordings == {"recording": checksums.sha256_file(index)}


def test_a_run_without_an_anchor_still_opens(store):
    """Runs written before the index was anchored keep opening."""
    _, folder = store
    meta = json.loads((folder.parent / "run.json").read_text())
    meta.pop("recordings")
    (folder.parent / "run.json").write_text(json.dumps(meta))
    assert np.isfinite(Recording.open(folder).pattern(1, 0, 0)).all()


def test_a_recording_of_a_damaged_run_is_refused_in_one_line(store):
    _, folder = store
    (folder.parent / "run.json").write_text("{}")
    with pytest.raises(WorkbenchError, match="the recording's run is damaged") as caught:
        Recording.open(folder)
    assert "\n" not in str(caught.value)


def test_a_recording_made_outside_a_store_keeps_no_anchor(llama, tmp_path):
    rec = record(llama, [Prompt(text="hello there")], tmp_path / "rec")
    assert Recording.open(rec.root).length(0) == rec.length(0)
    with RunStore(tmp_path / "runs").start("exp", fake_info(), {}) as run:
        pass
    assert RunStore(tmp_path / "runs").get(run.id).meta.recordings == {}
