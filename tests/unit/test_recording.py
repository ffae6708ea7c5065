"""Recordings hold the model's own activations, survive padding, and detect damage."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import zarr

from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.recording.reader import Recording
from workbench.recording.writer import FLOAT16_MAX, _storable, record

TEXTS = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog by the river",
         "bread"]


def hf_reference(hf_model, model, prompt):
    """Attentions and hidden states from plain Hugging Face eager attention, unpadded."""
    ids, types = model.encode(prompt)
    kwargs = {"token_type_ids": torch.tensor([types])} if types is not None else {}
    with torch.no_grad():
        out = hf_model(torch.tensor([ids]), output_attentions=True, output_hidden_states=True,
                       **kwargs)
    return out


@pytest.mark.parametrize("which", ["llama", "bert"])
def test_patterns_and_residuals_match_huggingface(which, request, tmp_path):
    model = request.getfixturevalue(which)
    hf_model = request.getfixturevalue(f"{which}_hf")
    prompts = [Prompt(text=t) for t in TEXTS]
    rec = record(model, prompts, tmp_path / "rec", store_dtype="float32")
    for i, prompt in enumerate(prompts):
        ref = hf_reference(hf_model, model, prompt)
        for layer in range(model.info.n_layers):
            np.testing.assert_allclose(rec.pattern(i, layer), ref.attentions[layer][0].numpy(),
                                       atol=1e-6)
            # hidden_states[l] is the input of block l
            np.testing.assert_allclose(rec.resid(i, layer), ref.hidden_states[layer][0].numpy(),
                                       atol=1e-5)
        final = torch.tensor(rec.resid(i, model.info.n_layers))
        if which == "llama":  # HF's last hidden state is after the final norm; ours is before
            final = hf_model.model.norm(final)
        np.testing.assert_allclose(final.detach().numpy(), ref.hidden_states[-1][0].numpy(),
                                   atol=1e-5)


def test_padded_batches_equal_single_prompts(llama, tmp_path):
    prompts = [Prompt(text=t) for t in TEXTS]
    batched = record(llama, prompts, tmp_path / "batched", store_dtype="float32",
                     max_batch_tokens=10_000)
    for i, prompt in enumerate(prompts):
        single = record(llama, [prompt], tmp_path / f"single{i}", store_dtype="float32")
        assert batched.tokens(i) == single.tokens(0)
        for layer in range(llama.info.n_layers):
            np.testing.assert_allclose(batched.pattern(i, layer), single.pattern(0, layer),
                                       atol=1e-6)


def test_recording_shapes_tokens_and_row_sums(bert, tmp_path):
    prompts = [Prompt(text="the cat sat", pair="on the mat"), Prompt(text="bread")]
    rec = record(bert, prompts, tmp_path / "rec")
    assert rec.tokens(0)[0] == "[CLS]" and rec.tokens(0)[-1] == "[SEP]"
    assert rec.tokens(0).count("[SEP]") == 2
    n = len(rec.tokens(1))
    assert rec.pattern(1, 0).shape == (bert.info.n_heads, n, n)
    assert rec.pattern(1, 1, head=2).shape == (n, n)
    assert rec.resid(1, 2).shape == (n, bert.info.d_model)
    np.testing.assert_allclose(rec.pattern(0, 1).sum(-1), 1.0, atol=2e-3)  # float16 storage


def test_float16_overflow_falls_back_to_float32():
    big = torch.tensor([[1.0, 7e4], [3.0, -2.0]])
    assert _storable(big, "float16").dtype == np.float32
    np.testing.assert_array_equal(_storable(big, "float16"), big.numpy())
    small = torch.tensor([[1.0, FLOAT16_MAX]])
    assert _storable(small, "float16").dtype == np.float16


def test_large_residuals_are_stored_exactly_not_as_inf(llama_hf, tokenizer, tmp_path):
    from tests import tiny

    model = tiny.wrap(llama_hf, tokenizer, "loud")
    embed = model.bridge.original_model.model.embed_tokens.weight
    with torch.no_grad():
        embed.mul_(1e7)  # entries of about 2e5, beyond float16's 65504
    rec = record(model, [Prompt(text="the cat")], tmp_path / "rec")
    boundary0 = rec.resid(0, 0)
    assert np.abs(boundary0).max() > FLOAT16_MAX
    ids = model.encode(Prompt(text="the cat"))[0]
    np.testing.assert_array_equal(boundary0, embed[ids].detach().numpy())
    group = zarr.open_group(str(tmp_path / "rec" / "recording.zarr"), mode="r")
    assert group["resid/B000"].dtype == np.float32 and group["attn/L000"].dtype == np.float16


def test_truncated_or_changed_files_are_detected(llama, tmp_path):
    rec = record(llama, [Prompt(text=t) for t in TEXTS], tmp_path / "rec")
    rec.verify()
    victim = tmp_path / "rec" / "recording.zarr" / "attn" / "L001" / "c" / "1" / "0" / "0" / "0"
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=re.escape(str(victim))):  # names the chunk
        Recording.open(tmp_path / "rec").verify()
    with pytest.raises(ChecksumError, match="a chunk is damaged"):  # its CRC-32C fails
        Recording.open(tmp_path / "rec").pattern(1, 1)
    victim.write_bytes(bytes(data[:-2]))
    with pytest.raises(ChecksumError, match="damaged"):
        Recording.open(tmp_path / "rec")


def test_bad_requests_are_clear_errors(llama, tmp_path):
    rec = record(llama, [Prompt(text="the cat")], tmp_path / "rec")
    with pytest.raises(WorkbenchError, match="layer 9 is out of range"):
        rec.pattern(0, 9)
    with pytest.raises(WorkbenchError, match="prompt 3"):
        rec.tokens(3)
    with pytest.raises(WorkbenchError, match="empty"):
        record(llama, [Prompt(text="   ")], tmp_path / "empty")
    with pytest.raises(WorkbenchError, match="context of 512"):
        record(llama, [Prompt(text="the cat sat " * 200)], tmp_path / "long")
    with pytest.raises(WorkbenchError, match="no recording"):
        Recording.open(tmp_path)


def test_patterns_only_recording(llama, tmp_path):
    rec = record(llama, [Prompt(text="the cat")], tmp_path / "rec", include_resid=False)
    assert not rec.has_resid and rec.pattern(0, 1).shape[0] == llama.info.n_heads
    assert not (tmp_path / "rec" / "resid").exists()
    with pytest.raises(WorkbenchError, match="attention patterns only"):
        rec.resid(0, 0)


@pytest.mark.parametrize(("patterns", "resid", "attention"), [
    ("dense", True, "blocked"), ("topk", False, "blocked"), ("dense", False, "dense"),
    ("none", True, "auto")])
def test_the_bar_of_one_prompt_moves_layer_by_layer(llama, tmp_path, patterns, resid,
                                                    attention):
    from tests.unit.test_progress import Recorder
    from workbench.core import progress

    prompt = Prompt(text=" ".join(TEXTS))
    n = len(llama.encode(prompt)[0])
    rec = Recorder()
    progress.render_with(rec)
    try:
        record(llama, [prompt], tmp_path / "rec", patterns=patterns, include_resid=resid,
               attention=attention)
    finally:
        progress.render_with(None)
    desc = "recording (layers x query rows)"
    done = [e[4] for e in rec.of(desc) if e[0] == "update"]
    # one prompt, one batch: the bar still moves at every layer, to layers x tokens
    assert done[-1] == llama.info.n_layers * n
    assert len(set(done)) >= llama.info.n_layers
    assert done == sorted(done)
