"""Bad model arguments are one line, before any run exists (issue 11, classes 6 and 7).

Local folders with a garbage ``config.json`` or no weights, garbage ``.gguf`` files,
checkpoint names whose run or step does not exist, and names no model can have. Each CLI
case checks the exit status, a single ``error:`` line, no traceback and no new run.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

from tests.robustness.test_cache import cli_error
from workbench.core import checksums
from workbench.core.errors import WorkbenchError
from workbench.models import cache, checkpoints, gguf, native
from workbench.models.load import load_model
from workbench.store.runs import RunStore
from workbench.training import data as training_data

TEXT = ["The function returns the number of items in the container, or zero when empty."] * 8


def run_count(root: Path) -> int:
    return len(list(root.rglob("run.json"))) if root.exists() else 0


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


# ---- local Hugging Face folders ---------------------------------------------------------------

def _config(**changes):
    def apply(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(changes)
        (folder / "config.json").write_text(json.dumps(cfg))
    return apply


def _write(name: str, content: bytes):
    return lambda folder: (folder / name).write_bytes(content)


def _unlink(*names: str):
    return lambda folder: [(folder / n).unlink() for n in names]


def _only_bin(content: bytes):
    def apply(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(content)
    return apply


def _truncate(name: str, keep: int):
    def apply(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:keep])
    return apply


FOLDERS = [
    pytest.param(_write("config.json", b"{not json"), "config.json is not valid JSON",
                 id="config-not-json"),
    pytest.param(_write("config.json", b""), "config.json is not valid JSON",
                 id="config-empty"),
    pytest.param(_write("config.json", b"\xff\xfe\x00\x01"), "config.json is not UTF-8",
                 id="config-binary"),
    pytest.param(_write("config.json", b"[1, 2]"), "is not a Hugging Face model config",
                 id="config-a-list"),
    pytest.param(_write("config.json", b"{}"), "(no 'model_type')", id="config-no-model-type"),
    pytest.param(_write("config.json", b"[" * 100_000), "config.json is JSON nested too deeply",
                 id="config-nested-too-deeply"),
    pytest.param(_config(model_type=7), "(no 'model_type')", id="config-model-type-a-number"),
    pytest.param(_config(model_type="foo"), "does not recognize this architecture",
                 id="config-unknown-model-type"),
    pytest.param(_config(hidden_size=64), "could not be loaded as a Hugging Face model",
                 id="config-shapes-do-not-fit-the-weights"),
    pytest.param(_config(num_attention_heads=3), "not a multiple of the number of attention",
                 id="config-fails-its-own-checks"),
    pytest.param(_config(num_hidden_layers=3), "weights missing from the checkpoint",
                 id="config-more-layers-than-weights"),
    pytest.param(_unlink("model.safetensors"), "has no weights; expected model.safetensors or "
                 "pytorch_model.bin", id="no-weights"),
    pytest.param(_write("model.safetensors", b"garbage" * 20), "SafetensorError",
                 id="weights-garbage"),
    pytest.param(_truncate("model.safetensors", 1000), "SafetensorError", id="weights-truncated"),
    pytest.param(_write("model.safetensors", b""), "SafetensorError", id="weights-empty"),
    pytest.param(_only_bin(b"not a pickle"), "UnpicklingError", id="bin-weights-garbage"),
    pytest.param(_unlink("tokenizer.json", "tokenizer_config.json"),
                 "has no tokenizer; expected tokenizer.json", id="no-tokenizer"),
    pytest.param(_write("tokenizer.json", b"{garbage"),
                 "could not be loaded as a Hugging Face model", id="tokenizer-garbage"),
]


@pytest.mark.parametrize(("damage", "fragment"), FOLDERS)
def test_damaged_local_folder_is_one_line(llama_folder, tmp_path, capsys, runs_dir,
                                          damage, fragment):
    folder = tmp_path / "model"
    shutil.copytree(llama_folder, folder)
    damage(folder)
    status, line = cli_error(capsys, "record", str(folder), "--text", "hello world")
    assert status == 2 and fragment in line and str(folder) in line, line
    assert run_count(runs_dir) == 0


def test_intact_local_folder_still_loads(llama_folder):
    model = load_model(str(llama_folder))
    assert model.info.source == "local folder" and len(model.info.checksum) == 64


# ---- GGUF files -------------------------------------------------------------------------------

GGUF = [
    pytest.param(b"garbage" * 20, "is not a GGUF file", id="not-gguf"),
    pytest.param(b"", "is not a GGUF file", id="empty"),
    pytest.param(b"GGU", "is not a GGUF file", id="shorter-than-the-magic"),
    pytest.param(b"GGUF" + struct.pack("<I", 3) + b"\0" * 20,
                 "could not be read as a GGUF model", id="magic-and-no-metadata"),
    pytest.param(b"GGUF" + struct.pack("<IQQ", 3, 5, 99) + b"\x07",
                 "could not be read as a GGUF model", id="truncated-header"),
]


@pytest.mark.parametrize(("content", "fragment"), GGUF)
def test_garbage_gguf_is_one_line_and_leaves_nothing_cached(tmp_path, capsys, runs_dir,
                                                            isolated_cache, content, fragment):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    status, line = cli_error(capsys, "record", str(path), "--text", "hello world")
    assert status == 2 and fragment in line and str(path) in line, line
    assert run_count(runs_dir) == 0
    left = sorted(p.name for p in isolated_cache.iterdir()) if isolated_cache.exists() else []
    assert [n for n in left if not n.endswith(".lock")] == []  # no copy, no staging


@pytest.fixture
def fake_gguf(llama_folder, tmp_path, monkeypatch, isolated_cache):
    """A GGUF header naming the llama architecture; its "conversion" copies the tiny Llama
    folder."""
    path = tmp_path / "tiny.gguf"
    key, arch = b"general.architecture", b"llama"
    path.write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, len(key)) + key
                     + struct.pack("<IQ", 8, len(arch)) + arch)
    conversions: list[Path] = []

    def convert(gguf_path: Path, out_dir: Path) -> tuple[dict[str, str], str]:
        conversions.append(gguf_path)
        shutil.copytree(llama_folder, out_dir)
        files = {f"hf/{p.name}": checksums.sha256_file(p) for p in out_dir.iterdir()}
        return files, "LlamaForCausalLM"

    monkeypatch.setattr(gguf, "convert_gguf", convert)
    return path, conversions


def test_gguf_conversion_is_cached_with_a_manifest(fake_gguf, isolated_cache):
    path, conversions = fake_gguf
    first = load_model(str(path))
    second = load_model(str(path))
    assert len(conversions) == 1 and first.info.checksum == second.info.checksum
    [entry] = [p for p in isolated_cache.iterdir() if p.name.startswith("gguf-")]
    manifest = json.loads((entry / cache.MANIFEST).read_text())
    assert manifest["gguf_sha256"] == checksums.sha256_file(path)
    assert "hf/model.safetensors" in manifest["files"]


@pytest.mark.parametrize("damage", [
    pytest.param(lambda e: (e / "hf" / "model.safetensors").write_bytes(b"x"), id="weights"),
    pytest.param(lambda e: (e / "hf" / "tokenizer.json").unlink(), id="missing-tokenizer"),
    pytest.param(lambda e: (e / cache.MANIFEST).write_text("{"), id="manifest"),
    pytest.param(lambda e: (e / cache.MANIFEST).unlink(), id="no-manifest-as-before-issue-11"),
])
def test_damaged_gguf_conversion_is_converted_again(fake_gguf, isolated_cache, damage):
    path, conversions = fake_gguf
    load_model(str(path))
    [entry] = [p for p in isolated_cache.iterdir() if p.name.startswith("gguf-")]
    damage(entry)
    model = load_model(str(path))
    assert len(conversions) == 2 and model.info.n_layers == 2
    assert [p.name for p in isolated_cache.iterdir() if ".staging-" in p.name
            or ".aside-" in p.name] == []


# ---- checkpoint names -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run store holding one run with checkpoints L2 at steps 0 and 3, and a run with none."""
    root = tmp_path_factory.mktemp("trained")
    tokenizer = training_data.train_tokenizer(TEXT, 300, root / "tok")
    store = RunStore(root / "runs")
    spec = native.ModelSpec(n_layers=2, d_model=16, n_heads=2, n_ctx=32,
                            d_vocab=len(tokenizer), seed=3)
    with store.start("induction-formation", None, {"seed": 0}) as run:
        tokenizer.save_pretrained(str(run.dir / "tokenizer"))
        with torch.random.fork_rng():
            bridge = native.build_bridge(spec, tokenizer)
        for step in (0, 3):
            checkpoints.save(run.dir, bridge, spec, step=step, tokens=step)
    with store.start("induction-formation", None, {"seed": 1}) as empty:
        pass
    return store.root, store.get(run.final).id, store.get(empty.final).id


CHECKPOINT_NAMES = [
    pytest.param("no-such-run/L2:3", "no run 'no-such-run'", id="unknown-run"),
    pytest.param("{run}/L2:7", "no checkpoint at step 7 for L2; steps: 0, 3", id="unknown-step"),
    pytest.param("{run}/L2:1O", "the step '1O' is not a whole number", id="step-with-a-letter"),
    pytest.param("{run}/L2:-1", "the step '-1' is not a whole number", id="negative-step"),
    pytest.param("{run}/L2:", "the step '' is not a whole number", id="no-step"),
    pytest.param("{run}/L2:3:4", "has no model 'L2:3'; it has L2", id="two-colons"),
    pytest.param("{run}/L5:3", "has no model 'L5'; it has L2", id="unknown-model"),
    pytest.param("{empty}:0", "has no checkpoints", id="run-without-checkpoints"),
]


@pytest.mark.parametrize(("name", "fragment"), CHECKPOINT_NAMES)
def test_bad_checkpoint_name_says_what_is_missing(trained, capsys, monkeypatch, name, fragment):
    root, run_id, empty_id = trained
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", str(root))
    before = run_count(root)
    status, line = cli_error(capsys, "record", name.format(run=run_id, empty=empty_id),
                             "--text", "hello world")
    assert status == 2 and fragment in line, line
    assert "hub" not in line
    assert run_count(root) == before


def test_checkpoint_is_looked_up_in_the_store_given(trained, tmp_path, monkeypatch):
    root, run_id, _ = trained
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", str(tmp_path / "elsewhere"))
    model = load_model(f"{run_id}/L2:3", runs_dir=root)
    assert model.info.name == f"{run_id}/L2:3" and model.info.n_layers == 2
    with pytest.raises(WorkbenchError, match=f"no run '{run_id}' in {tmp_path / 'elsewhere'}"):
        load_model(f"{run_id}/L2:3")


# ---- names no model can have ------------------------------------------------------------------

@pytest.mark.parametrize(("name", "fragment"), [
    pytest.param("x" * 5000, "not a bundled model (gemma3, minilm, smollm2)", id="too-long"),
    pytest.param("two words", "a Hugging Face hub id (org/name)", id="not-a-hub-id"),
    pytest.param("org/name/extra", "a Hugging Face hub id (org/name)", id="three-parts"),
    pytest.param("ok\n", "a Hugging Face hub id (org/name)", id="trailing-newline"),
    pytest.param("a\0b", "a Hugging Face hub id (org/name)", id="nul-byte"),
])
def test_impossible_model_name_is_one_line_without_a_network(capsys, runs_dir, monkeypatch,
                                                             name, fragment):
    from workbench.models import reference

    monkeypatch.setattr(reference, "hub_reachable", lambda timeout=3.0: pytest.fail("network"))
    status, line = cli_error(capsys, "record", name, "--text", "hello world")
    assert status == 2 and fragment in line, line
    assert run_count(runs_dir) == 0
    with pytest.raises(WorkbenchError) as raised:
        load_model(name)
    assert "\n" not in str(raised.value)  # one line from the library itself
