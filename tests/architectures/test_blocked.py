"""Blocked attention on every family: the same layer outputs as the bridge's eager attention.

Reference: the bridge's own eager pass. Each layer's input (``hook_resid_pre``) of the
blocked pass is replaced by the eager pass's, so a layer's output differs only by its
own arithmetic, which must agree within 1e-6 (float32). Lengths: one that is not a
multiple of the block and one shorter than a block, in a right-padded batch. The
families t5 and mamba are n/a: the workbench refuses them at load (no single attention
pattern per layer, or no attention at all).
"""

from __future__ import annotations

import pytest
import torch

from tests.architectures.families import BUILDERS, ENCODERS
from workbench.models import blocked as blocked_attention
from workbench.models.adapters import adapter_for
from workbench.recording import hooks

FAMILIES = [f for f, (cls, _) in BUILDERS.items() if not adapter_for(cls).unsupported]
BLOCK = 8


def _batch(n: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of random ids, the second right-padded after ``n - 3`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, vocab, (2, n), generator=gen)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, n - 3:] = 0
    return ids, mask


def _outputs(model, ids, mask, inputs: dict | None = None) -> dict[str, torch.Tensor]:
    """Every layer's per-head mix (``hook_z``) and attention output, and every layer's
    input; with ``inputs``, every layer's input replaced by the given one."""
    n = model.info.n_layers
    resid = [hooks.resid(layer, n) for layer in range(n)]
    names = [*resid, *(hooks.z(layer) for layer in range(n)),
             *(f"blocks.{layer}.attn.hook_out" for layer in range(n))]
    kept, fwd = hooks.caching_hooks(names)
    if inputs is not None:
        fwd = [(name, lambda t, hook, name=name: inputs[name]) for name in resid] + fwd
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=fwd):
        model.bridge(ids, attention_mask=mask, return_type=None)
    return kept


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n", [37, 5])
def test_blocked_layer_outputs_equal_eager(families, family, n):
    model = families.model(family)
    assert blocked_attention.support(model) is None
    ids, mask = _batch(n, len(families.tokenizer(family)))
    eager = _outputs(model, ids, mask)
    seen = []
    with blocked_attention.blocked(model, seen.append, block=BLOCK):
        got = _outputs(model, ids, mask, inputs=eager)
    real = mask.bool()
    for name, want in eager.items():
        torch.testing.assert_close(got[name][real], want[real], atol=1e-6, rtol=0, msg=name)
    blocks = -(-n // BLOCK)
    assert len(seen) == blocks * model.info.n_layers
    assert [b.q0 for b in seen[:blocks]] == list(range(0, n, BLOCK))


@pytest.mark.parametrize("family", FAMILIES)
def test_blocked_weights_are_the_eager_pattern(families, family):
    """Each block, placed at its rows and keys with zeros around, is the eager pattern."""
    model = families.model(family)
    ids, mask = _batch(21, len(families.tokenizer(family)), seed=1)
    n_layers = model.info.n_layers
    names = [hooks.pattern(layer) for layer in range(n_layers)]
    kept, fwd = hooks.caching_hooks(names)
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=fwd):
        model.bridge(ids, attention_mask=mask, return_type=None)
    rebuilt = [torch.zeros_like(kept[name]) for name in names]

    def place(block):
        rebuilt[block.layer][:, :, block.q0:block.q1, block.k0:block.k1] = block.weights
    with torch.inference_mode(), blocked_attention.blocked(model, place, block=4):
        model.bridge(ids, attention_mask=mask, return_type=None)
    real = mask.bool()
    for layer, name in enumerate(names):
        want = kept[name].float().transpose(1, 2)[real]  # [real query, head, key]
        got = rebuilt[layer].transpose(1, 2)[real]
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("family", "window"), [("gemma-3", 8), ("gemma-2", 8),
                                                ("gpt-neo", 8)])
def test_sliding_window_layers_give_exactly_zero_weight_outside_the_window(families, family,
                                                                          window):
    model = families.model(family)
    n = 40
    ids = torch.randint(6, len(families.tokenizer(family)), (1, n),
                        generator=torch.Generator().manual_seed(2))
    rows = {layer: torch.zeros(model.info.n_heads, n, n) for layer in range(2)}

    def place(block):
        rows[block.layer][:, block.q0:block.q1, block.k0:block.k1] = block.weights[0]
    with torch.inference_mode(), blocked_attention.blocked(model, place, block=BLOCK):
        model.bridge(ids, return_type=None)
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    outside = (q - k >= window) | (k > q)
    local = [layer for layer, pattern in rows.items()
             if float(pattern[:, outside].abs().max()) == 0]
    assert local, "no layer kept to its window"
    for layer in local:  # inside the window every weight is positive, and rows sum to 1
        assert float(rows[layer][:, ~outside].min()) > 0
        torch.testing.assert_close(rows[layer].sum(-1), torch.ones(model.info.n_heads, n))
    assert len(local) == 1, "the global layer must see beyond the window"


@pytest.mark.parametrize("family", ENCODERS)
def test_encoders_see_every_real_key(families, family):
    model = families.model(family)
    ids, mask = _batch(12, len(families.tokenizer(family)))
    spans = set()
    with torch.inference_mode(), blocked_attention.blocked(
            model, lambda b: spans.add((b.k0, b.k1, b.n_keys)), block=4):
        model.bridge(ids, attention_mask=mask, return_type=None)
    assert spans == {(0, 12, 12)}


@pytest.mark.parametrize("family", FAMILIES)
def test_scores_of_some_layers_stop_after_the_deepest_attention(families, family):
    """Scoring only layer 0 gives the whole pass's layer-0 scores, on both attention paths,
    and the pass stops once layer 0's pattern is read: its MLP never runs (on every family,
    also those whose attention reports its pattern after its output)."""
    from workbench.inputs.prompts import Prompt
    from workbench.recording.reductions import reduce_patterns
    from workbench.scores import metrics

    model = families.model(family)
    vocab = len(families.tokenizer(family))
    gen = torch.Generator().manual_seed(2)
    prompts = [Prompt(token_ids=tuple(torch.randint(6, vocab, (n,), generator=gen).tolist()))
               for n in (13, 9)]
    reductions = metrics.reductions("previous_token", "first_token")
    mlp_ran: list[str] = []
    watch = [(f"blocks.0.{name}", lambda t, hook: mlp_ran.append(hook.name))
             for name in ("mlp.hook_out", "hook_resid_post")]
    for attention in ("blocked", "dense"):
        whole = reduce_patterns(model, prompts, reductions, attention=attention)
        mlp_ran.clear()
        with model.bridge.hooks(fwd_hooks=watch):
            first = reduce_patterns(model, prompts, reductions, attention=attention, layers=[0])
        expected = whole[whole.layer == 0].reset_index(drop=True)
        assert len(first) == len(expected) > 0
        torch.testing.assert_close(torch.tensor(first.score.to_numpy()),
                                   torch.tensor(expected.score.to_numpy()), atol=1e-6, rtol=0)
        assert not mlp_ran, attention


def _input_gradient(model, ids, mask, weights: torch.Tensor) -> torch.Tensor:
    """The gradient of ``sum(weights * logits)`` over real positions with respect to the
    first layer's input: it flows back through every layer's queries, keys and values."""
    leaf: list[torch.Tensor] = []

    def start(x, hook):
        leaf.append(x.detach().requires_grad_(True))
        return leaf[0]

    name = hooks.resid(0, model.info.n_layers)
    with torch.enable_grad(), model.bridge.hooks(fwd_hooks=[(name, start)]):
        logits = model.bridge(ids, attention_mask=mask)
        total = (logits.float() * weights)[mask.bool()].sum()
        return torch.autograd.grad(total, leaf[0])[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_recomputed_blocks_give_the_eager_gradients(families, family):
    """Under autograd each block of rows is recomputed in the backward pass (its mask
    too): the gradients are eager attention's, on every family (grouped-query heads,
    sliding windows, soft-capping, ALiBi), across blocks and a padded row."""
    model = families.model(family)
    if not model.info.causal:
        pytest.skip("an encoder has no logits to differentiate here")
    ids, mask = _batch(37, len(families.tokenizer(family)), seed=3)
    gen = torch.Generator().manual_seed(4)
    weights = torch.randn(2, 37, model.bridge.cfg.d_vocab, generator=gen)
    eager = _input_gradient(model, ids, mask, weights)
    with blocked_attention.blocked(model, block=BLOCK):
        got = _input_gradient(model, ids, mask, weights)
    real = mask.bool()
    scale = float(eager[real].abs().max())
    torch.testing.assert_close(got[real], eager[real], atol=1e-5 * scale, rtol=1e-4)
