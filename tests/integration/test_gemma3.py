"""gemma3 is the published Gemma 3 270M: its checksums, its shape, its layer types, and a
continuation of "The capital of France is" that plain Hugging Face gives too.

References: the published SHA-256 of the GGUF and the model card's figures (268,098,176
parameters, 18 layers of which 5, 11 and 17 are global and the others slide over 512
tokens, 4 query heads and 1 KV head of dimension 256, a 32,768-token context); greedy
decoding by plain Hugging Face eager attention on the cached folder, without the bridge.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from workbench.core import checksums
from workbench.inputs.prompts import Prompt
from workbench.models import cache, zoo

PUBLISHED_GGUF = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PARAMETERS = 268_098_176
GLOBAL = (5, 11, 17)


@pytest.fixture(scope="module")
def plain(gemma3):
    """The cached folder loaded by plain Hugging Face, eager attention, no bridge."""
    return AutoModelForCausalLM.from_pretrained(str(cache.hf_dir("gemma3")),
                                                attn_implementation="eager").eval()


def test_the_cache_holds_the_published_gguf_and_the_terms(gemma3):
    manifest = cache.verify_cached("gemma3")
    spec = zoo.MODELS.get("gemma3")
    assert manifest.weights_sha256 == spec.weights.sha256 == PUBLISHED_GGUF
    assert checksums.sha256_file(cache.model_dir("gemma3") / spec.weights.file) == PUBLISHED_GGUF
    assert (cache.model_dir("gemma3") / spec.weights.file).stat().st_size == 253_113_024
    assert gemma3.info.checksum == PUBLISHED_GGUF
    terms = cache.terms_file("gemma3")
    assert terms is not None and "Gemma Terms of Use" in terms.read_text(encoding="utf-8")
    config = json.loads((cache.hf_dir("gemma3") / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]


def test_gemma3_has_the_model_cards_shape(gemma3, plain):
    info = gemma3.info
    assert sum(p.numel() for p in plain.parameters()) == PARAMETERS
    assert (info.architecture, info.n_layers, info.n_heads, info.n_kv_heads, info.d_head,
            info.n_ctx) == ("Gemma3ForCausalLM", 18, 4, 1, 256, 32_768)
    assert info.causal and info.has_lm_head and info.positions == "rotary"
    assert gemma3.str_tokens([info.bos_token_id]) == ["<bos>"]


def test_gemma3_layer_types(gemma3, plain):
    info = gemma3.info
    assert info.global_layers == GLOBAL and info.sliding_window == 512
    assert info.sliding_layers == tuple(i for i in range(18) if i not in GLOBAL)
    assert info.layer_types == zoo.MODELS.get("gemma3").layer_types
    assert [t == "sliding" for t in info.layer_types] == [
        t == "sliding_attention" for t in plain.config.layer_types]
    assert all(info.window(i) == 512 for i in info.sliding_layers)
    assert all(info.window(i) is None for i in GLOBAL)


def _greedy(step, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(step(torch.tensor([ids]))[0, -1].argmax()))
    return ids


def test_gemma3_continues_the_capital_of_france_as_plain_huggingface_does(gemma3, plain):
    ids, _ = gemma3.encode(Prompt(text="The capital of France is"))
    assert ids[0] == gemma3.info.bos_token_id
    ours = _greedy(gemma3.logits, ids, 6)
    reference = _greedy(lambda x: plain(x).logits, ids, 6)
    assert ours == reference
    continuation = gemma3.tokenizer.decode(ours[len(ids):])
    assert continuation.strip() and continuation.isprintable()
    with torch.inference_mode():
        top = gemma3.logits(torch.tensor([ids]))[0, -1].topk(5).indices.tolist()
    assert " Paris" in gemma3.tokenizer.batch_decode([[t] for t in top])
    ids, _ = gemma3.encode(Prompt(text="The capital of France is Paris. The capital of "
                                       "Germany is"))
    assert gemma3.tokenizer.decode(_greedy(gemma3.logits, ids, 1)[-1:]) == " Berlin"
