"""Every weight from stored queries and keys, on every family the blocked path supports.

Reference: the blocked pass's own weights (which ``test_blocked.py`` checks against the
bridge's eager pattern). Each prompt of a right-padded batch is rebuilt from its own
tokens' queries and keys (:class:`~workbench.recording.qk.QKLayer`), with the mask the
model's facts describe (causal or not, each layer's window), and every weight of every
head must agree within 1e-6 (float32): rows that mix seen and unseen keys, the window's
edge, soft-capped, grouped-query and ALiBi (Bloom) families included.
"""

from __future__ import annotations

import pytest
import torch

from tests.architectures.families import BUILDERS
from tests.architectures.test_blocked import FAMILIES, _batch
from workbench.models import blocked as blocked_attention
from workbench.recording.qk import Mask, QKLayer


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
