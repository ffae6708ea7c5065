"""The reference attention against the worked four-token example, invariants and PyTorch's SDPA.

The published numbers come from issue 6 ("the cat was hungry"); each was also checked by
hand from X, W_Q, W_K and W_V, and they all agree with exact arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from workbench.scores.attention import (
    FullyMaskedRowError,
    additive_mask,
    attention,
    attention_scores,
    causal_mask,
    full_mask,
    inverse_permutation,
    masked_softmax,
    permutation_matrix,
    worked_example,
)

THE, CAT, WAS, HUNGRY = range(4)


@pytest.fixture(scope="module")
def ex():
    return worked_example()


def four(values) -> np.ndarray:
    """Round to 4 decimals, as the issue publishes them."""
    return np.round(np.asarray(values, dtype=np.float64), 4)


def test_projections(ex):
    np.testing.assert_array_equal(ex.q[HUNGRY].numpy(), [1, 2, 2])
    np.testing.assert_array_equal(ex.k[CAT].numpy(), [1, 1, 4])
    # the whole of Q, K, V, by hand: rows of X pick and add rows of each W
    np.testing.assert_array_equal(ex.q.numpy(), [[1, 1, 0], [2, 2, 2], [2, 1, 2], [1, 2, 2]])
    np.testing.assert_array_equal(ex.k.numpy(), [[2, 1, 1], [1, 1, 4], [2, 0, 2], [2, 1, 3]])
    np.testing.assert_array_equal(ex.v.numpy(), [[3, 1, 3], [0, 3, 1], [2, 2, 1], [1, 3, 2]])


def test_raw_scores(ex):
    np.testing.assert_array_equal(
        ex.scores.numpy(), [[3, 2, 2, 3], [8, 12, 8, 12], [7, 11, 8, 11], [6, 11, 6, 10]])
    np.testing.assert_allclose(ex.scaled.numpy(), ex.scores.numpy() / math.sqrt(3))


def test_unmasked_weights_and_output(ex):
    np.testing.assert_array_equal(four(ex.weights[HUNGRY]), [0.0333, 0.5978, 0.0333, 0.3356])
    np.testing.assert_array_equal(four(ex.output[HUNGRY]), [0.5022, 2.9000, 1.4022])


def test_causal_weights_and_output(ex):
    np.testing.assert_array_equal(four(ex.causal_weights[WAS]), [0.0778, 0.7836, 0.1386, 0])
    np.testing.assert_array_equal(four(ex.causal_output[CAT]), [0.2710, 2.8193, 1.1807])
    # the first token sees only itself, so its output is V's first row exactly
    np.testing.assert_array_equal(ex.causal_output[THE].numpy(), ex.v[THE].numpy())
    np.testing.assert_array_equal(ex.causal_output[THE].numpy(), [3, 1, 3])
    # the last token sees everything: its causal row is its unmasked row
    np.testing.assert_allclose(ex.causal_weights[HUNGRY], ex.weights[HUNGRY], rtol=0, atol=1e-15)


def test_shuffling_the_input_shuffles_the_output(ex):
    assert ex.shuffled_tokens == ("hungry", "cat", "the", "was")
    perm = torch.tensor(ex.shuffle)
    np.testing.assert_array_equal(four(ex.shuffled_output), four(ex.output[perm]))
    np.testing.assert_allclose(ex.shuffled_output, permutation_matrix(perm) @ ex.output,
                               rtol=0, atol=1e-12)
    np.testing.assert_array_equal(four(ex.shuffled_output[0]), [0.5022, 2.9000, 1.4022])
    # ... but not under a causal mask: "hungry" first now sees only itself
    shuffled_x = ex.x[perm]
    causal = attention(shuffled_x @ ex.w_q, shuffled_x @ ex.w_k, shuffled_x @ ex.w_v,
                       causal_mask(4))
    assert not torch.allclose(causal.output, ex.causal_output[perm], atol=1e-3)


@pytest.mark.parametrize("which", ["weights", "causal_weights"])
def test_rows_sum_to_one_and_visible_weights_are_positive(ex, which):
    weights = getattr(ex, which)
    np.testing.assert_allclose(weights.sum(-1).numpy(), np.ones(4), rtol=0, atol=1e-12)
    visible = causal_mask(4) if which == "causal_weights" else full_mask(4)
    assert bool((weights[visible] > 0).all())
    assert bool((weights[~visible] == 0).all())


def test_a_fully_masked_row_is_an_error_not_nan():
    scores = torch.randn(3, 3)
    mask = causal_mask(3)
    mask[1] = False
    with pytest.raises(FullyMaskedRowError, match="see no key") as info:
        masked_softmax(scores, mask)
    assert "[1]" in str(info.value)
    # the naive version silently produces NaN, which is what the error prevents
    naive = torch.softmax(scores.masked_fill(~mask, -torch.inf), dim=-1)
    assert bool(naive[1].isnan().all())
    with pytest.raises(FullyMaskedRowError):
        attention(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 5),
                  torch.zeros(2, 3, 3, dtype=torch.bool))


def test_causal_mask_shapes():
    np.testing.assert_array_equal(causal_mask(3).int().numpy(), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    # two cached keys in front: the queries are the last three positions
    np.testing.assert_array_equal(causal_mask(3, 5).int().numpy(),
                                  [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError):
        causal_mask(4, 3)


def test_additive_mask_matches_hugging_face_convention():
    add = additive_mask(causal_mask(3))
    assert add[0, 0] == 0 and add[0, 1] == torch.finfo(torch.float32).min


def test_permutation_helpers():
    perm = torch.tensor([2, 0, 3, 1])
    x = torch.arange(8.0).reshape(4, 2)
    np.testing.assert_array_equal(permutation_matrix(perm, torch.float32) @ x, x[perm])
    np.testing.assert_array_equal(x[perm][inverse_permutation(perm)], x)


@pytest.mark.parametrize("causal", [False, True])
def test_agrees_with_pytorch_scaled_dot_product_attention(causal):
    """An independent implementation: torch's fused SDPA, batched over heads."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    ours = attention(q, k, v, causal_mask(7) if causal else None)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(ours.output, theirs, rtol=0, atol=1e-12)
    # an explicit boolean mask means the same thing in both
    mask = torch.rand(7, 7, generator=gen) > 0.5
    mask |= torch.eye(7, dtype=torch.bool)  # every query sees at least itself
    np.testing.assert_allclose(attention(q, k, v, mask).output,
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               rtol=0, atol=1e-12)


def test_scores_are_unscaled_dot_products():
    q, k = torch.randn(5, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    np.testing.assert_allclose(attention_scores(q, k), np.einsum("qd,kd->qk", q, k), atol=1e-12)
