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
heads as one ``z``), made by subtracting the corrupted pass's outputs from the clean
pass's in place as its hooks fire (:func:`sender_differences`). The receivers' gradients
are contracted with them within the backward pass, a group of layers at a time as it
reaches them (:func:`point_scores`; one layer at a time on a long input), and a slice of
positions at a time, so no ``[sender or receiver, batch, pos, d_model]`` tensor of the
whole model is held: what is kept is the differences (in memory, or with ``low_memory``
in files read back a slice of positions at a time: :class:`Differences`), each block's
input (with ``low_memory`` in files too), and about one layer's gradients. The gradient
pass runs each block of the bridge checkpointed (:func:`flow.recomputed_layers`): its
graph keeps each block's input, and the backward pass runs one block again at a time;
with blocked attention (``attention="auto"`` where the family has it) a block's attention
is recomputed a block of query rows at a time within it, so no ``[head, T, T]`` tensor
exists in either pass; the pass stops at the final norm and only the positions the metric
reads are unembedded (:func:`flow.metric_values`), so no ``[batch, T, d_vocab]`` logits
exist either, and what is held is linear in T.

Examples:
    >>> scores = edge_scores(model, graph, task, method="eap-ig", steps=5)  # doctest: +SKIP
    >>> scores.ranking()[:10]                                                # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from workbench.core import heap, progress
from workbench.core.errors import WorkbenchError
from workbench.core.options import AttentionPath
from workbench.interventions.circuits import flow
from workbench.interventions.circuits.differences import Differences, spilled
from workbench.interventions.circuits.graph import Graph
from workbench.interventions.circuits.task import Task, check_steps
from workbench.models.base import Model
from workbench.recording import hooks

Method = Literal["eap", "eap-ig"]
LowMemory = Literal["auto", "on", "off"]

LOW_MEMORY_BYTES = 1 << 30
"""With ``low_memory="auto"``, the senders' differences of one pass from which they are
written to files and large allocations mapped alone (:func:`edge_scores`)."""


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
                attention: AttentionPath = "auto", low_memory: LowMemory = "auto"
                ) -> EdgeScores:
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
        low_memory: ``on``: the senders' differences are written to files in the
            temporary folder (``TMPDIR``) and read back a slice of positions at a time
            (:class:`Differences`), so is what the gradient pass's autograd graph keeps
            outside its checkpointed blocks, each block's input
            (:func:`~workbench.interventions.circuits.differences.spilled`), and
            allocations of 1 MiB or more are mapped alone from then on in this process
            (:func:`workbench.core.heap.map_large`), for less memory and some more time;
            ``off``: none of these; ``auto``: on for a pass whose differences reach
            :data:`LOW_MEMORY_BYTES`.

    Returns:
        The scores, averaged over prompts.

    Raises:
        WorkbenchError: an unknown method or low_memory, or ``steps < 1``.
    """
    if method not in ("eap", "eap-ig"):
        raise WorkbenchError(f"method must be eap or eap-ig, got {method!r}")
    check_low_memory(low_memory)
    check_steps(steps)
    m = 1 if method == "eap" else steps
    total = torch.zeros(graph.edges.shape, dtype=torch.float64)
    chunks = task.chunks(max_batch_tokens, model.paired_batches)
    weights = flow.projections(model)
    with flow.attention_run(model, attention):
        for rows in progress.track(chunks, desc=f"{method} scores"):
            with scratch_folder(model, task.clean[rows], low_memory) as folder:
                total += _chunk_scores(model, graph, task, rows, method, m, weights, folder)
    total /= m * task.n_prompts
    total[~graph.edges] = 0
    return EdgeScores(graph, total, method, m)


def difference_bytes(model: Model, tokens: int) -> int:
    """The bytes of the senders' differences over ``tokens`` (float32): the embedding's and
    each layer's MLP output, ``d_model`` each, and each layer's ``z``."""
    info = model.info
    per_token = info.d_model * (info.n_layers + 1) + info.n_layers * info.n_heads * info.d_head
    return 4 * per_token * tokens


def check_low_memory(low_memory: str) -> None:
    """Raises WorkbenchError: a ``low_memory`` other than ``auto``, ``on`` or ``off``."""
    if low_memory not in ("auto", "on", "off"):
        raise WorkbenchError(f"low_memory must be auto, on or off, got {low_memory!r}")


def is_low_memory(model: Model, tokens: int, low_memory: LowMemory) -> bool:
    """Whether a pass over ``tokens`` keeps its memory low under ``low_memory``."""
    return low_memory == "on" or (low_memory == "auto"
                                  and difference_bytes(model, tokens) >= LOW_MEMORY_BYTES)


@contextlib.contextmanager
def scratch_folder(model: Model, ids: Tensor, low_memory: LowMemory) -> Iterator[Path | None]:
    """A temporary folder for a pass's differences where memory is to be kept low (and
    large allocations mapped alone from then on), else ``None``."""
    if not is_low_memory(model, ids.numel(), low_memory):
        yield None
        return
    heap.map_large()
    with tempfile.TemporaryDirectory(prefix="workbench-differences-") as name:
        yield Path(name)


def _chunk_scores(model: Model, graph: Graph, task: Task, rows: slice, method: Method,
                  m: int, weights: dict[str, Tensor], folder: Path | None) -> Tensor:
    clean_ids = task.clean[rows]
    diff, start = sender_differences(model, clean_ids, task.corrupted[rows],
                                     keep_start=method == "eap-ig", folder=folder)
    heap.release()  # the two passes' temporaries, freed among the differences kept
    lines = diff.whole(flow.sender_names(model)[0])  # the embedding's: clean less corrupted
    out = torch.zeros(graph.edges.shape, dtype=torch.float64)
    for k in range(1, m + 1):
        embed = None if start is None else start + (k / m) * lines
        out += point_scores(model, graph, clean_ids, embed, task, rows, diff, weights)
    return out


def sender_differences(model: Model, clean_ids: Tensor, corrupted_ids: Tensor, *,
                       keep_start: bool = False, folder: Path | None = None
                       ) -> tuple[Differences, Tensor | None]:
    """Each sender's output on ``clean_ids`` less its output on ``corrupted_ids``, as the
    hooks give it: a layer's heads as one ``z`` (over its output norm's scale where it has
    one, :func:`flow.divide_scales`), not one ``z_h W_O^h`` per head.

    The clean pass's outputs are kept, in float32, and the corrupted pass's are subtracted
    from them as its hooks fire, so the two passes' tensors are never held together: what
    is held is one set of differences (none, with ``folder``: each sender's is written
    there as it fires) and one layer's ``z`` of the pass.

    Args:
        model: the model.
        clean_ids: ``[batch, pos]`` token ids.
        corrupted_ids: the corrupted ids, of the same shape.
        keep_start: keep the corrupted embedding as well (EAP-IG's line starts there).
        folder: write the differences to files there (:class:`Differences`).

    Returns:
        ``(the differences by hook name at flow.sender_names, the corrupted embedding or
        None)``.
    """
    diff = Differences(folder)
    starts: list[Tensor] = []
    flow.each_output(model, clean_ids, diff.put)
    flow.each_output(model, corrupted_ids, diff.subtract, starts if keep_start else None)
    return diff, (starts[0] if starts else None)


CONTRACT_BYTES = 1 << 26
"""The size of the senders' output differences formed at once, over a slice of positions."""

GRADIENT_BYTES = 1 << 28
"""The receivers' gradients (and their norms' inputs) a pass holds before it contracts
them with the senders' differences and lets them go."""


def point_scores(model: Model, graph: Graph, ids: Tensor, embed: Tensor | None, task: Task,
                 rows: slice, diff: Differences, weights: dict[str, Tensor]
                 ) -> Float[Tensor, "sender receiver"]:
    """One forward and one backward pass: ``sum over rows and positions of g_r . delta_s``
    for every sender and receiver, with ``g_r`` the gradient of the summed metric at the
    receiver's input.

    The gradient is read at each layer's ``hook_q`` / ``hook_k`` / ``hook_v``, its MLP's
    input and the final norm's input, as the backward pass reaches them from the top layer
    down; the inputs of the norms in front of them are kept as their block is recomputed
    (:func:`flow.recomputed_layers`), not from the first pass. Once a group of layers'
    gradients and norm inputs reach :data:`GRADIENT_BYTES` they are contracted with the
    senders' differences and let go, within the backward pass, so that a long input holds
    about one layer's of them at a time (all of them, contracted once, where they are
    small).

    Args:
        model: the model.
        graph: its graph.
        ids: ``[batch, pos]`` token ids.
        embed: the embedding to run from instead of ``ids``' own (``None``: their own).
        task: gives the metric.
        rows: the task rows ``ids`` are.
        diff: :func:`sender_differences` of the rows.
        weights: :func:`flow.projections`.

    Returns:
        ``[sender, receiver]`` in float64.
    """
    n = model.info.n_layers
    wanted = {layer: [hooks.qkv(layer, "q"), hooks.qkv(layer, "k"), hooks.qkv(layer, "v"),
                      flow.mlp_in(layer)] for layer in range(n)} | {n: [flow.FINAL_IN]}
    norms = {layer: sorted({flow.ln_in(layer, "ln1"), flow.mlp_norm(model, layer)[0]})
             for layer in range(n)} | {n: []}
    layer_of = {name: layer for layer, names in wanted.items() for name in names}
    kept = {name for names in norms.values() for name in names}
    raw: dict[str, Tensor] = {}
    seen: dict[str, Tensor] = {}  # a zero of each hooked tensor's shape
    ready: list[int] = []  # layers whose gradients are all in, not yet contracted
    backward: list[bool] = []  # set once the first pass is over
    begun: list[Tensor] = []
    out = torch.zeros(graph.edges.shape, dtype=torch.float64)

    def held(layers: list[int]) -> int:
        return sum(raw[name].numel() * raw[name].element_size()
                   for layer in layers for name in wanted[layer] + norms[layer] if name in raw)

    def flush(layers: list[int]) -> None:
        if layers:
            out.add_(_contract(model, graph, layers, raw, diff, weights))
            for name in (name for layer in layers for name in wanted[layer] + norms[layer]):
                raw.pop(name, None)
            layers.clear()
            heap.release()

    def arrived(name: str, grad: Tensor) -> None:
        raw[name] = grad.detach()
        layer = layer_of[name]
        if all(other in raw for other in wanted[layer]):
            ready.append(layer)
            if held(ready) >= GRADIENT_BYTES:
                flush(ready)

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
                # the gradient is taken as it passes, so the tensor itself is not kept
                x.register_hook(partial(arrived, name))
            return x
        return hook

    def keep(name: str):
        def hook(x: Tensor, hook: Any) -> None:
            if backward:  # the block recomputed for its backward pass
                raw[name] = x.detach()
        return hook

    fwd = [(hooks.resid(0, n), start), *[(name, read(name)) for name in layer_of],
           *[(name, keep(name)) for name in sorted(kept)]]
    with torch.enable_grad(), model.bridge.hooks(fwd_hooks=fwd), flow.recomputed_layers(model):
        with spilled(diff.folder, model.bridge):  # the forward's saved tensors, not the
            total = flow.metric_values(model, ids, task.metric, rows).sum()  # backward's
        backward.append(True)
        torch.autograd.grad(total, begun[0])
    flush(ready)
    # a layer some of whose tensors the metric does not reach: zero gradients for them
    rest = [layer for layer in sorted(wanted, reverse=True)
            if any(name in raw for name in wanted[layer])]
    for layer in rest:
        for name in wanted[layer]:
            raw.setdefault(name, seen[name].clone())
    flush(rest)
    return out


def _contract(model: Model, graph: Graph, layers: list[int], raw: dict[str, Tensor],
              diff: Differences, weights: dict[str, Tensor]) -> Tensor:
    """``sum over rows and positions of g_r . delta_s`` for the receivers of ``layers``
    and every sender before them, a slice of positions at a time (the norms act on each
    position alone, so a receiver's gradient at a position needs only that position)."""
    batch, width, d_model = diff.shape(flow.sender_names(model)[0])
    # the senders up to the highest of the layers' (a layer's heads feed its own MLP)
    upto = max(layers) + 1
    names = flow.sender_names(model)[: 1 + 2 * min(upto, model.info.n_layers)]
    n_senders = sum(1 for sender in graph.senders if sender.layer < upto)
    step = max(1, CONTRACT_BYTES // (4 * n_senders * batch * d_model))
    out = torch.zeros(graph.edges.shape, dtype=torch.float64)
    for p0 in range(0, width, step):
        at = slice(p0, min(p0 + step, width))
        part = diff.positions(at, names)
        delta = flow.stack_outputs(model, part, weights, upto).float()  # [S, B, P, d]
        sliced = {name: t[:, at] for name, t in raw.items()}
        for layer in layers:
            first, receivers = flow.layer_receivers(graph, layer)
            grads = _layer_gradients(model, layer, sliced, weights)  # [R_L, B, P, d]
            block = torch.einsum("sbtd,rbtd->sr", delta, grads.float())
            out[: len(delta), first: first + len(receivers)] += block.double()
    return out


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
