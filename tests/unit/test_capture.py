"""Capturing every head's pattern on one prompt: Hugging Face's own attentions, and the long
rows a run stores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.inputs.prompts import Prompt
from workbench.recording.capture import head_patterns, pattern_rows

PROMPT = Prompt(text="the cat sat on the mat and the dog sat on the rug")


@pytest.mark.parametrize("which", ["llama", "bert"])
def test_head_patterns_are_huggingface_attentions(which, request):
    model = request.getfixturevalue(which)
    hf_model = request.getfixturevalue(f"{which}_hf")
    ids, types = model.encode(PROMPT)
    kwargs = {"token_type_ids": torch.tensor([types])} if types is not None else {}
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids]), output_attentions=True, **kwargs).attentions
    stack = head_patterns(model, PROMPT)
    n = len(ids)
    assert stack.shape == (model.info.n_layers, model.info.n_heads, n, n)
    assert stack.dtype == torch.float32
    for layer in range(model.info.n_layers):
        np.testing.assert_allclose(stack[layer].numpy(), ref[layer][0].numpy(), atol=1e-6)


def test_pattern_rows_hold_every_visible_pair_once():
    n_layers, n_heads, n = 2, 3, 4
    # a stack whose every entry tells where it sits: 1000 l + 100 h + 10 q + k
    grid = np.indices((n_layers, n_heads, n, n))
    stack = torch.tensor(1000 * grid[0] + 100 * grid[1] + 10 * grid[2] + grid[3],
                         dtype=torch.float32)
    rows = pattern_rows(stack)
    assert list(rows.columns) == ["layer", "head", "query", "key", "weight"]
    assert len(rows) == n_layers * n_heads * n * (n + 1) // 2
    assert (rows.key <= rows["query"]).all()
    want = 1000 * rows.layer + 100 * rows["head"] + 10 * rows["query"] + rows.key
    np.testing.assert_array_equal(rows.weight, want.astype(np.float32))
    assert not rows.duplicated(["layer", "head", "query", "key"]).any()
    full = pattern_rows(stack, causal=False)
    assert len(full) == stack.numel()
    np.testing.assert_array_equal(full.weight.to_numpy().reshape(stack.shape), stack.numpy())
    assert {str(t) for t in rows.dtypes} == {"int16", "float32"}


def test_causal_rows_of_a_causal_model_keep_all_the_weight(llama):
    rows = pattern_rows(head_patterns(llama, PROMPT))
    sums = rows.groupby(["layer", "head", "query"]).weight.sum()
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)
