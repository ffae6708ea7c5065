"""EAP edge scores against an independent gradient x difference in plain Hugging Face.

The reference side uses only ``transformers`` modules and torch hooks, no bridge and no
workbench code: every receiver gets its own zero input offset ``delta_r`` (added to the
residual stream before the norm, for that head's q, k or v projection alone, for the
MLP's norm, or for the final norm), one backward pass gives ``d metric / d delta_r``, and
an edge's score is that gradient dotted with the sender's clean minus corrupted output,
summed over positions and averaged over prompts.

On a tiny Gemma 3 (sandwich norms: the attention output and the MLP output are normalized
before the residual add; q/k norms; sliding and global layers) a head's sender output is
its part of the normed attention output, ``z_h W_O^h / s * (1 + w)``, with ``s`` the RMS
of the whole attention output in that pass (written here from Gemma's RMSNorm formula),
and an MLP's is its normed output.
"""

from __future__ import annotations

import pytest
import torch

from tests import tiny
from tests.architectures.families import gemma3_config, instantiate
from workbench.interventions.circuits import attribution, flow
from workbench.interventions.circuits.attribution import edge_scores
from workbench.interventions.circuits.graph import build_graph
from workbench.interventions.circuits.task import LogitDifference, Task

LLAMA = {"mlp_in": "post_attention_layernorm", "attn_out": None, "mlp_out": "mlp"}
GEMMA = {"mlp_in": "pre_feedforward_layernorm", "attn_out": "post_attention_layernorm",
         "mlp_out": "post_feedforward_layernorm"}
"""Where each family's layer takes its MLP's input norm, normalizes its attention output,
and gives its MLP's output to the stream."""


def reference_senders(hf, ids, names=LLAMA):
    """embed, then per layer each head's ``z_h W_O^h`` (over the attention output norm,
    where there is one) and the MLP's output."""
    kept, handles = {}, []
    attn = [layer.self_attn for layer in hf.model.layers]
    handles.append(hf.model.embed_tokens.register_forward_hook(
        lambda mod, args, out: kept.__setitem__("embed", out)))
    for i, layer in enumerate(hf.model.layers):
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda mod, args, i=i: kept.__setitem__(("z", i), args[0])))
        handles.append(layer.self_attn.o_proj.register_forward_hook(
            lambda mod, args, out, i=i: kept.__setitem__(("o", i), out)))
        handles.append(getattr(layer, names["mlp_out"]).register_forward_hook(
            lambda mod, args, out, i=i: kept.__setitem__(("mlp", i), out)))
    with torch.no_grad():
        hf(ids)
    for h in handles:
        h.remove()
    d_head = getattr(hf.config, "head_dim", None) or (
        hf.config.hidden_size // hf.config.num_attention_heads)
    out = [kept["embed"]]
    for i, a in enumerate(attn):
        w = a.o_proj.weight  # [d_model, heads * d_head]
        z = kept[("z", i)]
        heads = [z[..., h * d_head:(h + 1) * d_head] @ w[:, h * d_head:(h + 1) * d_head].T
                 for h in range(hf.config.num_attention_heads)]
        if names["attn_out"] is not None:  # Gemma's RMSNorm: x / sqrt(mean x^2 + eps) (1 + w)
            norm = getattr(hf.model.layers[i], names["attn_out"])
            o = kept[("o", i)]
            rms = (o.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
            heads = [head / rms * (1 + norm.weight) for head in heads]
        out += heads
        out.append(kept[("mlp", i)])
    return torch.stack(out)


def _offset_proj(layer, proj, deltas, d_head, resid):
    """A forward hook on ``proj`` adding, to head ``k``'s columns, the change of
    ``proj(norm(x + delta_k))`` from ``proj(norm(x))``."""
    def hook(mod, args, out):
        x = resid[0]
        norm = layer.input_layernorm.forward  # .forward: without the modules' own hooks
        base = mod.forward(norm(x))
        out = out.clone()
        for k, delta in enumerate(deltas):
            moved = mod.forward(norm(x + delta)) - base
            out[..., k * d_head:(k + 1) * d_head] += moved[..., k * d_head:(k + 1) * d_head]
        return out
    return hook


def reference_receiver_grads(hf, ids, metric, names=LLAMA):
    """``d metric / d delta_r`` of every receiver in the graph's order."""
    cfg = hf.config
    d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    shape = (*ids.shape, cfg.hidden_size)
    zeros = lambda: torch.zeros(shape, requires_grad=True)  # noqa: E731
    deltas, handles = [], []
    for layer in hf.model.layers:
        resid = []
        handles.append(layer.input_layernorm.register_forward_pre_hook(
            lambda mod, args, resid=resid: resid.insert(0, args[0])))
        for proj, count in ((layer.self_attn.q_proj, cfg.num_attention_heads),
                            (layer.self_attn.k_proj, cfg.num_key_value_heads),
                            (layer.self_attn.v_proj, cfg.num_key_value_heads)):
            mine = [zeros() for _ in range(count)]
            deltas += mine
            handles.append(proj.register_forward_hook(
                _offset_proj(layer, proj, mine, d_head, resid)))
        mlp = zeros()
        deltas.append(mlp)
        handles.append(getattr(layer, names["mlp_in"]).register_forward_pre_hook(
            lambda mod, args, d=mlp: (args[0] + d,)))
    final = zeros()
    deltas.append(final)
    handles.append(hf.model.norm.register_forward_pre_hook(lambda mod, args: (args[0] + final,)))
    logits = hf(ids).logits
    grads = torch.autograd.grad(metric(logits).sum(), deltas)
    for h in handles:
        h.remove()
    return torch.stack(grads)


@pytest.fixture(scope="module")
def gemma3_hf(tokenizer):
    """A tiny random Gemma 3 whose norms have random weights (Gemma initializes them to
    zero, which would leave ``1 + w`` untested)."""
    hf = instantiate("Gemma3ForCausalLM", gemma3_config(len(tokenizer)), seed=1)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.copy_(0.5 * torch.randn(param.shape, generator=gen))
    return hf


@pytest.mark.parametrize("held", ["all layers", "one layer"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_eap_scores_equal_plain_huggingface_gradient_times_difference(family, held, request,
                                                                       tokenizer, monkeypatch):
    if held == "one layer":  # each layer's gradients contracted as the backward reaches it,
        # each MLP recomputed five positions at a time
        monkeypatch.setattr(attribution, "GRADIENT_BYTES", 1)
        monkeypatch.setattr(flow, "MLP_POSITIONS", 5)
    if family == "llama":
        hf, model, names = request.getfixturevalue("llama_hf"), request.getfixturevalue(
            "llama"), LLAMA
    else:
        hf = request.getfixturevalue("gemma3_hf")
        model, names = tiny.wrap(hf, tokenizer, "tiny-gemma3"), GEMMA
    torch.manual_seed(3)
    n, width = 5, 12  # past the tiny Gemma 3's sliding window of 8
    clean = torch.randint(6, 300, (n, width))
    corrupted = clean.clone()
    corrupted[:, 2:5] = torch.randint(6, 300, (n, 3))
    answer, other = torch.randint(6, 300, (n,)), torch.randint(6, 300, (n,))
    positions = torch.tensor([11, 7, 11, 6, 10])
    task = Task(clean, corrupted, LogitDifference(answer, other, positions))
    graph = build_graph(model)
    got = edge_scores(model, graph, task, method="eap", max_batch_tokens=24).values

    def metric(logits):
        at = logits[torch.arange(n), positions]
        return at[torch.arange(n), answer] - at[torch.arange(n), other]

    # [S, B, T, d]
    delta = reference_senders(hf, clean, names) - reference_senders(hf, corrupted, names)
    grads = reference_receiver_grads(hf, clean, metric, names)  # [R, B, T, d]
    want = torch.einsum("sbtd,rbtd->sr", delta.double(), grads.double()).detach() / n
    want[~graph.edges] = 0
    assert want.abs().max() > 1e-4  # the comparison is not of zeros
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max()))
