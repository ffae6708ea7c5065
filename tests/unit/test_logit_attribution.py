"""The logit lens and direct logit attribution on tiny random models, against hand
computations: the parts sum to the model's own logit difference, one head's part is its
output through the frozen final norm and the unembedding, the lens at the last boundary is
the model's logits, and the frozen lens at any boundary is the sum of the parts below it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests import tiny
from tests.architectures.families import build
from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.inputs.batching import Batch
from workbench.interventions.ablation import ablated
from workbench.models.norms import final_norm
from workbench.recording import hooks
from workbench.scores import logit_attribution as la
from workbench.scores.components import part_hooks, stream_parts

IDS = torch.tensor([[0, *range(10, 21)], [0, *range(40, 51)]])  # two rows of 12 tokens
POSITIONS = torch.tensor([11, 6])
CONTRAST = la.Contrast(torch.tensor([25, 60]), torch.tensor([30, 70]))


def _random_norms(hf, seed: int):
    """Norm weights away from ones, so that the frozen scale and the weight both matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    return hf


@pytest.fixture(scope="module")
def model(llama_hf, tokenizer):
    return tiny.wrap(_random_norms(copy.deepcopy(llama_hf), 3), tokenizer, "tiny-llama-dla")


@pytest.fixture(scope="module")
def gemma(tokenizer):
    """A tiny Gemma 3: a norm on each sublayer's output (``ln1_post``) and ``1 + w`` norms."""
    return tiny.wrap(_random_norms(build("gemma-3", len(tokenizer)), 4), tokenizer,
                     "tiny-gemma3-dla")


def _logits(model, ids=IDS):
    with torch.no_grad():
        return model.logits(ids).double()


def _by_hand(logits, contrast=CONTRAST, positions=POSITIONS):
    rows = torch.arange(len(positions))
    at = logits[rows, positions]
    if contrast.other is None:
        return (at[rows, contrast.answer] - at.mean(-1)).numpy()
    return (at[rows, contrast.answer] - at[rows, contrast.other]).numpy()


@pytest.mark.parametrize("name", ["model", "gemma"])
@pytest.mark.parametrize("mean", [False, True])
def test_direct_effects_sum_to_the_models_own_logit_difference(request, name, mean):
    model = request.getfixturevalue(name)
    contrast = la.Contrast(CONTRAST.answer) if mean else CONTRAST
    with torch.no_grad():
        effects = la.direct_effects(model, Batch.of(IDS), contrast, POSITIONS)
    want = _by_hand(_logits(model), contrast)
    assert np.abs(want).max() > 1e-3  # a real difference, not zeros
    np.testing.assert_allclose(effects.total, want, rtol=1e-5, atol=1e-6)
    assert effects.error <= 1e-5
    np.testing.assert_allclose(effects.parts.sum(1), want, rtol=1e-5, atol=1e-6)
    # embed, 4 heads and an MLP per layer, the final norm's and the unembedding's biases
    assert len(effects.names) == 1 + 5 * model.info.n_layers + 2
    assert effects.names[:2] == ["embed", "L0H0"] and effects.names[-1] == la.UNEMBED_BIAS


def test_a_heads_part_is_its_output_through_the_frozen_norm_and_the_unembedding(model):
    names = [hooks.z(1), hooks.FINAL_SCALE]
    with torch.no_grad():
        kept = hooks.capture(model, Batch.of(IDS), names)
        effects = la.direct_effects(model, Batch.of(IDS), CONTRAST, POSITIONS)
    rows = torch.arange(2)
    z = kept[hooks.z(1)][rows, POSITIONS, 2].double()  # head 2 of layer 1: [2, d_head]
    w_o = model.bridge.W_O[1, 2].detach().double()
    scale = kept[hooks.FINAL_SCALE][rows, POSITIONS, 0].double()
    weight = model.bridge.ln_final._original_component.weight.detach().double()
    w_u = model.bridge.W_U.detach().double()
    u = w_u[:, CONTRAST.answer].T - w_u[:, CONTRAST.other].T
    by_hand = ((z @ w_o) / scale[:, None] * weight * u).sum(-1)
    np.testing.assert_allclose(effects.parts[:, effects.names.index("L1H2")], by_hand.numpy(),
                               rtol=1e-10)
    with torch.no_grad(), ablated(model, [(1, 2)]):
        zeroed = la.direct_effects(model, Batch.of(IDS), CONTRAST, POSITIONS)
    assert np.all(zeroed.parts[:, zeroed.names.index("L1H2")] == 0)
    assert zeroed.error <= 1e-5


@pytest.mark.parametrize("name", ["model", "gemma"])
def test_the_lens_at_the_last_boundary_is_the_models_logits(request, name):
    model = request.getfixturevalue(name)
    n_layers = model.info.n_layers
    names = [hooks.resid(n_layers, n_layers), hooks.FINAL_SCALE]
    with torch.no_grad():
        kept = hooks.capture(model, Batch.of(IDS), names)
        final = kept[names[0]].reshape(-1, model.info.d_model)
        want = _logits(model).reshape(-1, model.info.d_vocab)
        for scale in (kept[hooks.FINAL_SCALE].reshape(-1), None):  # frozen, recomputed
            torch.testing.assert_close(la.lens_logits(model, final, scale).double(), want,
                                       rtol=1e-5, atol=1e-5)
        lens = la.logit_lens(model, Batch.of(IDS), torch.arange(2), POSITIONS, CONTRAST.answer)
    top = want.reshape(2, 12, -1)[torch.arange(2), POSITIONS]
    assert lens.answer_logit.shape == (n_layers + 1, 2) and lens.output_error <= 1e-5
    np.testing.assert_array_equal(lens.top_token[-1], top.argmax(-1).numpy())
    np.testing.assert_allclose(lens.answer_prob[-1], top.softmax(-1)[torch.arange(2),
                                                                   CONTRAST.answer].numpy(),
                               rtol=1e-5)
    ranks = (top > top[torch.arange(2), CONTRAST.answer][:, None]).sum(-1)
    np.testing.assert_array_equal(lens.answer_rank[-1], ranks.numpy())


def test_the_frozen_lens_at_a_boundary_is_the_sum_of_the_parts_below_it(model):
    """Linear: the lens's logit difference at boundary b is the direct effects of the parts
    written before b (and the two biases); the recomputed lens is not, below the top."""
    n_layers = model.info.n_layers
    rows = torch.arange(2)
    with torch.no_grad():
        effects = la.direct_effects(model, Batch.of(IDS), CONTRAST, POSITIONS)
        names = [hooks.resid(b, n_layers) for b in range(n_layers + 1)] + [hooks.FINAL_SCALE]
        kept = hooks.capture(model, Batch.of(IDS), names)
    scale = kept[hooks.FINAL_SCALE][rows, POSITIONS, 0]
    layers = np.array(effects.layers)
    for boundary in range(n_layers + 1):
        resid = kept[hooks.resid(boundary, n_layers)][rows, POSITIONS]
        frozen = la.lens_logits(model, resid, scale).double()
        diff = (frozen[rows, CONTRAST.answer] - frozen[rows, CONTRAST.other]).numpy()
        below = (layers < boundary) | (layers == n_layers)
        np.testing.assert_allclose(diff, effects.parts[:, below].sum(1), rtol=1e-4, atol=1e-5)
    recomputed = la.lens_logits(model, kept[hooks.resid(1, n_layers)][rows, POSITIONS], None)
    assert not torch.allclose(recomputed, la.lens_logits(
        model, kept[hooks.resid(1, n_layers)][rows, POSITIONS], scale), atol=1e-3)


def test_stream_parts_sum_to_the_residual_stream_through_an_output_norm(gemma):
    """Gemma's heads reach the stream through ``ln1_post``: frozen, their parts still sum."""
    n_layers = gemma.info.n_layers
    with torch.no_grad():
        kept = hooks.capture(gemma, Batch.of(IDS), [*part_hooks(gemma, n_layers),
                                                     hooks.resid(n_layers, n_layers)])
    index = (torch.arange(2), POSITIONS)
    parts = stream_parts(gemma, kept, index, n_layers)
    want = kept[hooks.resid(n_layers, n_layers)][index].double()
    torch.testing.assert_close(sum(p.value for p in parts), want, rtol=1e-5, atol=1e-5)
    assert final_norm(gemma).weight.min() > 1  # Gemma's 1 + w


def test_refusals(model, bert, monkeypatch):
    la.require_direct(model)
    with pytest.raises(ModelCapabilityError):
        la.require_direct(bert)
    adapter = model.bridge.adapter
    monkeypatch.setattr(adapter, "apply_output_logits_transform",
                        lambda logits: 30 * torch.tanh(logits / 30))
    with pytest.raises(ModelCapabilityError, match="soft cap"):
        la.require_direct(model)
    with pytest.raises(WorkbenchError, match="one other token per answer"):
        la.Contrast(torch.tensor([1, 2]), torch.tensor([3]))
