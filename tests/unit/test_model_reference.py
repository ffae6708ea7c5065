"""One reading of a MODEL argument: every form, the order that settles what a text means
when it could be two things, and the same meaning for a single load and a sweep."""

from __future__ import annotations

import os
import shutil
import typing
from pathlib import Path

import pytest

from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.harness.sweeps.spec import resolve_model
from workbench.models import reference
from workbench.models.load import load_model
from workbench.models.reference import (
    Bundled,
    Checkpoint,
    CheckpointGlob,
    Folder,
    Gguf,
    Hub,
    parse_model,
)

RUN = "20250101-120000-induction-formation-none-ab12"


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """An empty working folder, and an empty Hugging Face cache."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return work


def model_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def hub_cache(root: Path, hub_id: str) -> None:
    """The layout huggingface_hub keeps a downloaded config.json in."""
    repo = root / f"models--{hub_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")


# ---- every form -------------------------------------------------------------------------------

def test_every_kind_is_one_form(cwd, tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    folder = model_folder(tmp_path / "folder")
    assert parse_model("smollm2") == Bundled("smollm2")
    assert parse_model(f"{RUN}/L2:1500") == Checkpoint(RUN, "L2", 1500)
    assert parse_model(f"{RUN}:0") == Checkpoint(RUN, "", 0)
    assert parse_model(f"{RUN}/L*:*") == CheckpointGlob(RUN, "L*", "*")
    assert parse_model(f"{RUN}:1?0") == CheckpointGlob(RUN, "L*", "1?0")
    assert parse_model(str(folder)) == Folder(folder)
    assert parse_model(str(gguf)) == Gguf(gguf)
    assert parse_model("EleutherAI/pythia-70m") == Hub("EleutherAI/pythia-70m", cached=False)
    assert parse_model("gpt2") == Hub("gpt2", cached=False)
    kinds = {type(parse_model(t)).kind for t in ("smollm2", f"{RUN}:0", f"{RUN}:*",
                                                 str(folder), str(gguf), "gpt2")}
    assert kinds == set(typing.get_args(reference.ModelKind))


def test_a_hub_id_in_the_local_cache_says_so(cwd, tmp_path):
    hub_cache(tmp_path / "hf-cache", "org/cached-model")
    assert parse_model("org/cached-model") == Hub("org/cached-model", cached=True)
    assert parse_model("org/other-model").cached is False


def test_a_home_relative_path_is_expanded(cwd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    model_folder(tmp_path / "models" / "mine")
    assert parse_model("~/models/mine") == Folder(tmp_path / "models" / "mine")


# ---- ambiguities, settled by the documented order ---------------------------------------------

def test_a_bundled_name_wins_over_a_folder_of_that_name(cwd):
    model_folder(cwd / "minilm")
    assert parse_model("minilm") == Bundled("minilm")
    assert parse_model("./minilm") == Folder(Path("./minilm"))


def test_an_existing_path_with_a_colon_is_a_path(cwd):
    model_folder(cwd / "run:12")
    assert parse_model("run:12") == Folder(Path("run:12"))
    shutil.rmtree(cwd / "run:12")
    assert parse_model("run:12") == Checkpoint("run", "", 12)


def test_an_existing_path_with_glob_characters_is_a_path(cwd):
    model_folder(cwd / "run" / "L*:*")
    assert parse_model("run/L*:*") == Folder(Path("run/L*:*"))


def test_a_relative_folder_hides_the_hub_id_spelt_the_same(cwd):
    assert parse_model("org/name") == Hub("org/name", cached=False)
    (cwd / "org" / "name").mkdir(parents=True)
    with pytest.raises(WorkbenchError, match=r"without config\.json \(it hides the hub id "
                                             r"'org/name'"):
        parse_model("org/name")
    (cwd / "org" / "name" / "config.json").write_text("{}")
    assert parse_model("org/name") == Folder(Path("org/name"))


def test_a_path_that_does_not_exist_is_never_a_hub_id(cwd):
    for text in ("./org/name", "/no/such/folder", "~/no-such-folder-here", "missing.gguf",
                 "../up:3"):
        with pytest.raises(WorkbenchError, match="does not exist; expected a Hugging Face "
                                                 "model folder"):
            parse_model(text)


# ---- what an existing path must be ------------------------------------------------------------

def test_a_folder_without_config_json_is_not_a_model(cwd):
    (cwd / "empty").mkdir()
    with pytest.raises(WorkbenchError, match=r"it is a folder without config\.json"):
        parse_model("./empty")


def test_a_gguf_that_is_not_a_file(cwd):
    (cwd / "dir.gguf").mkdir()
    with pytest.raises(WorkbenchError, match=r"it is a folder without config\.json"):
        parse_model("dir.gguf")
    os.mkfifo(cwd / "pipe.gguf")
    with pytest.raises(WorkbenchError, match=r"named \.gguf but not a regular file"):
        parse_model("pipe.gguf")
    assert parse_model(str(model_folder(cwd / "hf.gguf"))) == Folder(cwd / "hf.gguf")


def test_a_file_not_named_gguf_is_not_a_model(cwd):
    (cwd / "weights.bin").write_bytes(b"GGUF")
    with pytest.raises(WorkbenchError, match=r"it is a file, not named \.gguf"):
        parse_model("weights.bin")


# ---- checkpoint names -------------------------------------------------------------------------

@pytest.mark.parametrize("text, step", [
    pytest.param(f"{RUN}:latest", "latest", id="a-word"),
    pytest.param(f"{RUN}/L2:-1", "-1", id="negative"),
    pytest.param(f"{RUN}/L2:", "", id="empty"),
    pytest.param(f"{RUN}/L2:1.5", "1.5", id="a-fraction"),
    pytest.param(f"{RUN}/L2:\u00b2", "\u00b2", id="a-digit-that-is-not-ascii"),
])
def test_a_checkpoint_step_must_be_a_whole_number(cwd, text, step):
    with pytest.raises(WorkbenchError, match=f"the step {step!r} is not a whole number"):
        parse_model(text)


def test_a_checkpoint_name_needs_a_run(cwd):
    for text in (":3", ":*", ":L2"):
        with pytest.raises(WorkbenchError, match="it names no run"):
            parse_model(text)


def test_the_run_id_of_a_glob_cannot_be_a_pattern(cwd):
    for text in ("2025*/L2:*", "run?/L*:3", "[ab]:3"):
        with pytest.raises(WorkbenchError, match="the run id cannot be a pattern"):
            parse_model(text)


def test_the_last_colon_separates_the_step(cwd):
    # what the run's models are called is for the run to say (it lists them)
    assert parse_model(f"{RUN}/L2:3:4") == Checkpoint(RUN, "L2:3", 4)


# ---- names no model can have ------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    pytest.param("", id="empty"),
    pytest.param("   ", id="blank"),
    pytest.param("a\0b", id="nul-byte"),
    pytest.param("ok\n", id="trailing-newline"),
    pytest.param("tab\there", id="tab"),
    pytest.param("x" * (reference.MAX_LENGTH + 1), id="longer-than-a-path"),
    pytest.param("x" * 300, id="longer-than-a-file-name"),
    pytest.param("two words", id="a-space"),
    pytest.param("org/name/extra", id="three-parts"),
])
def test_impossible_names_list_the_bundled_models(cwd, text):
    with pytest.raises(UnknownNameError) as raised:
        parse_model(text)
    message = str(raised.value)
    assert message.startswith("unknown model ") and "\n" not in message
    assert "not a bundled model (gemma3, minilm, smollm2)" in message and len(message) < 400


def test_an_uncached_hub_id_needs_the_hub(cwd, monkeypatch):
    monkeypatch.setattr(reference, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UnknownNameError, match=r"unknown model 'minilmm' \(did you mean "
                                               r"'minilm'\?\): .* the hub is unreachable"):
        reference.require_hub(parse_model("minilmm"))
    monkeypatch.setattr(reference, "hub_reachable", lambda timeout=3.0: True)
    reference.require_hub(parse_model("minilmm"))  # it may exist on the hub


# ---- one meaning for a single load and for a sweep --------------------------------------------

def test_run_and_sweep_read_a_name_the_same_way(cwd, llama_folder, monkeypatch):
    shutil.copytree(llama_folder, cwd / "tiny:1")
    [ref] = resolve_model("tiny:1")
    assert ref.name == str((cwd / "tiny:1").resolve()) and ref.step is None
    assert load_model("tiny:1").info.source == "local folder"
    monkeypatch.setattr(reference, "hub_reachable", lambda timeout=3.0: False)
    for entry in ("minilmm", "no-such-model-name"):
        for read in (resolve_model, load_model):
            with pytest.raises(UnknownNameError, match=f"unknown model '{entry}'"):
                read(entry)


def test_a_single_load_refuses_a_glob(cwd):
    with pytest.raises(WorkbenchError, match="is a checkpoint glob, which names several "
                                             "models"):
        load_model(f"{RUN}/L*:*")
