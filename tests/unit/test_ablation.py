"""Ablating listed heads, and the random same-layer control."""

from __future__ import annotations

import random

import pytest
import torch

from tests import tiny
from workbench.core.errors import WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.interventions.ablation import ablated, random_same_layer
from workbench.interventions.masks import head_means
from workbench.recording import hooks

PROMPT = Prompt(text="the cat sat on the mat")


def logits(model):
    ids = torch.tensor([model.encode(PROMPT)[0]])
    with torch.inference_mode():
        return model.bridge(ids)


def test_random_same_layer_draws_other_heads_of_the_same_layers():
    chosen, avoid = [(0, 0), (0, 3), (2, 1)], [(2, 2)]
    rng = random.Random(0)
    for _ in range(50):
        picked = random_same_layer(chosen, avoid, 4, rng)
        assert [layer for layer, _ in picked] == [0, 0, 2]
        assert not set(picked) & (set(chosen) | set(avoid))
        assert len(set(picked)) == len(picked)
    again = [random_same_layer(chosen, avoid, 4, random.Random(7)) for _ in range(2)]
    assert again[0] == again[1]  # the seed decides the draw


def test_random_same_layer_says_when_a_layer_has_no_head_left():
    with pytest.raises(WorkbenchError, match="layer 0 has no head left"):
        random_same_layer([(0, 0), (0, 1), (0, 2)], [(0, 3)], 4, random.Random(0))


def test_ablating_no_heads_changes_nothing_bit_for_bit(llama):
    before = logits(llama)
    for kind in ("zero", "mean"):
        with ablated(llama, [], kind=kind):
            assert torch.equal(logits(llama), before)


def test_zero_ablation_removes_the_heads_output_projection_slice(llama, llama_hf, tokenizer):
    heads = [(0, 1), (1, 3)]
    before = logits(llama)
    with ablated(llama, heads):
        got = logits(llama)
    assert torch.equal(logits(llama), before)  # the ablation ends with the block
    surgery = tiny.wrap(llama_hf, tokenizer, "surgery")
    d_head = llama.info.d_head
    with torch.no_grad():
        for layer, head in heads:
            o_proj = surgery.bridge.original_model.model.layers[layer].self_attn.o_proj
            o_proj.weight[:, head * d_head:(head + 1) * d_head] = 0
    torch.testing.assert_close(got, logits(surgery), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, before, atol=1e-4)


def test_mean_ablation_puts_the_heads_mean_output_in_its_place(llama):
    means = head_means(llama, [Prompt(text="bread is made from flour water salt and yeast")])
    layer, head = 1, 2

    def replace(z, hook):
        z = z.clone()
        z[:, :, head] = means[layer, head]
        return z

    ids = torch.tensor([llama.encode(PROMPT)[0]])
    with torch.inference_mode(), llama.bridge.hooks(fwd_hooks=[(hooks.z(layer), replace)]):
        want = llama.bridge(ids)
    with ablated(llama, [(layer, head)], kind="mean", means=means):
        torch.testing.assert_close(logits(llama), want, atol=1e-6, rtol=1e-6)
