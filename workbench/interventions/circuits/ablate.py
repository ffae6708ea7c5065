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

A pass holds every sender's reference and its difference from it, ``[sender, batch, pos,
d_model]`` each: on gemma3 91 senders of 640, 7.6 GB each at 32,768 tokens. With
``low_memory`` on (:func:`workbench.interventions.circuits.attribution.is_low_memory`) both
are files in a temporary folder, one per sender (:class:`Outputs`), written as each
sender's hook fires and read back one sender at a time, so the process holds one
sender's tensor and one receiver group's change to its input, and the files sit in the
operating system's page cache where memory allows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.core.options import AttentionPath
from workbench.interventions.circuits import flow
from workbench.interventions.circuits.attribution import LowMemory, check_low_memory, scratch_folder
from workbench.interventions.circuits.differences import Outputs
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
                    attention: AttentionPath = "auto", low_memory: LowMemory = "auto",
                    desc: str = "circuits") -> Float[np.ndarray, "prompt circuit"]:
    """The metric of each prompt with every edge outside each circuit ablated.

    Args:
        model, graph, task: as for :func:`workbench.interventions.circuits.attribution.edge_scores`.
        keeps: each circuit's kept edges, ``[sender, receiver]``.
        ablation: ``corrupted`` or ``mean`` (see the module docstring).
        max_batch_tokens: tokens per pass.
        attention: ``blocked``, ``dense`` or ``auto`` (see
            :func:`workbench.interventions.circuits.flow.attention_run`).
        low_memory: ``on``: the senders' references and differences are files (see the
            module docstring); ``off``: in memory; ``auto``: files where a pass's
            senders' differences reach
            :data:`~workbench.interventions.circuits.attribution.LOW_MEMORY_BYTES`.
        desc: a progress label.

    Returns:
        ``[prompt, circuit]`` metrics (float64).
    """
    check_ablation(ablation)
    check_low_memory(low_memory)
    with flow.attention_run(model, attention), _scratch(model, task, max_batch_tokens,
                                                        low_memory) as folder:
        return _circuit_metrics(model, graph, task, keeps, ablation, max_batch_tokens, desc,
                                folder)


@contextlib.contextmanager
def _scratch(model: Model, task: Task, max_batch_tokens: int, low_memory: LowMemory
             ) -> Iterator[Path | None]:
    """One folder for every pass of a call where its largest pass keeps memory low."""
    largest = max(task.chunks(max_batch_tokens, model.paired_batches),
                  key=lambda rows: task.clean[rows].numel())
    with scratch_folder(model, task.clean[largest], low_memory) as folder:
        yield folder


def _circuit_metrics(model: Model, graph: Graph, task: Task, keeps: Sequence[Tensor],
                     ablation: Ablation, max_batch_tokens: int, desc: str,
                     folder: Path | None) -> np.ndarray:
    weights = flow.projections(model)
    mean: Tensor | Outputs | None = None
    if ablation == "mean":
        mean = (mean_outputs(model, task, max_batch_tokens) if folder is None
                else _mean_files(model, task, max_batch_tokens, weights, folder))
    out = np.full((task.n_prompts, len(keeps)), np.nan)
    chunks = task.chunks(max_batch_tokens, model.paired_batches)
    for rows in progress.track(chunks, desc=desc):
        ids = task.clean[rows]
        ref: Tensor | Outputs
        if isinstance(mean, Tensor):
            ref = mean[:, None].expand(-1, ids.shape[0], -1, -1)
        elif mean is not None:
            ref = mean
        elif folder is None:
            ref = flow.sender_outputs(model, task.corrupted[rows], weights)
        else:
            ref = _output_files(model, task.corrupted[rows], weights, folder)
        for c, keep in enumerate(keeps):
            ablated = graph.edges & ~keep
            with torch.no_grad(), model.bridge.hooks(fwd_hooks=_EdgeAblation(
                    model, graph, ref, ablated, weights, folder).fwd_hooks()):
                got = flow.metric_values(model, ids, task.metric, rows)
            out[rows, c] = got.double().numpy()
    return out


def _by_sender(model: Model, weights: dict[str, Tensor], name: str, x: Tensor
               ) -> Iterator[tuple[int, Tensor]]:
    """The senders' indices and ``[batch, pos, d_model]`` outputs in a tensor that
    :func:`flow.each_output` gives as ``name``: the embedding, a layer's ``z`` (its heads),
    or its MLP's output."""
    n, heads = model.info.n_layers, model.info.n_heads
    if name == hooks.resid(0, n):
        yield 0, x
        return
    for layer in range(n):
        first = 1 + layer * (heads + 1)
        if name == hooks.z(layer):
            yield from enumerate(flow.head_outputs(x, weights, layer), start=first)
            return
        if name == hooks.mlp_out(layer):
            yield first + heads, x
            return
    raise WorkbenchError(f"{name} is not a sender's hook")


def _output_files(model: Model, ids: Tensor, weights: dict[str, Tensor], folder: Path
                  ) -> Outputs:
    """Every sender's output on ``ids``, written to ``folder`` as its hook fires."""
    outputs = Outputs(folder, "reference", (*ids.shape, model.info.d_model))

    def give(name: str, x: Tensor) -> None:
        for index, tensor in _by_sender(model, weights, name, x):
            outputs.write(index, tensor)
    flow.each_output(model, ids, give)
    return outputs


def _mean_files(model: Model, task: Task, max_batch_tokens: int,
                weights: dict[str, Tensor], folder: Path) -> Outputs:
    """:func:`mean_outputs` written to ``folder``, ``[1, pos, d_model]`` a sender."""
    mean = Outputs(folder, "mean", (1, task.clean.shape[1], model.info.d_model))

    def give(name: str, x: Tensor) -> None:
        for index, tensor in _by_sender(model, weights, name, x):
            mean.add(index, tensor.sum(0, keepdim=True, dtype=torch.float32) / task.n_prompts)
    for rows in task.chunks(max_batch_tokens, model.paired_batches):
        flow.each_output(model, task.clean[rows], give)
    return mean


def edge_patching(model: Model, graph: Graph, task: Task, edges: Sequence[int], *,
                  ablation: Ablation = "corrupted", max_batch_tokens: int = 512,
                  attention: AttentionPath = "auto", low_memory: LowMemory = "auto"
                  ) -> Float[np.ndarray, " edge"]:
    """Exact edge patching, one run per edge: the clean metric minus the metric with that
    edge alone ablated, averaged over prompts (the quantity EAP approximates).

    Args:
        edges: indices into :meth:`Graph.edge_index`.
        ablation, max_batch_tokens, attention, low_memory: as for :func:`circuit_metrics`.
    """
    s, r = graph.edge_index()
    keeps = [graph.edges.clone()]
    for k in edges:
        keep = graph.edges.clone()
        keep[s[k], r[k]] = False
        keeps.append(keep)
    got = circuit_metrics(model, graph, task, keeps, ablation=ablation,
                          max_batch_tokens=max_batch_tokens, attention=attention,
                          low_memory=low_memory, desc="edge patching")
    return (got[:, :1] - got[:, 1:]).mean(0)


class _EdgeAblation:
    """The hooks of one pass with ``ablated`` edges: they read each sender's output as the
    pass computes it and add ``sum (ref - out)`` over a receiver's ablated senders to the
    receiver's input. ``ref`` is ``[sender, batch, pos, d_model]`` in memory, or files
    (with ``folder``, where the differences are written too)."""

    def __init__(self, model: Model, graph: Graph, ref: Tensor | Outputs, ablated: Tensor,
                 weights: dict[str, Tensor], folder: Path | None = None) -> None:
        self.model, self.graph, self.ref = model, graph, ref
        self.diff: Tensor | Outputs  # ref - out of each sender run so far
        if isinstance(ref, Tensor):
            self.ablated = ablated.to(ref.dtype)
            self.diff = torch.empty_like(ref)
        else:
            if folder is None:
                raise WorkbenchError("references in files need a folder for the differences")
            self.ablated = ablated.to(torch.float32)
            self.diff = Outputs(folder, "difference", (0,))  # shaped by the embedding
        self.dtype: torch.dtype | None = None  # the pass's, from the embedding
        self.seen = 0
        self.inputs: dict[str, Tensor] = {}  # the norms' inputs of one layer
        self.layer = -1  # theirs
        self.weights = weights
        self.scales = flow.scale_names(model)
        self.z: Tensor | None = None  # a normed layer's z, until its norm's scale is seen
        self._shared: tuple[int, Tensor | None] | None = None  # see shared()

    def fwd_hooks(self) -> list[tuple[str, Any]]:
        n = self.model.info.n_layers
        fwd: list[tuple[str, Any]] = [(hooks.resid(0, n), self.embed)]
        for layer in range(n):
            norm_in = flow.mlp_norm(self.model, layer)[0]
            fwd += [*[(name, self.keep(layer, name)) for name in
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
        if isinstance(self.diff, Tensor):
            assert isinstance(self.ref, Tensor)
            torch.sub(self.ref[self.seen: self.seen + n], outs,
                      out=self.diff[self.seen: self.seen + n])
        else:
            assert isinstance(self.ref, Outputs)
            for k in range(n):
                self.diff.write(self.seen + k, self.ref.read(self.seen + k) - outs[k])
        self.seen += n

    def embed(self, x: Tensor, hook: Any) -> None:
        self.seen, self.dtype, self._shared = 0, x.dtype, None  # a new pass
        self.inputs.clear()
        self.layer = -1
        if isinstance(self.diff, Outputs):
            self.diff = Outputs(self.diff.folder, self.diff.prefix, tuple(x.shape))
        self.record(x[None])

    def keep(self, layer: int, name: str):
        """Keep a norm's input for this layer's receivers; an earlier layer's are let go
        (each a ``[batch, pos, d_model]`` residual stream, two a layer)."""
        def hook(x: Tensor, hook: Any) -> None:
            if self.layer != layer:
                self.inputs.clear()
                self.layer = layer
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
        if isinstance(self.diff, Tensor):
            return torch.einsum("sr,sbtd->rbtd", cols[:seen], self.diff[:seen])
        out = torch.zeros(len(receivers), *self.diff.shape)
        for s in cols[:seen].any(1).nonzero().flatten().tolist():
            diff = self.diff.read(s)  # one sender's at a time, into each receiver it feeds
            for r in cols[s].nonzero().flatten().tolist():
                out[r].add_(diff, alpha=float(cols[s, r]))
        return out.to(self.dtype)

    def shared(self, group: list[int], index: list[int]) -> Tensor | None:
        """:meth:`change` of ``index`` from one reading of the senders' files for every
        receiver of ``group`` (a layer's queries, keys and values: the same senders feed
        them), kept for the group's other hooks in this pass."""
        if not bool(self.ablated[:, index].any()):
            return None
        if self._shared is None or self._shared[0] != group[0]:
            self._shared = None  # the last group's, let go before this one is made
            self._shared = (group[0], self.change(group))
        whole = self._shared[1]
        assert whole is not None
        at = [group.index(i) for i in index]
        contiguous = at == list(range(at[0], at[0] + len(at)))
        return whole[at[0]: at[0] + len(at)] if contiguous else whole[at]

    def project(self, layer: int, which: str):
        first, receivers = flow.layer_receivers(self.graph, layer)
        index = [first + i for i, r in enumerate(receivers) if r.kind == which]
        heads = [first + i for i, r in enumerate(receivers) if r.kind in ("q", "k", "v")]
        weights = self.weights[which][layer]
        norm, name = flow.norm_module(self.model, layer), flow.ln_in(layer, "ln1")

        def hook(x: Tensor, hook: Any) -> Tensor:
            added = (self.change(index) if isinstance(self.diff, Tensor)
                     else self.shared(heads, index))
            if added is None:
                return x
            inp = self.inputs[name]
            base, out = norm(inp), x.clone()
            for i in range(len(index)):  # one [B, T, d_model] at a time, not [index, ...]
                moved = norm(inp + added[i]).sub_(base)
                out[:, :, i] += torch.matmul(moved, weights[i]).to(x.dtype)
            return out
        return hook

    def into_mlp(self, layer: int):
        first, receivers = flow.layer_receivers(self.graph, layer)
        index = [first + i for i, r in enumerate(receivers) if r.kind == "mlp"]
        name, norm = flow.mlp_norm(self.model, layer)

        def hook(x: Tensor, hook: Any) -> Tensor:
            self._shared = None  # the layer's queries, keys and values have had theirs
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
