"""Hooks that take position information out (workbench.interventions.positions), checked on
the tiny models against what removing it must mean: an identity rotation, position ids
that no longer matter, and RoPE angles that agree with the model's own."""

from __future__ import annotations

import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.interventions.positions import (
    float64_angle_hooks,
    no_rope_hooks,
    zero_position_hooks,
)
from workbench.recording import hooks

IDS = torch.tensor([[0, 5, 17, 42, 8, 99, 23, 61, 7, 12]])


def inputs(model, n=7, seed=0):
    return torch.randn(1, n, model.info.d_model, generator=torch.Generator().manual_seed(seed))


def final_residual(model, fwd=(), **kwargs):
    final = hooks.resid(model.info.n_layers, model.info.n_layers)
    kept, keep = hooks.caching_hooks([final])
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=[*fwd, *keep]):
        model.bridge(IDS, return_type=None, **kwargs)
    return kept[final]


def sublayer_output(model, x, position_embeddings, fwd=()):
    """Layer 0's attention output, the bridge's own causal mask."""
    kept, keep = hooks.caching_hooks([hooks.attn_o_out(0)])
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=[*fwd, *keep]):
        model.bridge.blocks[0].attn(x, position_embeddings=position_embeddings,
                                    attention_mask=None)
    return kept[hooks.attn_o_out(0)]


def test_removing_rope_by_hooks_equals_an_identity_rotation(llama):
    x = inputs(llama)
    cos, sin = llama.bridge.rotary_emb(x, torch.arange(7)[None])
    skipped = sublayer_output(llama, x, (cos, sin), no_rope_hooks([0]))
    identity = sublayer_output(llama, x, (torch.ones_like(cos), torch.zeros_like(sin)))
    torch.testing.assert_close(skipped, identity, atol=1e-7, rtol=0)
    # the hooks really removed something (relative: the tiny model's outputs are ~1e-2)
    with_rope = sublayer_output(llama, x, (cos, sin))
    assert float((with_rope - skipped).abs().max()) > 1e-3 * float(skipped.abs().max())


def test_without_rope_position_ids_no_longer_matter(llama):
    fwd = no_rope_hooks(range(llama.info.n_layers))
    # spread out, so that with RoPE even the offsets between positions change
    spread = torch.arange(IDS.shape[1])[None] * 3 + 300
    base = final_residual(llama, fwd)
    torch.testing.assert_close(final_residual(llama, fwd, position_ids=spread), base,
                               atol=1e-6, rtol=0)
    rope = final_residual(llama, position_ids=spread)
    assert float((rope - final_residual(llama)).abs().max()) > 1e-4


def test_without_position_embeddings_position_ids_no_longer_matter(bert):
    fwd = zero_position_hooks()
    shifted = torch.arange(IDS.shape[1])[None] + 300
    base = final_residual(bert, fwd)
    torch.testing.assert_close(final_residual(bert, fwd, position_ids=shifted), base,
                               atol=1e-6, rtol=0)
    learned = final_residual(bert, position_ids=shifted)
    assert float((learned - final_residual(bert)).abs().max()) > 1e-4


def test_float64_angles_agree_with_the_model_and_refuse_other_models(llama, bert):
    pos = torch.arange(9)[None] + 5
    x = inputs(llama, 9)
    store, keep = hooks.caching_hooks([hooks.ROTARY_COS, hooks.ROTARY_SIN])
    with torch.no_grad(), llama.bridge.hooks(fwd_hooks=[*float64_angle_hooks(llama, pos), *keep]):
        llama.bridge.rotary_emb(x, pos)
    cos, sin = llama.bridge.rotary_emb(x, pos)
    torch.testing.assert_close(store[hooks.ROTARY_COS], cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(store[hooks.ROTARY_SIN], sin, atol=1e-6, rtol=0)
    # the hook's values are the float64 ones, rounded once
    angle = (pos[0, 3].double() * llama.bridge.rotary_emb.original_component.inv_freq.double())
    torch.testing.assert_close(store[hooks.ROTARY_COS][0, 3, : angle.numel()].double(), angle.cos(),
                               atol=1e-7, rtol=0)
    with pytest.raises(WorkbenchError, match="inv_freq"):
        float64_angle_hooks(bert, pos)


def test_float64_angles_refuse_a_rotary_embedding_they_do_not_reproduce(llama):
    pos = torch.arange(9)[None]
    x = inputs(llama, 9)
    fwd = float64_angle_hooks(llama, pos + 50)  # angles of other positions than the model's
    with pytest.raises(WorkbenchError, match="not the standard RoPE"), \
            llama.bridge.hooks(fwd_hooks=fwd):
        llama.bridge.rotary_emb(x, pos)
