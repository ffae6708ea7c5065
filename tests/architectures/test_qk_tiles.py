"""Every weight from stored queries and keys, on every family the blocked path supports.

Reference: the blocked pass's own weights (which ``test_blocked.py`` checks against the
bridge's eager pattern). Each prompt of a right-padded batch is rebuilt from its own
tokens' queries and keys (:class:`~workbench.recording.qk.QKLayer`), with the mask the
model's facts describe (causal or not, each layer's window), and every weight of every
head must agree within 1e-6 (float32): rows that mix seen and unseen keys, the window's
edge, soft-capped, grouped-query and ALiBi (Bloom) families included. Queries and keys
rounded to a half dtype keep each weight within the bound derived in
:meth:`~workbench.recording.qk.QKLayer.score_error`.
"""

from __future__ import annotations

import pytest
import torch

from tests.architectures.families import BUILDERS
from tests.architectures.test_blocked import FAMILIES, _batch
from workbench.models import blocked as blocked_attention
from workbench.models.base import DTYPES
from workbench.models.fused import HALF_EPSILON
from workbench.recording.qk import Mask, QKLayer, from_stored
from workbench.recording.writer import _storable


def _pass(model, ids, mask) -> tuple[list, list[torch.Tensor]]:
    """The blocked pass's score inputs and its weights placed as whole patterns."""
    n_layers, (batch, n) = model.info.n_layers, ids.shape
    given, dense = [], [torch.zeros(batch, model.info.n_heads, n, n) for _ in range(n_layers)]

    def place(block):
        dense[block.layer][:, :, block.q0:block.q1, block.k0:block.k1] = block.weights.float()
    with torch.inference_mode(), blocked_attention.blocked(model, place, block=8,
                                                           scores=given.append):
        model.bridge(ids, attention_mask=mask, return_type=None)
    return given, dense


@pytest.mark.parametrize("family", FAMILIES)
def test_every_weight_is_rebuilt_from_queries_and_keys(families, family):
    model = families.model(family)
    ids, mask = _batch(21, len(families.tokenizer(family)), seed=3)
    assert blocked_attention.scores_support(model) is None
    given, dense = _pass(model, ids, mask)
    assert [g.layer for g in given] == list(range(model.info.n_layers))
    lengths = mask.sum(-1).tolist()
    for inputs in given:
        layer_mask = Mask(causal=bool(model.info.causal), window=model.info.window(inputs.layer))
        for b, n in enumerate(lengths):
            layer = QKLayer.of(inputs.queries[b, :, :n], inputs.keys[b, :, :n],
                               scale=inputs.scale, softcap=inputs.softcap, mask=layer_mask,
                               slopes=inputs.slopes)
            for head in range(model.info.n_heads):
                torch.testing.assert_close(layer.tile(head), dense[inputs.layer][b, head, :n, :n],
                                           atol=1e-6, rtol=0,
                                           msg=f"layer {inputs.layer} prompt {b} head {head}")


def test_the_families_cover_what_the_format_must_describe(families):
    """Soft-capping, grouped-query heads, a sliding window, q/k norms and an encoder are
    each among the families rebuilt above."""
    kinds = {f: BUILDERS[f][0] for f in FAMILIES}
    assert {"gemma-2", "gemma-3", "llama", "bert", "gpt-neo"} <= set(kinds)
    gemma2 = families.model("gemma-2")
    assert gemma2.bridge.blocks[0].attn.original_component.attn_logit_softcapping
    assert families.model("llama").info.n_kv_heads < families.model("llama").info.n_heads
    assert families.model("gemma-3").info.window(0) is not None
    assert not families.model("bert").info.causal


def test_a_soft_cap_that_bites_is_rebuilt(families):
    """Tiny random scores (a few thousandths) are far below Gemma 2's cap of 50, where
    ``cap * tanh(s / cap)`` is ``s`` to within the tolerance; with a cap near the scores'
    own size it bites, and the tiles still agree (and would not without it)."""
    model = families.model("gemma-2")
    modules = [block.attn.original_component for block in model.bridge.blocks]
    caps = [m.attn_logit_softcapping for m in modules]
    ids, mask = _batch(21, len(families.tokenizer("gemma-2")), seed=3)
    try:
        for m in modules:
            m.attn_logit_softcapping = 0.002
        given, dense = _pass(model, ids, mask)
    finally:
        for m, cap in zip(modules, caps, strict=True):
            m.attn_logit_softcapping = cap
    inputs, n = given[1], int(mask[0].sum())
    assert inputs.softcap == 0.002
    capped = QKLayer.of(inputs.queries[0], inputs.keys[0], scale=inputs.scale, softcap=0.002,
                        mask=Mask(causal=True))
    uncapped = QKLayer.of(inputs.queries[0], inputs.keys[0], scale=inputs.scale, softcap=None,
                          mask=Mask(causal=True))
    for head in range(model.info.n_heads):
        torch.testing.assert_close(capped.tile(head), dense[1][0, head, :n, :n], atol=1e-6, rtol=0)
    assert max(float((uncapped.tile(h) - dense[1][0, h]).abs().max())
               for h in range(model.info.n_heads)) > 1e-5


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
# tiny random scores (llama's a few hundredths, gemma-3's about 0.5 after its q/k norms)
# would hide any rounding: the layers' scale times a power of two (restored exactly) makes
# the largest about 8, as a trained model's are; gemma-2's cap of 1 bites at that size
@pytest.mark.parametrize(("family", "sharper", "cap"), [("llama", 2 ** 7, None),
                                                        ("gemma-2", 2 ** 9, 1.0),
                                                        ("gemma-3", 2 ** 4, None)])
def test_rounded_queries_and_keys_keep_each_weight_within_the_bound(families, family, sharper,
                                                                    cap, dtype):
    """Queries and keys stored in a half dtype, with the pass's own float32 log-sum-exps:
    each weight ``w`` of the dense pattern is rebuilt within ``w (e^eta_i - 1)``, with
    ``eta_i`` of :meth:`QKLayer.score_error` at the dtype's machine epsilon (derived there),
    plus the 1e-6 that the exact tiles meet. Grouped-query causal heads (llama), a soft-cap
    that bites and a sliding window (gemma-2), q/k norms and a window (gemma-3), and a
    right-padded prompt in each batch."""
    model = families.model(family)
    modules = [block.attn.original_component for block in model.bridge.blocks]
    kept = [(m.scaling, m.attn_logit_softcapping if cap else None) for m in modules]
    ids, mask = _batch(21, len(families.tokenizer(family)), seed=3)
    try:
        for m in modules:
            m.scaling = m.scaling * sharper
            if cap is not None:
                m.attn_logit_softcapping = cap
        given, dense = _pass(model, ids, mask)
    finally:
        for m, (scaling, softcap) in zip(modules, kept, strict=True):
            m.scaling = scaling
            if cap is not None:
                m.attn_logit_softcapping = softcap
    eps, moved = HALF_EPSILON[DTYPES[dtype]], 0.0
    for inputs in given:
        layer_mask = Mask(causal=bool(model.info.causal), window=model.info.window(inputs.layer))
        for b, n in enumerate(mask.sum(-1).tolist()):
            q, k = inputs.queries[b, :, :n], inputs.keys[b, :, :n]
            exact = QKLayer.of(q, k, scale=inputs.scale, softcap=inputs.softcap,
                               mask=layer_mask, slopes=inputs.slopes)
            rounded = QKLayer(from_stored(_storable(q, dtype)), from_stored(_storable(k, dtype)),
                              exact.lse,
                              exact.scale, exact.softcap, layer_mask, exact.slopes)
            eta = exact.score_error(eps)
            for head in range(model.info.n_heads):
                want = dense[inputs.layer][b, head, :n, :n]
                error = (rounded.tile(head) - want).abs()
                assert torch.all(error <= want * torch.expm1(eta[head, :, None]) + 1e-6), \
                    f"layer {inputs.layer} prompt {b} head {head}"
                moved = max(moved, float(error.max()))
    assert moved > 1e-4  # the rounding did move the weights: the bound is not idle
