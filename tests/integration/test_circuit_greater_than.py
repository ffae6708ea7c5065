"""Which bundled models the circuit experiment's greater-than task takes: each tokenizer,
read alone, against the task's need of one token per two-digit year after " 17". None of
the bundled tokenizers meets it (smollm2's and gemma3's write each digit as a token,
minilm's the whole year), so each is refused before its weights load."""

from __future__ import annotations

import pytest

from workbench.core.errors import WorkbenchError
from workbench.harness import experiment as harness
from workbench.harness.experiment import run_experiment
from workbench.models.load import load_tokenizer
from workbench.store.runs import RunStore


@pytest.mark.parametrize(("model", "found"), [
    ("smollm2", "' 1700' is ['Ġ', '1', '7', '0', '0']"),
    ("gemma3", "' 1700' is ['▁', '1', '7', '0', '0']"),
    ("minilm", "' 1700' is ['1700']"),
])
def test_bundled_models_are_refused_before_their_weights_load(model, found, tmp_path,
                                                               monkeypatch):
    assert load_tokenizer(model) is not None  # fetched: read without the weights

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(harness, "load_model", no_load)
    with pytest.raises(WorkbenchError) as err:
        run_experiment("circuit", model, {"task": "greater-than"}, runs_dir=tmp_path)
    message = str(err.value)
    assert "\n" not in message and f"{model}'s tokenizer gives 0 of 100" in message
    assert found in message
    assert not RunStore(tmp_path).runs()
