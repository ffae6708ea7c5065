"""Heads permuted in the weights (workbench.models.head_permutation) on the tiny models:
multi-head attention is a sum over heads, so moving the heads with their W_O slices leaves
the attention sublayer's output unchanged, and moving them without W_O does not."""

from __future__ import annotations

import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.models.head_permutation import head_permutation, permuted_head_weights
from workbench.recording import hooks


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def attention_run(model, layer):
    """The sublayer's output (``hook_attn_out``) and pattern on one prompt, whole forward."""
    ids, type_ids = model.encode(Prompt(text="the cat sat on the mat and the dog sat"))
    kwargs = {"token_type_ids": torch.tensor([type_ids])} if type_ids else {}
    names = [hooks.attn_out(layer), hooks.pattern(layer)]
    kept, keep = hooks.caching_hooks(names)
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=keep):
        model.bridge(torch.tensor([ids]), return_type=None, **kwargs)
    return kept[names[0]], kept[names[1]]


@pytest.mark.parametrize("n_heads, n_kv", [(9, 3), (4, 2), (12, 12), (8, 1)])
def test_head_permutation_keeps_each_query_head_with_its_kv_head(n_heads, n_kv):
    r = n_heads // n_kv
    for seed in range(5):
        q_perm, kv_perm = head_permutation(n_heads, n_kv, gen(seed))
        assert sorted(q_perm.tolist()) == list(range(n_heads))
        assert sorted(kv_perm.tolist()) == list(range(n_kv))
        assert q_perm.tolist() != list(range(n_heads))
        # new head j reads new kv head j // r = old kv head kv_perm[j // r], which must be
        # the kv head of the old query head it now is
        assert all(int(q_perm[j]) // r == int(kv_perm[j // r]) for j in range(n_heads))
        again = head_permutation(n_heads, n_kv, gen(seed))
        assert torch.equal(q_perm, again[0]) and torch.equal(kv_perm, again[1])


def test_head_permutation_refuses_groups_that_do_not_divide():
    with pytest.raises(WorkbenchError, match="do not divide"):
        head_permutation(9, 2)


@pytest.mark.parametrize("name", ["llama", "bert"])
@pytest.mark.parametrize("layer", [0, 1])
def test_heads_moved_with_their_output_slices_leave_the_sublayer_unchanged(request, name,
                                                                          layer):
    model = request.getfixturevalue(name)
    out0, pattern0 = attention_run(model, layer)
    q_perm, kv_perm = head_permutation(model.info.n_heads, model.info.n_kv_heads, gen(layer))
    with permuted_head_weights(model, layer, q_perm, kv_perm):
        out, pattern = attention_run(model, layer)
    scale = float(out0.abs().max())
    torch.testing.assert_close(out, out0, atol=1e-6 * scale, rtol=0)
    # each head's pattern moved with its head
    torch.testing.assert_close(pattern, pattern0[:, q_perm], atol=1e-6, rtol=0)
    with permuted_head_weights(model, layer, q_perm, kv_perm, output_slices=False):
        unmatched, _ = attention_run(model, layer)
    assert float((unmatched - out0).abs().max()) > 1e-3 * scale
    # and the weights are back: the output is the original, bit for bit
    assert torch.equal(attention_run(model, layer)[0], out0)


def test_query_heads_moved_across_kv_groups_change_the_sublayer(llama):
    out0, _ = attention_run(llama, 1)
    cross = torch.roll(torch.arange(llama.info.n_heads), -1)  # heads 1, 2, 3, 0: groups cross
    with permuted_head_weights(llama, 1, cross, torch.arange(llama.info.n_kv_heads)):
        out, _ = attention_run(llama, 1)
    assert float((out - out0).abs().max()) > 1e-3 * float(out0.abs().max())


def test_head_weights_are_restored_even_after_an_error(llama):
    attn = llama.bridge.blocks[1].attn
    before = [p.detach().clone() for p in (attn.q.original_component.weight,
                                           attn.o.original_component.weight)]
    q_perm, kv_perm = head_permutation(4, 2, gen(0))
    with pytest.raises(RuntimeError, match="boom"), \
            permuted_head_weights(llama, 1, q_perm, kv_perm):
        assert not torch.equal(attn.q.original_component.weight, before[0])
        raise RuntimeError("boom")
    assert torch.equal(attn.q.original_component.weight, before[0])
    assert torch.equal(attn.o.original_component.weight, before[1])
