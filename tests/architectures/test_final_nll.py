"""Next-token losses unembedded block by block, on every causal family: the same losses as
the cross-entropy of the bridge's own logits.

Reference: each prompt run alone through the bridge (its whole output, the family's own
logit soft cap or scale included), ``F.cross_entropy`` of every position against the next
token. :func:`token_losses` runs the prompts as one right-padded batch, stops at the final
norm and unembeds the vocabulary in blocks of 64 here (the tiny vocabulary of 300 is five
blocks, the last one short).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.architectures.families import BUILDERS, ENCODERS
from workbench.inputs.prompts import Prompt
from workbench.scores import losses
from workbench.scores.losses import token_losses

CAUSAL = [f for f, (cls, _) in BUILDERS.items() if f not in ENCODERS and f not in ("t5", "mamba")]


def _prompts(families, family) -> list[Prompt]:
    vocab = len(families.tokenizer(family))
    g = torch.Generator().manual_seed(0)
    return [Prompt(token_ids=tuple(torch.randint(6, vocab, (n,), generator=g).tolist()))
            for n in (13, 7, 10)]


def _reference(model, prompt: Prompt) -> torch.Tensor:
    ids = torch.tensor([prompt.token_ids])
    with torch.inference_mode():
        logits = model.bridge(ids)
    return F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none")


@pytest.mark.parametrize("family", CAUSAL)
def test_blocked_losses_are_the_cross_entropy_of_the_bridges_logits(families, family,
                                                                    monkeypatch):
    model = families.model(family)
    if not model.info.causal or not model.info.has_lm_head:
        pytest.skip(f"{family}: not a causal LM")
    assert losses._unembeds_blocked(model), f"{family} should stop at its final norm"
    monkeypatch.setattr(losses, "VOCAB_BLOCK", 64)
    prompts = _prompts(families, family)
    got = token_losses(model, prompts)
    for prompt, mine in zip(prompts, got, strict=True):
        torch.testing.assert_close(mine, _reference(model, prompt), atol=1e-5, rtol=1e-5)


def test_a_hook_on_the_unembedding_is_honoured(families):
    """A hook that edits the logits makes the pass run whole, so the edit counts."""
    model = families.model("llama")
    prompts = _prompts(families, "llama")[:1]
    plain = token_losses(model, prompts)[0]

    def flat(logits, hook):
        return torch.zeros_like(logits)  # every token equally likely: loss log(d_vocab)

    with model.bridge.hooks(fwd_hooks=[("unembed.hook_out", flat)]):
        assert not losses._unembeds_blocked(model)
        edited = token_losses(model, prompts)[0]
    vocab = model.bridge.W_U.shape[1]
    torch.testing.assert_close(edited, torch.full_like(edited, float(torch.log(
        torch.tensor(float(vocab))))))
    assert not torch.allclose(plain, edited)


def test_the_familys_logit_soft_cap_applies_to_every_block(families, tmp_path, monkeypatch):
    """A Gemma 2 whose final soft cap bends its logits (cap 0.05 against logits of about
    0.1: at the default 30 the cap is the identity to 1e-7 on a tiny random model)."""
    from tests import tiny
    from tests.architectures.families import instantiate
    from workbench.models.load import load_model

    cfg = BUILDERS["gemma-2"][1](len(families.tokenizer("gemma-2")))
    cfg.final_logit_softcapping = 0.05
    folder = tiny.save_folder(instantiate("Gemma2ForCausalLM", cfg),
                              families.tokenizer("gemma-2"), tmp_path / "capped")
    model = load_model(str(folder))
    monkeypatch.setattr(losses, "VOCAB_BLOCK", 64)
    prompts = _prompts(families, "gemma-2")
    for prompt, mine in zip(prompts, token_losses(model, prompts), strict=True):
        reference = _reference(model, prompt)
        torch.testing.assert_close(mine, reference, atol=1e-5, rtol=1e-5)
    uncapped = _reference(families.model("gemma-2"), prompts[0])
    assert (uncapped - _reference(model, prompts[0])).abs().max() > 1e-2  # the cap matters


@pytest.mark.parametrize("family", ["llama", "gemma-3", "gpt2"])
def test_row_losses_and_their_mask_gradients_are_the_whole_logits(families, family,
                                                                  monkeypatch):
    """Gradient importance's example loss, stopped at the final norm, against the pass run
    whole: the same per-row losses and the same gradients with respect to a head mask."""
    from workbench.interventions.importance import mask_gradients

    model = families.model(family)
    prompts = _prompts(families, family)
    mask = torch.ones(model.info.n_layers, model.info.n_heads)

    def example_loss(model, batch):
        return losses.row_losses(model, batch)[:, None]

    monkeypatch.setattr(losses, "VOCAB_BLOCK", 64)
    blocked = mask_gradients(model, prompts, example_loss, mask)
    monkeypatch.setattr(losses, "_unembeds_blocked", lambda model: False)
    whole = mask_gradients(model, prompts, example_loss, mask)
    assert whole.abs().max() > 1e-3  # the gradients are not all zero
    torch.testing.assert_close(blocked, whole, atol=1e-5, rtol=1e-4)
