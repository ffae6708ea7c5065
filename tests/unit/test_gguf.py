"""Any GGUF loads as its own family, or is refused in one line before the dequantization.

Tiny GGUF files written with the ``gguf`` package's writer (``tests/gguf_files.py``) from
tiny random Hugging Face models are the references: the dequantized model must compute
what the model it was written from computes, and the ``gguf`` package's own reader says
what the header holds.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
import transformers
from gguf import GGUFReader

from tests import gguf_files
from tests.tiny import cli
from workbench.core.errors import WorkbenchError
from workbench.models import adapters, gguf
from workbench.models.load import load_model

IDS = [2, 5, 10, 34, 35, 36, 37, 38, 30, 31, 32, 33, 39, 40, 41, 42, 43, 20, 21]
"""19 tokens: more than the tiny Gemma 3's window of 8."""


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def _kv(key: str, kind: int, value: bytes) -> bytes:
    return _string(key) + struct.pack("<I", kind) + value


def _header(*fields: bytes, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, 0, len(fields)) + b"".join(fields)


TOKENS = _kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 5000)
             + b"".join(_string(f"tok{i}") for i in range(5000)))
SCORES = _kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 5000) + b"\0" * 4 * 5000)
ARCH = _kv("general.architecture", 8, _string("gemma3"))


def test_the_architecture_is_found_after_any_fields_before_it(tmp_path):
    path = tmp_path / "late.gguf"
    path.write_bytes(_header(TOKENS, _kv("general.alignment", 4, struct.pack("<I", 32)),
                             SCORES, _kv("x.nested", 9, struct.pack("<IQ", 9, 1)
                                         + struct.pack("<IQ", 4, 2) + b"\0" * 8), ARCH))
    assert gguf.architecture(path) == "gemma3"
    assert GGUFReader(path).fields["general.architecture"].contents() == "gemma3"


def test_the_architecture_of_a_file_the_gguf_writer_wrote(tmp_path):
    path = gguf_files.write(gguf_files.tiny_llama(), tmp_path / "llama.gguf")
    assert gguf.architecture(path) == GGUFReader(path).fields[
        "general.architecture"].contents() == "llama"
    assert gguf.model_class(path) == "LlamaForCausalLM"


@pytest.mark.parametrize(("content", "fragment"), [
    pytest.param(_header(TOKENS), "no general.architecture field", id="no-architecture"),
    pytest.param(_header(_kv("general.architecture", 4, struct.pack("<I", 7))),
                 "is not a string", id="architecture-not-a-string"),
    pytest.param(_header(ARCH)[:-3], "header ends early", id="truncated"),
    pytest.param(_header(ARCH, version=1), "GGUF version 1", id="version-1"),
    pytest.param(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**62), "a metadata key or name of",
                 id="huge-key-length"),
    pytest.param(_header(_kv("a.b", 77, b""), ARCH), "unknown metadata value type 77",
                 id="unknown-type"),
    pytest.param(_header(_kv("a.b", 9, struct.pack("<IQ", 4, 2**60)), ARCH),
                 "header ends early", id="huge-array"),
])
def test_a_damaged_header_is_one_line(tmp_path, content, fragment):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(WorkbenchError, match="could not be read as a GGUF model") as info:
        gguf.architecture(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("build", [gguf_files.tiny_llama, gguf_files.tiny_gemma3],
                         ids=["llama", "gemma3"])
def test_a_gguf_loads_as_the_model_it_was_written_from(build, tmp_path, isolated_cache):
    hf_model = build()
    path = gguf_files.write(hf_model, tmp_path / "model.gguf")
    model = load_model(str(path))
    expected = type(hf_model).__name__
    assert model.info.architecture == expected and model.info.source == "local GGUF file"
    [entry] = [p for p in isolated_cache.iterdir() if p.name.startswith("gguf-")]
    assert json.loads((entry / "hf" / "config.json").read_text())["architectures"] == [expected]
    assert json.loads((entry / "manifest.json").read_text())["architecture"] == expected
    with torch.no_grad():
        reference = hf_model(torch.tensor([IDS])).logits
        assert torch.allclose(model.logits(IDS), reference, atol=1e-5)


def test_a_gemma3_gguf_keeps_its_sliding_and_global_layers(tmp_path, isolated_cache):
    hf_model = gguf_files.tiny_gemma3(window=8)
    model = load_model(str(gguf_files.write(hf_model, tmp_path / "gemma3.gguf")))
    info = model.info
    # Gemma 3: every sixth layer global (its config's default pattern), the others slide
    assert info.layer_types == ("sliding",) * 5 + ("global",)
    assert info.sliding_window == 8 and info.window(0) == 8 and info.window(5) is None
    assert info.sliding_layers == (0, 1, 2, 3, 4) and info.global_layers == (5,)
    assert info.n_kv_heads == 1 and info.d_head == gguf_files.HEAD_DIM


@pytest.mark.parametrize("arch", ["rwkv6", "t5", "mamba", "qwen2moe", "\x1b[2Jbad"])
def test_an_architecture_the_workbench_cannot_load_is_refused_before_dequantizing(
        arch, tmp_path, isolated_cache, capsys, monkeypatch, runs_dir):
    path = gguf_files.write(gguf_files.tiny_llama(), tmp_path / "other.gguf", arch=arch)

    def dequantize(*args, **kwargs):
        pytest.fail("the file was dequantized before its architecture was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", dequantize)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", dequantize)
    status, _, err = cli(capsys, "record", str(path), "--text", "hello world")
    lines = err.strip().splitlines()
    assert status != 0 and len(lines) == 1 and "Traceback" not in err, err
    assert "which the workbench cannot load" in lines[0] and str(path) in lines[0]
    assert f"GGUF architectures it loads: {', '.join(sorted(adapters.FAMILIES_BY_GGUF))}" \
        in lines[0]
    assert "\x1b" not in lines[0]
    assert not isolated_cache.exists() or not [
        p for p in isolated_cache.iterdir() if not p.name.endswith(".lock")]


def test_every_gguf_architecture_is_one_transformers_and_the_bridge_take():
    from transformer_lens.factories import architecture_adapter_factory
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    assert {"llama", "gemma3"} <= set(adapters.FAMILIES_BY_GGUF)
    for name, adapter in adapters.FAMILIES_BY_GGUF.items():
        assert name in GGUF_SUPPORTED_ARCHITECTURES, name
        assert adapter.architectures[0] in architecture_adapter_factory.SUPPORTED_ARCHITECTURES
        assert not adapter.unsupported


def test_a_copy_converted_before_its_class_was_recorded_is_converted_again(
        tmp_path, isolated_cache):
    path = gguf_files.write(gguf_files.tiny_gemma3(), tmp_path / "gemma3.gguf")
    load_model(str(path))
    [entry] = [p for p in isolated_cache.iterdir() if p.name.startswith("gguf-")]
    # as the conversion left it before: no class in the manifest, none in the config
    manifest = json.loads((entry / "manifest.json").read_text())
    del manifest["architecture"]
    (entry / "manifest.json").write_text(json.dumps(manifest))
    config = json.loads((entry / "hf" / "config.json").read_text())
    (entry / "hf" / "config.json").write_text(json.dumps({**config, "architectures": None}))
    assert load_model(str(path)).info.architecture == "Gemma3ForCausalLM"
    assert "architecture" in json.loads((entry / "manifest.json").read_text())


def test_model_class_names_the_file(tmp_path):
    path = Path(tmp_path / "x.gguf")
    path.write_bytes(_header(_kv("general.architecture", 8, _string("bert"))))
    with pytest.raises(WorkbenchError, match=r"x\.gguf is a GGUF model of architecture 'bert'"):
        gguf.model_class(path)
