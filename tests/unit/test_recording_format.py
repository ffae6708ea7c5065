"""The recording on disk: a Zarr v3 group with a SHA-256 manifest, format-1 recordings
still open, `auto` pattern storage, and refusals that write nothing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr

from tests import tiny
from tests.recordings import write_format1
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.recording import zarr_store
from workbench.recording.reader import Recording
from workbench.recording.writer import DENSE_UP_TO, record, storage_for

TEXTS = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog", "bread"]


@pytest.fixture(scope="module")
def recorded(llama, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fmt") / "rec"
    return record(llama, [Prompt(text=t) for t in TEXTS], folder, store_dtype="float32")


def test_the_group_is_plain_zarr_v3_with_every_file_in_the_manifest(recorded):
    group = zarr.open_group(str(recorded.root / "recording.zarr"), mode="r")
    assert group.metadata.zarr_format == 3
    attn = group["attn/L000"]
    n = max(recorded.length(i) for i in range(len(recorded)))
    assert attn.shape == (3, recorded.n_heads, n, n) and attn.chunks[:2] == (1, recorded.n_heads)
    assert any(type(c).__name__ == "Crc32cCodec" for c in attn.compressors)
    # read without the workbench: the padding beyond a prompt's length is zero
    short = recorded.length(2)
    np.testing.assert_array_equal(attn[2, 0, :short, :short], recorded.pattern(2, 0, 0))
    assert not attn[2, :, short:].any() and not attn[2, :, :, short:].any()
    files = json.loads((recorded.root / "index.json").read_text())["files"]
    on_disk = {p.relative_to(recorded.root).as_posix()
               for p in (recorded.root / "recording.zarr").rglob("*") if p.is_file()}
    assert set(files) == on_disk


def test_a_chunk_added_after_recording_is_named_by_verify(recorded, tmp_path):
    root = tmp_path / "rec"
    shutil.copytree(recorded.root, root)
    Recording.open(root).verify()
    extra = root / "recording.zarr" / "attn" / "L000" / "c" / "2" / "0" / "9" / "0"
    extra.parent.mkdir(parents=True)
    extra.write_bytes(b"\0" * 16)
    with pytest.raises(ChecksumError, match="c/2/0/9/0 is not listed in the manifest"):
        Recording.open(root).verify()


def test_a_missing_array_is_one_clear_error(recorded, tmp_path):
    root = tmp_path / "rec"
    shutil.copytree(recorded.root, root)
    index = json.loads((root / "index.json").read_text())
    shutil.rmtree(root / "recording.zarr" / "resid" / "B001")
    index["files"] = {k: v for k, v in index["files"].items() if "/B001/" not in k}
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(WorkbenchError, match="array resid/B001 is missing"):
        Recording.open(root)


def test_format_1_recordings_still_open(recorded, tmp_path):
    old = Recording.open(write_format1(recorded, tmp_path / "old"))
    assert old.format_version == 1 and recorded.format_version == 2
    old.verify()
    for i in range(len(recorded)):
        assert old.tokens(i) == recorded.tokens(i)
        for layer in range(recorded.n_layers):
            np.testing.assert_allclose(old.pattern(i, layer), recorded.pattern(i, layer),
                                       atol=1e-3)  # format 1 stored float16
            np.testing.assert_allclose(old.resid(i, layer), recorded.resid(i, layer),
                                       rtol=1e-3, atol=1e-3)
    pooled = old.pooled(0, 1, 0, max_cells=4)
    n = old.length(0)
    assert pooled.grid.shape[0] <= 4 and pooled.grid.shape[0] * pooled.factor >= n
    np.testing.assert_allclose(pooled.grid[0, 0], old.pattern(0, 1, 0)[:pooled.factor,
                                                                      :pooled.factor].max())


def test_recording_into_a_non_empty_folder_is_refused_and_writes_nothing(llama, tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    (folder / "L000.bin").write_bytes(b"stale")
    with pytest.raises(WorkbenchError, match="is not an empty folder") as caught:
        record(llama, [Prompt(text="the cat")], folder)
    assert "\n" not in str(caught.value)
    assert [p.name for p in folder.iterdir()] == ["L000.bin"]
    record(llama, [Prompt(text="the cat")], tmp_path / "empty-is-fine", include_resid=False)


def test_auto_storage_is_dense_up_to_1024_tokens_and_topk_above(llama, tmp_path):
    assert DENSE_UP_TO == 1024
    assert storage_for("auto", 1024) == "dense" and storage_for("auto", 1025) == "topk"
    assert storage_for("none", 5000) == "none"
    with pytest.raises(WorkbenchError, match="patterns must be one of auto, dense, topk"):
        storage_for("sparse", 10)
    rec = record(llama, [Prompt(text="the cat")], tmp_path / "auto")
    assert rec.patterns == "dense" and rec.topk is None


def test_patterns_none_and_bad_options(llama, tmp_path):
    rec = record(llama, [Prompt(text="the cat")], tmp_path / "none", patterns="none")
    assert rec.patterns == "none" and rec.has_resid
    assert not (tmp_path / "none" / "recording.zarr" / "attn").exists()
    with pytest.raises(WorkbenchError, match="recorded no attention patterns"):
        rec.pattern(0, 0)
    with pytest.raises(WorkbenchError, match="nothing to record"):
        record(llama, [Prompt(text="the cat")], tmp_path / "x", patterns="none",
               include_resid=False)
    with pytest.raises(WorkbenchError, match="topk must be a positive integer"):
        record(llama, [Prompt(text="the cat")], tmp_path / "y", topk=0)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_cli_records_topk_patterns(capsys, runs_dir, llama_folder):
    status, out, _ = tiny.cli(capsys, "record", str(llama_folder), "--text", "the cat sat",
                              "--patterns", "topk", "--topk", "3", "--no-resid")
    assert status == 0 and "top-3 patterns" in out[0]
    rec = Recording.open(out[-1])
    assert rec.patterns == "topk" and rec.pattern_sparse(0, 0).weights.shape[-1] == 3
    assert not rec.has_resid


def test_the_query_block_is_the_pattern_chunk(llama, tmp_path, monkeypatch):
    monkeypatch.setattr(zarr_store, "QUERY_BLOCK", 4)
    rec = record(llama, [Prompt(text=TEXTS[1])], tmp_path / "blocks", include_resid=False,
                 store_dtype="float32")
    n = rec.length(0)
    chunks = sorted((tmp_path / "blocks" / "recording.zarr" / "attn" / "L000" / "c" / "0" / "0")
                    .iterdir())
    assert len(chunks) == -(-n // 4)
    whole = rec.pattern(0, 0)
    np.testing.assert_array_equal(rec.pattern(0, 0, queries=(5, 9)), whole[:, 5:9])


@pytest.mark.parametrize("what", ["chunk", "folder"])
def test_a_chunk_or_folder_symlinked_out_of_the_recording_is_refused(recorded, tmp_path, what):
    root = tmp_path / "rec"
    shutil.copytree(recorded.root, root)
    outside = tmp_path / "outside"
    layer = root / "recording.zarr" / "attn" / "L001"
    if what == "chunk":
        victim = layer / "c" / "0" / "0" / "0" / "0"
        outside.write_bytes(victim.read_bytes())
    else:
        victim = layer / "c"
        shutil.copytree(victim, outside)
    shutil.rmtree(victim) if victim.is_dir() else victim.unlink()
    victim.symlink_to(outside, target_is_directory=what == "folder")
    with pytest.raises(WorkbenchError, match="leads outside"):
        Recording.open(root)
