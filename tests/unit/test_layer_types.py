"""Which layers attend to a sliding window: ModelInfo's layer types, from each family's config.

References: what each config declares (Gemma 3's ``layer_types``, GPT-Neo's
``attention_layers``, Mistral's one ``sliding_window`` for every layer), and the masks
Hugging Face applies: a sliding layer's query puts no weight on a key further back than
its window, a global layer's does.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import transformers as tf

from tests import tiny
from tests.architectures.families import build
from workbench.core.errors import WorkbenchError
from workbench.core.records import RecordError
from workbench.models.hf import layer_spans
from workbench.store.records import ModelInfo


@pytest.fixture(scope="module")
def gemma3(tokenizer):
    """A tiny random Gemma 3 (families.py): layer 0 slides over 8 keys, layer 1 is global."""
    return tiny.wrap(build("gemma-3", len(tokenizer)), tokenizer, "tiny-gemma3")


def test_a_tiny_gemma3_has_one_sliding_and_one_global_layer(gemma3):
    info = gemma3.info
    assert info.layer_types == ("sliding", "global") and info.sliding_window == 8
    assert info.is_sliding(0) and not info.is_sliding(1)
    assert info.window(0) == 8 and info.window(1) is None
    assert info.sliding_layers == (0,) and info.global_layers == (1,)
    with pytest.raises(WorkbenchError, match="layer 2 is not a layer of tiny-gemma3, which "
                                             r"has layers 0\.\.1"):
        info.window(2)


def test_the_sliding_layer_puts_no_weight_beyond_its_window(gemma3, tokenizer):
    """What the layer types say is what plain Hugging Face eager attention does."""
    hf_model = build("gemma-3", len(tokenizer))
    ids = torch.arange(10, 30)[None]  # 20 tokens, more than the window of 8
    with torch.no_grad():
        patterns = hf_model(ids, output_attentions=True).attentions
    query, window = 19, gemma3.info.sliding_window
    beyond = slice(0, query - window + 1)  # keys 0..11: further back than the last 8
    assert patterns[0][0, :, query, beyond].abs().max() == 0
    assert patterns[1][0, :, query, beyond].sum(-1).min() > 0


def test_other_families_are_global_unless_their_config_says_otherwise(tokenizer):
    assert tiny.wrap(build("llama", len(tokenizer)), tokenizer, "l").info.layer_types == (
        "global", "global")
    neo = tiny.wrap(build("gpt-neo", len(tokenizer)), tokenizer, "neo").info
    assert neo.layer_types == ("global", "sliding") and neo.sliding_window == 8
    mistral = tf.MistralConfig(num_hidden_layers=3, sliding_window=16)
    assert layer_spans(mistral, 3) == (("sliding",) * 3, 16)  # one window, every layer
    assert layer_spans(tf.MistralConfig(num_hidden_layers=3, sliding_window=None), 3) == (
        ("global",) * 3, None)
    assert layer_spans(tf.BertConfig(num_hidden_layers=2), 2) == (("global", "global"), None)


def test_a_gemma3_config_written_before_layer_types_reads_its_pattern():
    old = SimpleNamespace(sliding_window=512, sliding_window_pattern=6)
    types, window = layer_spans(old, 18)
    assert window == 512 and [i for i, t in enumerate(types) if t == "global"] == [5, 11, 17]


@pytest.mark.parametrize(("config", "fragment"), [
    pytest.param(SimpleNamespace(layer_types=["chunked_attention"] * 2, sliding_window=8),
                 "layer types chunked_attention are not read", id="chunked"),
    pytest.param(SimpleNamespace(layer_types=["full_attention"] * 3), "layer types 3 are not",
                 id="wrong-count"),
    pytest.param(SimpleNamespace(layer_types=["sliding_attention"] * 2, sliding_window=None),
                 "sliding window of None", id="no-window"),
])
def test_layer_types_the_workbench_cannot_read_are_one_line(config, fragment):
    with pytest.raises(WorkbenchError, match=fragment):
        layer_spans(config, 2)


def test_a_record_written_before_layer_types_loads_as_all_global():
    info = tiny.fake_info(n_layers=3)
    old = {k: v for k, v in info.to_data().items() if k not in ("layer_types", "sliding_window")}
    read = ModelInfo.from_json(json.dumps(old), what="run.json")
    assert read.layer_types == ("global",) * 3 and read.sliding_window is None


@pytest.mark.parametrize(("changes", "fragment"), [
    pytest.param({"layer_types": ["global"]}, "must hold n_layers = 2 values, got 1",
                 id="too-few"),
    pytest.param({"layer_types": ["global", "sliding"], "sliding_window": None},
                 "'sliding_window' must be set exactly when", id="no-window"),
    pytest.param({"sliding_window": 8}, "'sliding_window' must be set exactly when",
                 id="window-without-sliding"),
    pytest.param({"layer_types": ["global", "local"]}, "expected 'global' or 'sliding'",
                 id="unknown-type"),
])
def test_inconsistent_layer_types_are_refused(changes, fragment):
    data = {**tiny.fake_info().to_data(), **changes}
    with pytest.raises(RecordError, match=fragment):
        ModelInfo.from_json(json.dumps(data), what="run.json")


def test_a_table_gets_its_layer_types_and_an_old_one_reads_them_from_its_model():
    import pandas as pd

    from workbench.store.schema import LAYER_TYPE, head_scores, with_layer_types

    assert LAYER_TYPE.name in head_scores("x").names  # every head_scores table has it
    old = pd.DataFrame({"layer": [0, 1, 1], "head": [0, 0, 1], "metric": ["a"] * 3,
                        "score": [0.1, 0.2, 0.3]})  # as written before the column
    got = with_layer_types(old, ("sliding", "global"))
    assert list(got.columns) == ["layer", "head", "layer_type", "metric", "score"]
    assert list(got.layer_type) == ["sliding", "global", "global"]
    assert with_layer_types(got, ("global", "global")) is got  # a column present is kept
    assert "layer_type" not in old.columns  # the frame read is not changed
    info = tiny.fake_info(n_layers=2)  # a run.json of before: every layer global
    assert set(with_layer_types(old, info.layer_types).layer_type) == {"global"}
