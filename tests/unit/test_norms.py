"""A first norm with its scale frozen, by hand: the frozen scale is the live norm's on the
reference input, and the norm of a sum of parts is the sum of the parts' norms."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from tests import tiny
from workbench.core.errors import ModelCapabilityError
from workbench.inputs.prompts import Prompt
from workbench.models.norms import first_norm, normalise
from workbench.recording import hooks

PROMPT = Prompt(text="the cat sat on the mat and the dog sat on the rug")


@pytest.fixture(scope="module", params=["llama", "bert"])
def model(request):
    """The tiny Llama (RMSNorm) or BERT (LayerNorm) with random norm weights and biases:
    ones and zeros would hide a missing one."""
    bert = request.param == "bert"
    hf = copy.deepcopy(request.getfixturevalue(f"{request.param}_hf"))
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name.lower():
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    tokenizer = request.getfixturevalue("bert_tokenizer" if bert else "tokenizer")
    return tiny.wrap(hf, tokenizer, f"tiny-{request.param}-norms", has_lm_head=not bert)


def _reference(model, layer):
    """``ln1``'s input, frozen scale and output on one prompt, in float64."""
    names = [f"blocks.{layer}.ln1.hook_{n}" for n in ("in", "scale", "out")]
    with torch.no_grad():
        kept = hooks.capture(model, model.batches([PROMPT])[0], names)
    x, scale, out = (kept[n][0].double() for n in names)
    return x, scale[:, 0], out


@pytest.mark.parametrize("layer", [0, 1])
def test_frozen_norm_of_a_sum_is_the_sum_of_the_parts(model, layer):
    x, scale, out = _reference(model, layer)
    norm = first_norm(model, layer)
    module = model.bridge.blocks[layer].ln1._original_component
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    # the frozen scale is the live norm's own on this input: RMS, or the standard
    # deviation (biased) after centring
    centred = x - x.mean(-1, keepdim=True) if norm.center else x
    torch.testing.assert_close(scale, (centred.pow(2).mean(-1) + eps).sqrt(), atol=1e-5,
                               rtol=1e-5)
    assert norm.center == (not model.info.causal) and (norm.bias is not None) == norm.center
    assert torch.equal(norm.weight, module.weight.detach().double())
    assert not norm.center or torch.equal(norm.bias, module.bias.detach().double())
    bias = norm.bias if norm.bias is not None else 0
    # applied to the whole input it is the live norm (up to float32 rounding) ...
    torch.testing.assert_close(normalise(x, scale, norm) + bias, out, atol=1e-5, rtol=1e-5)
    # ... and to parts of it, linear: three parts' norms sum to the norm of their sum
    gen = torch.Generator().manual_seed(layer)
    a, b = (torch.randn(x.shape, generator=gen, dtype=torch.float64) for _ in range(2))
    parts = normalise(torch.stack([a, b, x - a - b]), scale, norm)
    torch.testing.assert_close(parts.sum(0), normalise(x, scale, norm), atol=1e-12, rtol=1e-12)
    by_hand = (a - a.mean(-1, keepdim=True) if norm.center else a) / scale[:, None] * norm.weight
    torch.testing.assert_close(parts[0], by_hand, atol=1e-12, rtol=1e-12)


class GemmaRMSNorm(torch.nn.Module):
    """Gemma's RMSNorm stores ``w`` and multiplies by ``1 + w``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([0.0, 0.5, -0.25]))


def _with_ln1(module):
    return SimpleNamespace(bridge=SimpleNamespace(blocks=[SimpleNamespace(ln1=module)]))


def test_gemma_weights_are_offset_and_a_weightless_norm_is_refused():
    norm = first_norm(_with_ln1(GemmaRMSNorm()), 0)
    assert torch.equal(norm.weight, torch.tensor([1.0, 1.5, 0.75], dtype=torch.float64))
    assert not norm.center and norm.bias is None
    with pytest.raises(ModelCapabilityError, match="no weight"):
        first_norm(_with_ln1(torch.nn.Identity()), 0)
