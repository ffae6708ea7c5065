"""Runs with chosen edges ablated: a circuit's metric, and exact edge patching.

An ablated edge ``s -> r`` carries the sender's *reference* output instead of its output in
this pass: the receiver's input becomes ``x_r + sum over ablated s of (ref_s - out_s)``,
every other receiver sees the stream as it is (Hanna et al.'s edge ablation). The reference
is the sender's output on the corrupted input (``corrupted``), or its mean over the task's
clean prompts at each position (``mean``). A receiver's changed input reaches a head through
its projection and the live first norm, an MLP through its live norm
(:mod:`workbench.interventions.circuits.flow`), the logits at the final norm's input.

With every edge kept the pass is the clean run, untouched; with every edge ablated to the
corrupted outputs each receiver reads its corrupted input, so the pass is the corrupted run
(up to float round-off).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.core.options import AttentionPath
from workbench.interventions.circuits import flow
from workbench.interventions.circuits.graph import Graph
from workbench.interventions.circuits.task import Task
from workbench.models.base import Model
from workbench.recording import hooks

Ablation = Literal["corrupted", "mean"]


def check_ablation(ablation: str) -> None:
    """Raises WorkbenchError: an ablation other than ``corrupted`` or ``mean``."""
    if ablation not in ("corrupted", "mean"):
        raise WorkbenchError(f"ablation must be corrupted or mean, got {ablation!r}")


def mean_outputs(model: Model, task: Task, max_batch_tokens: int = 512
                 ) -> Float[Tensor, "sender pos d_model"]:
    """Every sender's output averaged over the task's clean prompts, at each position."""
    total: Tensor | None = None
    for rows in task.chunks(max_batch_tokens, model.paired_batches):
        part = flow.sender_outputs(model, task.clean[rows]).sum(1)
        total = part if total is None else total + part
    assert total is not None
    return total / task.n_prompts


def circuit_metrics(model: Model, graph: Graph, task: Task,
                    keeps: Sequence[Bool[Tensor, "sender receiver"]], *,
                    ablation: Ablation = "corrupted", max_batch_tokens: int = 512,
                    attention: AttentionPath = "auto", desc: str = "circuits"
                    ) -> Float[np.ndarray, "prompt circuit"]:
    """The metric of each prompt with every edge outside each circuit ablated.

    Args:
        model, graph, task: as for :func:`workbench.interventions.circuits.attribution.edge_scores`.
        keeps: each circuit's kept edges, ``[sender, receiver]``.
        ablation: ``corrupted`` or ``mean`` (see the module docstring).
        max_batch_tokens: tokens per pass.
        attention: ``blocked``, ``dense`` or ``auto`` (see
            :func:`workbench.interventions.circuits.flow.attention_run`).
        desc: a progress label.

    Returns:
        ``[prompt, circuit]`` metrics (float64).
    """
    check_ablation(ablation)
    with flow.attention_run(model, attention):
        return _circuit_metrics(model, graph, task, keeps, ablation, max_batch_tokens, desc)


def _circuit_metrics(model: Model, graph: Graph, task: Task, keeps: Sequence[Tensor],
                     ablation: Ablation, max_batch_tokens: int, desc: str) -> np.ndarray:
    mean = mean_outputs(model, task, max_batch_tokens) if ablation == "mean" else None
    weights = flow.projections(model)
    out = np.full((task.n_prompts, len(keeps)), np.nan)
    chunks = task.chunks(max_batch_tokens, model.paired_batches)
    for rows in progress.track(chunks, desc=desc):
        ids = task.clean[rows]
        if mean is None:
            ref = flow.sender_outputs(model, task.corrupted[rows], weights)
        else:
            ref = mean[:, None].expand(-1, ids.shape[0], -1, -1)
        for c, keep in enumerate(keeps):
            ablated = graph.edges & ~keep
            with torch.no_grad(), model.bridge.hooks(
                    fwd_hooks=_EdgeAblation(model, graph, ref, ablated, weights).fwd_hooks()):
                got = flow.metric_values(model, ids, task.metric, rows)
            out[rows, c] = got.double().numpy()
    return out


def edge_patching(model: Model, graph: Graph, task: Task, edges: Sequence[int], *,
                  ablation: Ablation = "corrupted", max_batch_tokens: int = 512,
                  attention: AttentionPath = "auto") -> Float[np.ndarray, " edge"]:
    """Exact edge patching, one run per edge: the clean metric minus the metric with that
    edge alone ablated, averaged over prompts (the quantity EAP approximates).

    Args:
        edges: indices into :meth:`Graph.edge_index`.
    """
    s, r = graph.edge_index()
    keeps = [graph.edges.clone()]
    for k in edges:
        keep = graph.edges.clone()
        keep[s[k], r[k]] = False
        keeps.append(keep)
    got = circuit_metrics(model, graph, task, keeps, ablation=ablation,
                          max_batch_tokens=max_batch_tokens, attention=attention,
                          desc="edge patching")
    return (got[:, :1] - got[:, 1:]).mean(0)


class _EdgeAblation:
    """The hooks of one pass with ``ablated`` edges: they read each sender's output as the
    pass computes it and add ``sum (ref - out)`` over a receiver's ablated senders to the
    receiver's input."""

    def __init__(self, model: Model, graph: Graph, ref: Tensor, ablated: Tensor,
                 weights: dict[str, Tensor]) -> None:
        self.model, self.graph, self.ref = model, graph, ref
        self.ablated = ablated.to(ref.dtype)
        self.diff = torch.empty_like(ref)  # ref - out of each sender run so far
        self.seen = 0
        self.inputs: dict[str, Tensor] = {}
        self.weights = weights
        self.scales = flow.scale_names(model)
        self.z: Tensor | None = None  # a normed layer's z, until its norm's scale is seen

    def fwd_hooks(self) -> list[tuple[str, Any]]:
        n = self.model.info.n_layers
        fwd: list[tuple[str, Any]] = [(hooks.resid(0, n), self.embed)]
        for layer in range(n):
            norm_in = flow.mlp_norm(self.model, layer)[0]
            fwd += [*[(name, self.keep(name)) for name in
                      dict.fromkeys([flow.ln_in(layer, "ln1"), norm_in])],
                    *[(hooks.qkv(layer, w), self.project(layer, w)) for w in ("q", "k", "v")],
                    (hooks.z(layer), self.heads(layer)),
                    *([(self.scales[layer], self.scaled(layer))] if layer in self.scales
                      else []),
                    (flow.mlp_in(layer), self.into_mlp(layer)),
                    (hooks.mlp_out(layer), self.mlp)]
        return [*fwd, (flow.FINAL_IN, self.into_logits(n))]

    def record(self, outs: Tensor) -> None:
        """``[sender, batch, pos, d_model]`` outputs of the next senders, in order."""
        n = outs.shape[0]
        torch.sub(self.ref[self.seen: self.seen + n], outs,
                  out=self.diff[self.seen: self.seen + n])
        self.seen += n

    def embed(self, x: Tensor, hook: Any) -> None:
        self.seen = 0  # a new pass
        self.record(x[None])

    def keep(self, name: str):
        def hook(x: Tensor, hook: Any) -> None:
            self.inputs[name] = x
        return hook

    def heads(self, layer: int):
        def hook(z: Tensor, hook: Any) -> None:
            if layer in self.scales:  # its output is known once its norm's scale is
                self.z = z
            else:
                self.record(flow.head_outputs(z, self.weights, layer))
        return hook

    def scaled(self, layer: int):
        def hook(scale: Tensor, hook: Any) -> None:
            assert self.z is not None
            self.record(flow.head_outputs(self.z / scale[..., None], self.weights, layer))
            self.z = None
        return hook

    def mlp(self, x: Tensor, hook: Any) -> None:
        self.record(x[None])

    def change(self, receivers: list[int]) -> Tensor | None:
        """``[receiver, batch, pos, d_model]``: what each receiver's input gains, or
        ``None`` when none of them has an ablated edge."""
        cols = self.ablated[:, receivers]
        if not bool(cols.any()):
            return None
        seen = self.seen
        if bool(cols[seen:].any()):
            raise WorkbenchError("an ablated edge's sender had not run before its receiver")
        return torch.einsum("sr,sbtd->rbtd", cols[:seen], self.diff[:seen])

    def project(self, layer: int, which: str):
        first, receivers = flow.layer_receivers(self.graph, layer)
        index = [first + i for i, r in enumerate(receivers) if r.kind == which]
        weights = self.weights[which][layer]
        norm, name = flow.norm_module(self.model, layer), flow.ln_in(layer, "ln1")

        def hook(x: Tensor, hook: Any) -> Tensor:
            added = self.change(index)
            if added is None:
                return x
            inp = self.inputs[name]
            moved = norm(inp[None] + added) - norm(inp)[None]  # [index, B, T, d]
            return x + torch.einsum("ibtd,ide->btie", moved, weights).to(x.dtype)
        return hook

    def into_mlp(self, layer: int):
        first, receivers = flow.layer_receivers(self.graph, layer)
        index = [first + i for i, r in enumerate(receivers) if r.kind == "mlp"]
        name, norm = flow.mlp_norm(self.model, layer)

        def hook(x: Tensor, hook: Any) -> Tensor:
            added = self.change(index)
            if added is None:
                return x
            inp = self.inputs[name]
            return x + (norm(inp + added[0]) - norm(inp)).to(x.dtype)
        return hook

    def into_logits(self, n_layers: int):
        index = [len(self.graph.receivers) - 1]

        def hook(x: Tensor, hook: Any) -> Tensor:
            added = self.change(index)
            return x if added is None else x + added[0].to(x.dtype)
        return hook
