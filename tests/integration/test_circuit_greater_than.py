"""Which bundled models the circuit experiment's greater-than task takes: each tokenizer,
read alone, against the task's need of one token per two-digit year after " 17". None of
the bundled tokenizers meets it (smollm2's and gemma3's write each digit as a token,
minilm's the whole year), and each is refused before its weights load: the decoders for
their tokenizers, the encoder minilm for having no next token at all."""

from __future__ import annotations

import pytest

from workbench.core.errors import WorkbenchError
from workbench.harness import experiment as harness
from workbench.harness.experiment import run_experiment
from workbench.inputs.greater_than import year_tokens
from workbench.models.load import load_tokenizer
from workbench.store.runs import RunStore

TOKENIZERS = [
    ("smollm2", "' 1700' is ['Ġ', '1', '7', '0', '0']"),
    ("gemma3", "' 1700' is ['▁', '1', '7', '0', '0']"),
    ("minilm", "' 1700' is ['1700']"),
]


@pytest.mark.parametrize(("model", "found"), TOKENIZERS)
def test_no_bundled_tokenizer_has_the_year_tokens(model, found):
    tokenizer = load_tokenizer(model)  # fetched: read without the weights
    assert tokenizer is not None
    with pytest.raises(WorkbenchError) as err:
        year_tokens(tokenizer, model)
    message = str(err.value)
    assert "\n" not in message and f"{model}'s tokenizer gives 0 of 100" in message
    assert found in message


@pytest.mark.parametrize(("model", "said"), [
    *((model, f"{model}'s tokenizer gives 0 of 100") for model, _ in TOKENIZERS[:2]),
    ("minilm", "needs a causal model; minilm is bidirectional"),
])
def test_bundled_models_are_refused_before_their_weights_load(model, said, tmp_path,
                                                               monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(harness, "load_model", no_load)
    with pytest.raises(WorkbenchError) as err:
        run_experiment("circuit", model, {"task": "greater-than"}, runs_dir=tmp_path)
    message = str(err.value)
    assert "\n" not in message and said in message
    assert not RunStore(tmp_path).runs()
