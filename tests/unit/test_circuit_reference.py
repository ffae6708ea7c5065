"""EAP edge scores against an independent gradient x difference in plain Hugging Face.

The reference side uses only ``transformers`` modules and torch hooks, no bridge and no
workbench code: every receiver gets its own zero input offset ``delta_r`` (added to the
residual stream before the norm, for that head's q, k or v projection alone, for the
MLP's norm, or for the final norm), one backward pass gives ``d metric / d delta_r``, and
an edge's score is that gradient dotted with the sender's clean minus corrupted output,
summed over positions and averaged over prompts.
"""

from __future__ import annotations

import torch

from workbench.interventions.circuits.attribution import edge_scores
from workbench.interventions.circuits.graph import build_graph
from workbench.interventions.circuits.task import LogitDifference, Task


def reference_senders(hf, ids):
    """embed, then per layer each head's ``z_h W_O^h`` and the MLP's output."""
    kept, handles = {}, []
    attn = [layer.self_attn for layer in hf.model.layers]
    handles.append(hf.model.embed_tokens.register_forward_hook(
        lambda mod, args, out: kept.__setitem__("embed", out)))
    for i, layer in enumerate(hf.model.layers):
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda mod, args, i=i: kept.__setitem__(("z", i), args[0])))
        handles.append(layer.mlp.register_forward_hook(
            lambda mod, args, out, i=i: kept.__setitem__(("mlp", i), out)))
    with torch.no_grad():
        hf(ids)
    for h in handles:
        h.remove()
    d_head = hf.config.hidden_size // hf.config.num_attention_heads
    out = [kept["embed"]]
    for i, a in enumerate(attn):
        w = a.o_proj.weight  # [d_model, heads * d_head]
        z = kept[("z", i)]
        out += [z[..., h * d_head:(h + 1) * d_head] @ w[:, h * d_head:(h + 1) * d_head].T
                for h in range(hf.config.num_attention_heads)]
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


def reference_receiver_grads(hf, ids, metric):
    """``d metric / d delta_r`` of every receiver in the graph's order."""
    cfg = hf.config
    d_head, shape = cfg.hidden_size // cfg.num_attention_heads, (*ids.shape, cfg.hidden_size)
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
        handles.append(layer.post_attention_layernorm.register_forward_pre_hook(
            lambda mod, args, d=mlp: (args[0] + d,)))
    final = zeros()
    deltas.append(final)
    handles.append(hf.model.norm.register_forward_pre_hook(lambda mod, args: (args[0] + final,)))
    logits = hf(ids).logits
    grads = torch.autograd.grad(metric(logits).sum(), deltas)
    for h in handles:
        h.remove()
    return torch.stack(grads)


def test_eap_scores_equal_plain_huggingface_gradient_times_difference(llama, llama_hf):
    torch.manual_seed(3)
    n, width = 5, 9
    clean = torch.randint(6, 300, (n, width))
    corrupted = clean.clone()
    corrupted[:, 2:5] = torch.randint(6, 300, (n, 3))
    answer, other = torch.randint(6, 300, (n,)), torch.randint(6, 300, (n,))
    positions = torch.tensor([8, 7, 8, 6, 8])
    task = Task(clean, corrupted, LogitDifference(answer, other, positions))
    graph = build_graph(llama)
    got = edge_scores(llama, graph, task, method="eap", max_batch_tokens=18).values

    def metric(logits):
        at = logits[torch.arange(n), positions]
        return at[torch.arange(n), answer] - at[torch.arange(n), other]

    # [S, B, T, d]
    delta = reference_senders(llama_hf, clean) - reference_senders(llama_hf, corrupted)
    grads = reference_receiver_grads(llama_hf, clean, metric)  # [R, B, T, d]
    want = torch.einsum("sbtd,rbtd->sr", delta.double(), grads.double()).detach() / n
    want[~graph.edges] = 0
    assert want.abs().max() > 1e-4  # the comparison is not of zeros
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max()))
