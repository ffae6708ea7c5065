"""Model folders are checked past their headers: sizes that are not positive, a config that
does not describe its weights, a folder without a tokenizer are refused in one line before
a run exists; weights that are not finite are loaded with a loud warning."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from tests.robustness.test_cli_inputs import check_refused
from tests.tiny import cli
from workbench.core.errors import WorkbenchError
from workbench.models.load import load_model


def _copy(llama_folder, tmp_path, **config_changes):
    folder = tmp_path / "model"
    shutil.copytree(llama_folder, folder)
    if config_changes:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **config_changes}))
    return folder


SIZES = [
    pytest.param({"num_attention_heads": 0}, "num_attention_heads is 0", id="heads-zero"),
    pytest.param({"num_attention_heads": -12}, "num_attention_heads is -12",
                 id="heads-negative"),
    pytest.param({"num_key_value_heads": 0}, "num_key_value_heads is 0", id="kv-heads-zero"),
    pytest.param({"num_hidden_layers": 0}, "num_hidden_layers is 0", id="layers-zero"),
    pytest.param({"hidden_size": -1}, "hidden_size is -1", id="width-negative"),
    pytest.param({"num_attention_heads": 2.5}, "num_attention_heads is 2.5",
                 id="heads-fraction"),
    pytest.param({"num_attention_heads": "4"}, "num_attention_heads is '4'", id="heads-text"),
    pytest.param({"num_attention_heads": True}, "num_attention_heads is True",
                 id="heads-bool"),
    pytest.param({"vocab_size": 0}, "vocab_size is 0", id="vocab-zero"),
    pytest.param({"max_position_embeddings": 0}, "max_position_embeddings is 0",
                 id="context-zero"),
]


@pytest.mark.parametrize(("changes", "fragment"), SIZES)
def test_a_size_that_is_not_positive_is_refused_in_one_line(capsys, runs_dir, llama_folder,
                                                            tmp_path, changes, fragment):
    folder = _copy(llama_folder, tmp_path, **changes)
    result = cli(capsys, "run", "head-overview", "--model", str(folder))
    check_refused(result, 2, fragment, runs_dir)
    assert "a model's sizes must be positive whole numbers" in result[2]


@pytest.mark.parametrize("changes", [{"num_hidden_layers": 1}, {"num_attention_heads": 2,
                                                                "num_key_value_heads": 1}])
def test_a_config_that_does_not_describe_its_weights_is_refused(capsys, runs_dir,
                                                               llama_folder, tmp_path,
                                                               changes):
    folder = _copy(llama_folder, tmp_path, **changes)
    code, _, err = cli(capsys, "run", "head-overview", "--model", str(folder))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert str(folder) in err and "Traceback" not in err


def test_fewer_layers_in_the_config_than_in_the_weights_are_named(llama_folder, tmp_path):
    folder = _copy(llama_folder, tmp_path, num_hidden_layers=1)
    with pytest.raises(WorkbenchError, match=r"holds \d+ weights the config has no place "
                                             r"for \(model\.layers\.1\."):
        load_model(str(folder))


@pytest.mark.parametrize("kept", [[], ["tokenizer_config.json"]],
                         ids=["no-tokenizer-files", "only-its-config"])
def test_a_folder_without_a_tokenizer_is_refused(capsys, runs_dir, llama_folder, tmp_path,
                                                 kept):
    folder = _copy(llama_folder, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if name not in kept:
            (folder / name).unlink()
    result = cli(capsys, "run", "head-overview", "--model", str(folder))
    check_refused(result, 2, "has no tokenizer; expected tokenizer.json", runs_dir)


def test_weights_that_are_not_finite_load_with_a_warning_naming_them(llama_hf, tokenizer,
                                                                     tmp_path, caplog):
    from tests.tiny import save_folder, tiny_llama_hf

    damaged = tiny_llama_hf(len(tokenizer))
    with torch.no_grad():
        damaged.model.layers[1].self_attn.q_proj.weight[0, 0] = float("nan")
        damaged.model.layers[0].mlp.up_proj.weight[1, 1] = float("inf")
    folder = save_folder(damaged, tokenizer, tmp_path / "nan")
    with caplog.at_level(logging.WARNING, logger="workbench.models.hf"):
        load_model(str(folder))
    (record,) = [r for r in caplog.records if "not be finite" in r.getMessage()]
    assert "2 weight tensors hold NaN or infinite values" in record.getMessage()
    assert "model.layers.1.self_attn.q_proj.weight" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="workbench.models.hf"):
        load_model(str(save_folder(llama_hf, tokenizer, tmp_path / "fine")))
    assert not [r for r in caplog.records if "not be finite" in r.getMessage()]
