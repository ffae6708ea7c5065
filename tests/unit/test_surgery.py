"""Heads removed from the weights, on tiny random models, against two invariants: removing no
head changes nothing, and removing heads equals zero-masking them on the bridge."""

from __future__ import annotations

import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.interventions.masks import HeadMask, applied
from workbench.models.surgery import hf_forward, plain_copy, remove_heads
from workbench.scores.embeddings import batch_embeddings, mean_pool

PROMPTS = [Prompt(text="the cat sat on the mat and the dog sat on the rug"),
           Prompt(text="bread is made from flour water salt and yeast")]
# llama layer 0 keeps heads 0, 1 and 3: kv head 0 serves two of them, kv head 1 one (uneven
# groups); layer 1 keeps none
UNEVEN = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
EVEN = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


def plain_output(model, hf_model, batch):
    """Logits of a causal LM, mean-pooled final hidden states of an encoder."""
    out = hf_forward(hf_model, batch, causal=model.info.causal)
    return out if model.info.causal else mean_pool(out, batch.attention_mask)


def bridge_output(model, batch):
    if model.info.causal:
        return model.bridge(batch.input_ids, attention_mask=batch.attention_mask)
    return batch_embeddings(model, batch)


def real(model, batch, tensor):
    """Only the real positions: what padded positions hold is never used."""
    return tensor[batch.attention_mask.bool()] if model.info.causal else tensor


def n_params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("which", ["llama", "bert"])
def test_removing_no_head_changes_nothing(which, request):
    model = request.getfixturevalue(which)
    batch = model.batches(PROMPTS)[0]
    plain = plain_copy(model)
    kept = remove_heads(plain_copy(model), torch.ones(2, 4))
    assert n_params(kept) == n_params(plain)
    with torch.inference_mode():
        torch.testing.assert_close(plain_output(model, kept, batch),
                                   plain_output(model, plain, batch), atol=0, rtol=0)
        # and the plain copy computes what the bridge computes
        torch.testing.assert_close(real(model, batch, plain_output(model, plain, batch)),
                                   real(model, batch, bridge_output(model, batch)),
                                   atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("values", [UNEVEN, EVEN], ids=["uneven-groups", "even-groups"])
@pytest.mark.parametrize("which", ["llama", "bert"])
def test_removing_heads_equals_zero_masking_them(which, values, request):
    model = request.getfixturevalue(which)
    batch = model.batches(PROMPTS)[0]
    plain = plain_copy(model)
    removed = remove_heads(plain_copy(model), values)
    assert n_params(removed) < n_params(plain)
    with torch.inference_mode():
        cut = real(model, batch, plain_output(model, removed, batch))
        with applied(model, HeadMask(values)):
            masked = real(model, batch, bridge_output(model, batch))
        full = real(model, batch, bridge_output(model, batch))
    torch.testing.assert_close(cut, masked, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(cut, full, atol=1e-4)  # the removed heads mattered


def test_removal_leaves_the_source_model_alone(llama):
    batch = llama.batches(PROMPTS)[0]
    with torch.inference_mode():
        before = bridge_output(llama, batch)
        remove_heads(plain_copy(llama), UNEVEN)
        torch.testing.assert_close(bridge_output(llama, batch), before, atol=0, rtol=0)


def test_grouped_query_layers_stay_grouped_when_the_groups_stay_even(llama):
    removed = remove_heads(plain_copy(llama), EVEN)
    first, second = removed.model.layers[0].self_attn, removed.model.layers[1].self_attn
    d_head = llama.info.d_head
    # layer 0 keeps heads 0 and 2, one in each kv group: two kv heads, one query head each
    assert first.k_proj.out_features == 2 * d_head and first.num_key_value_groups == 1
    # layer 1 keeps heads 0 and 1, both of kv group 0: one kv head serving two query heads
    assert second.k_proj.out_features == d_head and second.num_key_value_groups == 2
    assert second.q_proj.out_features == 2 * d_head and second.o_proj.in_features == 2 * d_head


def test_uneven_groups_become_multi_head(llama):
    removed = remove_heads(plain_copy(llama), UNEVEN)
    first = removed.model.layers[0].self_attn
    d_head = llama.info.d_head
    assert first.q_proj.out_features == 3 * d_head and first.k_proj.out_features == 3 * d_head
    assert first.num_key_value_groups == 1


def test_other_architectures_are_refused():
    with pytest.raises(WorkbenchError, match=r"Linear has no workbench adapter.*llama"):
        remove_heads(torch.nn.Linear(2, 2), torch.ones(1, 1))
