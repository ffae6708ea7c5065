"""Edge scores by attribution: EAP (Syed et al. 2023) and EAP-IG (Hanna et al. 2024).

An edge's score approximates how much the metric falls when the edge carries its
sender's corrupted output instead of its clean one::

    score(s -> r) = sum over positions of  g_r . (out_s(clean) - out_s(corrupted))

averaged over prompts, with ``g_r`` the gradient of the metric with respect to the
receiver's input (the stream before the norm that feeds it,
:mod:`workbench.interventions.circuits.flow`). EAP takes ``g_r`` on the clean input; EAP-IG
averages it over ``m`` points on the straight line between the corrupted and the clean
input embeddings, ``corrupted + (k / m) (clean - corrupted)`` for ``k = 1 .. m`` (so
``m = 1`` is the clean end, EAP again).

How: a receiver's input is the sum of the outputs along the stream, so one backward pass
per point gives every receiver's gradient. The gradient is read at ``hook_q`` /
``hook_k`` / ``hook_v`` (one head's, or key-value head's, projection), at the MLP's input
and at the final norm's input; a q, k or v gradient is taken back through its projection
and the live first norm, an MLP's through its norm (a vector-Jacobian product of the norm
alone, per receiver). The senders' differences are kept as the hooks give them (a layer's
heads as one ``z``), and scores are contracted a slice of positions at a time, so no
``[sender or receiver, batch, pos, d_model]`` tensor of the whole model is held: what is
kept grows as a few ``[layer, batch, pos, d_model]``. The gradient pass runs each block
of the bridge checkpointed (:func:`flow.recomputed_layers`): its graph keeps each block's
input, and the backward pass runs one block again at a time; with blocked attention
(``attention="auto"`` where the family has it) a block's attention is recomputed a block
of query rows at a time within it, so no ``[head, T, T]`` tensor exists in either pass;
the pass stops at the final norm and only the positions the metric reads are unembedded
(:func:`flow.metric_values`), so no ``[batch, T, d_vocab]`` logits exist either, and what
is held is linear in T.

Examples:
    >>> scores = edge_scores(model, graph, task, method="eap-ig", steps=5)  # doctest: +SKIP
    >>> scores.ranking()[:10]                                                # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from workbench.core import heap, progress
from workbench.core.errors import WorkbenchError
from workbench.core.options import AttentionPath
from workbench.inputs.batching import Batch
from workbench.interventions.circuits import flow
from workbench.interventions.circuits.graph import Graph
from workbench.interventions.circuits.task import Task, check_steps
from workbench.models.base import Model
from workbench.recording import hooks

Method = Literal["eap", "eap-ig"]


@dataclass(frozen=True)
class EdgeScores:
    """Every edge's score, ``[sender, receiver]`` in float64 (0 where there is no edge)."""

    graph: Graph
    values: Float[Tensor, "sender receiver"]
    method: Method
    steps: int

    def per_edge(self) -> Float[Tensor, " edge"]:
        """The scores in the order of :meth:`Graph.edge_index`."""
        s, r = self.graph.edge_index()
        return self.values[s, r]

    def ranking(self) -> Tensor:
        """Edge indices (of :meth:`Graph.edge_index`) by descending ``|score|``."""
        return torch.argsort(self.per_edge().abs(), descending=True, stable=True)


def edge_scores(model: Model, graph: Graph, task: Task, *, method: Method = "eap-ig",
                steps: int = 5, max_batch_tokens: int = 512,
                attention: AttentionPath = "auto") -> EdgeScores:
    """Score every edge of ``graph`` on ``task``.

    Args:
        model: a causal LM the graph was built from.
        graph: :func:`workbench.interventions.circuits.graph.build_graph` of ``model``.
        task: the inputs and the metric.
        method: ``eap`` (gradient on the clean input) or ``eap-ig``.
        steps: EAP-IG's ``m`` (ignored by EAP).
        max_batch_tokens: tokens per pass.
        attention: ``blocked`` (no ``[head, T, T]`` tensor, forward or backward), ``dense``
            or ``auto`` (blocked where the family has it).

    Returns:
        The scores, averaged over prompts.

    Raises:
        WorkbenchError: an unknown method or ``steps < 1``.
    """
    if method not in ("eap", "eap-ig"):
        raise WorkbenchError(f"method must be eap or eap-ig, got {method!r}")
    check_steps(steps)
    m = 1 if method == "eap" else steps
    total = torch.zeros(graph.edges.shape, dtype=torch.float64)
    chunks = task.chunks(max_batch_tokens, model.paired_batches)
    weights = flow.projections(model)
    with flow.attention_run(model, attention):
        for rows in progress.track(chunks, desc=f"{method} scores"):
            total += _chunk_scores(model, graph, task, rows, method, m, weights)
    total /= m * task.n_prompts
    total[~graph.edges] = 0
    return EdgeScores(graph, total, method, m)


def _chunk_scores(model: Model, graph: Graph, task: Task, rows: slice, method: Method,
                  m: int, weights: dict[str, Tensor]) -> Tensor:
    clean_ids, corrupted_ids = task.clean[rows], task.corrupted[rows]
    names, captured = flow.sender_names(model), flow.capture_names(model)
    with torch.no_grad():
        clean = flow.divide_scales(model, hooks.capture(model, Batch.of(clean_ids), captured))
        corrupted = flow.divide_scales(model, hooks.capture(model, Batch.of(corrupted_ids),
                                                            captured))
    start = corrupted[names[0]]
    lines = clean[names[0]] - start
    # the senders' differences as they are kept (a head's ``z``, over its output norm's
    # scale where it has one, not ``z W_O``): a layer's heads take one [batch, pos,
    # d_model] here, not one per head; made in place in the clean outputs, each corrupted
    # one let go as it is used
    diff = {name: clean.pop(name).sub_(corrupted.pop(name)).float() for name in names}
    del clean, corrupted
    heap.release()  # the two passes' temporaries, freed among the differences kept
    out = torch.zeros(graph.edges.shape, dtype=torch.float64)
    for k in range(1, m + 1):
        embed = start + (k / m) * lines if method == "eap-ig" else None
        raw = receiver_gradients(model, clean_ids, embed, task, rows)
        out += _contract(model, graph, raw, diff, weights)
    return out


CONTRACT_BYTES = 1 << 26
"""The size of the senders' output differences formed at once, over a slice of positions."""


def _contract(model: Model, graph: Graph, raw: dict[str, Tensor], diff: dict[str, Tensor],
              weights: dict[str, Tensor]) -> Tensor:
    """``sum over rows and positions of g_r . delta_s`` for every sender and receiver,
    a slice of positions at a time (the norms act on each position alone, so a receiver's
    gradient at a position needs only that position)."""
    batch, width, d_model = diff[flow.sender_names(model)[0]].shape
    n_senders = len(graph.senders)
    step = max(1, CONTRACT_BYTES // (4 * n_senders * batch * d_model))
    out = torch.zeros(graph.edges.shape, dtype=torch.float64)
    for p0 in range(0, width, step):
        at = slice(p0, min(p0 + step, width))
        part = {name: t[:, at] for name, t in diff.items()}
        delta = flow.stack_outputs(model, part, weights).float()  # [S, B, P, d]
        sliced = {name: t[:, at] for name, t in raw.items()}
        for layer in range(model.info.n_layers + 1):
            first, receivers = flow.layer_receivers(graph, layer)
            grads = _layer_gradients(model, layer, sliced, weights)  # [R_L, B, P, d]
            block = torch.einsum("sbtd,rbtd->sr", delta, grads.float())
            out[:, first: first + len(receivers)] += block.double()
    return out


def receiver_gradients(model: Model, ids: Tensor, embed: Tensor | None, task: Task,
                       rows: slice) -> dict[str, Tensor]:
    """One forward and one backward pass: the gradient of the summed metric at each
    layer's ``hook_q`` / ``hook_k`` / ``hook_v``, MLP input and the final norm's
    input, and the inputs of the norms in front of them (for the vector-Jacobian
    products).

    Args:
        model: the model.
        ids: ``[batch, pos]`` token ids.
        embed: the embedding to run from instead of ``ids``' own (``None``: their own).
        task: gives the metric.
        rows: the task rows ``ids`` are.

    Returns:
        ``{hook name: gradient}`` and ``{ln1 input hook: input}`` together.
    """
    n = model.info.n_layers
    wanted = [name for layer in range(n) for name in
              (hooks.qkv(layer, "q"), hooks.qkv(layer, "k"), hooks.qkv(layer, "v"),
               flow.mlp_in(layer))] + [flow.FINAL_IN]
    kept = sorted({name for layer in range(n)
                   for name in (flow.ln_in(layer, "ln1"), flow.mlp_norm(model, layer)[0])})
    grads: dict[str, Tensor] = {}
    inputs: dict[str, Tensor] = {}
    begun: list[Tensor] = []

    def start(x: Tensor, hook: Any) -> Tensor:
        x = (x if embed is None else embed.to(x.dtype)).detach().requires_grad_(True)
        if not begun:
            begun.append(x)
        return x

    def read(name: str):
        def hook(x: Tensor, hook: Any) -> Tensor:
            x = x.clone()  # this tensor reaches only the hook's own consumer
            if name not in seen:  # not again when its block is recomputed
                seen[name] = x.new_zeros(()).expand(x.shape)
                # the gradient is kept as it passes, so the tensor itself is not
                x.register_hook(partial(grads.__setitem__, name))
            return x
        return hook

    def keep(name: str):
        def hook(x: Tensor, hook: Any) -> None:
            inputs.setdefault(name, x.detach())
        return hook

    seen: dict[str, Tensor] = {}  # a zero of each hooked tensor's shape
    fwd = [(hooks.resid(0, n), start), *[(name, read(name)) for name in wanted],
           *[(name, keep(name)) for name in kept]]
    with torch.enable_grad(), model.bridge.hooks(fwd_hooks=fwd), flow.recomputed_layers(model):
        total = flow.metric_values(model, ids, task.metric, rows).sum()
        torch.autograd.grad(total, begun[0])
    out = {name: grads[name].detach() if name in grads else seen[name].clone()
           for name in wanted}
    return {**out, **inputs}


def _layer_gradients(model: Model, layer: int, raw: dict[str, Tensor],
                     weights: dict[str, Tensor]
                     ) -> Float[Tensor, "receiver batch pos d_model"]:
    """The gradients at the receiver inputs of ``layer`` (q heads, k and v key-value heads,
    MLP), or at the logits' for ``layer == n_layers``."""
    if layer == model.info.n_layers:
        return raw[flow.FINAL_IN][None]
    cotangents = torch.cat([
        torch.einsum("bthe,hde->hbtd", raw[hooks.qkv(layer, which)],
                     weights[which][layer])
        for which in ("q", "k", "v")])
    through = vjp_norm(flow.norm_module(model, layer), raw[flow.ln_in(layer, "ln1")],
                       cotangents)
    name, module = flow.mlp_norm(model, layer)
    mlp = vjp_norm(module, raw[name], raw[flow.mlp_in(layer)][None])
    return torch.cat([through, mlp])


def vjp_norm(module: Any, x: Float[Tensor, "batch pos d_model"],
             cotangents: Float[Tensor, "n batch pos d_model"]
             ) -> Float[Tensor, "n batch pos d_model"]:
    """Each cotangent at the norm's output taken back to its input, at ``x`` (one batched
    vector-Jacobian product; one at a time where the norm's code cannot be batched)."""
    with torch.enable_grad():
        leaf = x.detach().requires_grad_(True)
        y = module(leaf)
        try:
            return torch.autograd.grad(y, leaf, cotangents.to(y.dtype), retain_graph=True,
                                       is_grads_batched=True)[0]
        except RuntimeError:
            back = [torch.autograd.grad(y, leaf, c.to(y.dtype), retain_graph=True)[0]
                    for c in cotangents]
    return torch.stack(back)
