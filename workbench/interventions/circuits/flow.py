"""What the circuit passes read and write on the bridge: sender outputs, receiver inputs.

A sender's output is what it adds to the residual stream: the embedding
(``blocks.0.hook_resid_pre``), a head's ``z_h W_O^h`` (``hook_z``), an MLP's output
(``hook_mlp_out``, after any norm on it). Where the attention output passes a norm before
the residual add (Gemma 2 and 3's ``ln1_post``), a head's output is ``z_h W_O^h / s * w``:
``z`` divided by the norm's scale ``s`` of the same pass (``ln1_post.hook_scale``,
:func:`divide_scales`), then projected and multiplied by the norm's weight ``w``
(:func:`stack_outputs`), so the layer's heads' outputs sum to the norm's output.

A receiver's input is the stream *before* the norm that feeds it: a head's q, k or v
input is the block's first norm's input (``ln1.hook_in``), read by that head alone; an
MLP's is its own norm's input (``ln2.hook_in``, or ``ln1.hook_in`` in a parallel block
with one norm: GPT-J, Phi, Falcon); the logits' is the final norm's input
(``ln_final.hook_in``). A q, k or v receiver is reached through the projection at
``hook_q`` / ``hook_k`` / ``hook_v`` (before rotary and any per-head norm), an MLP
through its input after the norm (``mlp.hook_in``): the receiver's input changed by
``d`` changes what it reads by ``n(x + d) - n(x)`` (times the projection ``W`` for a
head), with ``n`` the live norm (not frozen), so the gradient and the edge ablation both
see the true norm.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from workbench.core import heap
from workbench.core.errors import WorkbenchError
from workbench.core.options import AttentionPath
from workbench.inputs.batching import Batch
from workbench.interventions.circuits.graph import Graph, Receiver
from workbench.interventions.circuits.task import Metric, at_positions
from workbench.models import blocked
from workbench.models.base import Model
from workbench.models.norms import output_norm
from workbench.recording import hooks
from workbench.scores.logit_attribution import output_transform


def ln_in(layer: int, which: str) -> str:
    """The input hook of a block's first (``ln1``) or second (``ln2``) norm."""
    return f"blocks.{layer}.{which}.hook_in"


FINAL_IN = "ln_final.hook_in"
"""The final norm's input: the logits' receiver input."""


def metric_values(model: Model, ids: Tensor, metric: Metric, rows: slice
                  ) -> Float[Tensor, " batch"]:
    """The metric of a pass over ``ids`` (the task's ``rows``), unembedded only at the
    positions it reads: the pass stops at the final norm's output, whose rows at
    :meth:`Metric.read_positions` go through the unembedding and the family's output
    transform (a soft cap, a scale), as the bridge's own forward would take them.

    The final norm acts on each position alone, so the metric is the one of the whole
    logits, without their ``[batch, pos, d_vocab]`` (1.6 GB in float32 at 8,192 tokens of
    smollm2's 49,152 entries, and as much again for their gradient). Any hooks active on
    the bridge apply; under autograd the metric is differentiable in the pass. A family
    whose final norm has no output hook, or whose unembedding is hooked, runs whole.
    """
    unembed = getattr(model.bridge, "unembed", None)
    points = [getattr(unembed, name, None) for name in ("hook_in", "hook_out")]
    watched = any(p is not None and (p.fwd_hooks or p.bwd_hooks) for p in points)
    if unembed is None or watched or hooks.FINAL_OUT not in model.bridge.hook_dict:
        # no cache: a block recomputed under autograd would append to it again
        return metric(model.bridge(ids, use_cache=False), rows)
    kept: list[Tensor] = []

    def stop(x: Tensor, hook: Any) -> None:
        kept.append(x)
        hooks.stop_pass()

    with model.bridge.hooks(fwd_hooks=[(hooks.FINAL_OUT, stop)]), hooks.stoppable():
        model.bridge(ids, use_cache=False)
    normed = at_positions(kept[0], metric.read_positions(rows))  # [batch, k, d_model]
    return metric.at(output_transform(model, unembed(normed)), rows)


def mlp_in(layer: int) -> str:
    """The MLP's input after its norm."""
    return f"blocks.{layer}.mlp.hook_in"


def norm_module(model: Model, layer: int, which: str = "ln1") -> Any:
    """The Hugging Face module of the layer's ``ln1`` or ``ln2``, callable without the
    bridge's hooks."""
    ln = getattr(model.bridge.blocks[layer], which)
    return getattr(ln, "_original_component", ln)


def mlp_norm(model: Model, layer: int) -> tuple[str, Any]:
    """The input hook and the module of the norm in front of the layer's MLP: ``ln2``, or
    ``ln1`` where a parallel block has one norm for both sublayers."""
    which = "ln2" if ln_in(layer, "ln2") in model.bridge.hook_dict else "ln1"
    return ln_in(layer, which), norm_module(model, layer, which)


def projections(model: Model) -> dict[str, Tensor]:
    """``{"q": W_Q, "k": W_K, "v": W_V, "o": W_O}``, detached: ``W_Q`` is ``[layer, head,
    d_model, d_head]``, ``W_K`` and ``W_V`` per key-value head, ``W_O`` ``[layer, head,
    d_head, d_model]``; and where some layer's attention output passes a norm, ``"post"``:
    each layer's norm weight, ``[layer, d_model]`` (ones for a layer without one). Read
    once per call that needs them: the bridge stacks every layer's weights each time one
    is read."""
    bridge = model.bridge
    out = {"q": bridge.W_Q.detach(), "k": bridge.W_K.detach(), "v": bridge.W_V.detach(),
           "o": bridge.W_O.detach()}
    norms = [output_norm(model, layer) for layer in range(model.info.n_layers)]
    if any(norm is not None for norm in norms):
        ones = torch.ones(model.info.d_model, dtype=torch.float64)
        out["post"] = torch.stack([ones if norm is None else norm.weight
                                   for norm in norms]).to(out["o"].dtype)
    return out


def scale_names(model: Model) -> dict[int, str]:
    """``{layer: hook}`` of the scale of each attention output norm (``ln1_post``), for the
    layers that have one."""
    return {layer: hooks.output_norm_scale(layer) for layer in range(model.info.n_layers)
            if output_norm(model, layer) is not None}


def divide_scales(model: Model, kept: dict[str, Tensor]) -> dict[str, Tensor]:
    """``kept`` (:func:`capture_names`' tensors) with each normed layer's ``z`` divided by
    its output norm's scale at each position (in place) and the scales taken out: what
    :func:`stack_outputs` reads."""
    for layer, name in scale_names(model).items():
        kept[hooks.z(layer)].div_(kept.pop(name)[..., None])  # [B, T, 1, 1]
    return kept


def sender_names(model: Model) -> list[str]:
    """The hook points the senders' outputs are read at."""
    n = model.info.n_layers
    return [hooks.resid(0, n)] + [name for layer in range(n)
                                  for name in (hooks.z(layer), hooks.mlp_out(layer))]


def capture_names(model: Model) -> list[str]:
    """:func:`sender_names` and the output norms' scales (:func:`scale_names`)."""
    return sender_names(model) + list(scale_names(model).values())


def head_outputs(z: Float[Tensor, "batch pos head d_head"], weights: dict[str, Tensor],
                 layer: int) -> Float[Tensor, "head batch pos d_model"]:
    """A layer's heads' outputs from its ``z`` (divided by its output norm's scale where it
    has one, :func:`divide_scales`)."""
    out = torch.einsum("bthe,hed->hbtd", z, weights["o"][layer])
    return out * weights["post"][layer] if "post" in weights else out


def stack_outputs(model: Model, kept: dict[str, Tensor], weights: dict[str, Tensor],
                  layers: int | None = None) -> Float[Tensor, "sender batch pos d_model"]:
    """Every sender's output, in the graph's order, from the tensors at
    :func:`sender_names` (after :func:`divide_scales`; ``weights``: :func:`projections`);
    with ``layers``, the embedding's and those of the first ``layers`` layers only."""
    n = model.info.n_layers
    parts = [kept[hooks.resid(0, n)][None]]
    for layer in range(n if layers is None else min(layers, n)):
        parts.append(head_outputs(kept[hooks.z(layer)], weights, layer))
        parts.append(kept[hooks.mlp_out(layer)][None])
    return torch.cat(parts)


def sender_outputs(model: Model, ids: Tensor, weights: dict[str, Tensor] | None = None
                   ) -> Float[Tensor, "sender batch pos d_model"]:
    """Every sender's output on ``ids`` (one pass, no gradient; ``weights``:
    :func:`projections`, read if ``None``)."""
    with torch.no_grad():
        kept = divide_scales(model, hooks.capture(model, Batch.of(ids), capture_names(model)))
    return stack_outputs(model, kept, projections(model) if weights is None else weights)


def each_output(model: Model, ids: Tensor, give: Callable[[str, Tensor], None],
                 starts: list[Tensor] | None = None) -> None:
    """Run ``ids`` and ``give`` each sender's output as its hook fires (a normed layer's
    ``z`` once its scale has, divided by it), stopping once all have; the embedding is
    also copied to ``starts``."""
    layer_of_scale = {name: layer for layer, name in scale_names(model).items()}
    scaled_z = {hooks.z(layer): layer for layer in layer_of_scale.values()}
    embed = sender_names(model)[0]
    names = capture_names(model)
    pending: dict[int, Tensor] = {}  # a normed layer's z, until its scale fires
    done: set[str] = set()

    def handle(name: str):
        def hook(x: Tensor, hook: Any) -> None:
            if name in done:  # it would be counted twice
                raise WorkbenchError(f"{model.info.name}: {name} fired twice in one pass")
            if name == embed and starts is not None:
                starts.append(x.detach().clone())
            if name in scaled_z:
                pending[scaled_z[name]] = x.detach().clone()
            elif name in layer_of_scale:
                layer = layer_of_scale[name]
                give(hooks.z(layer), pending.pop(layer).div_(x[..., None]))
            else:
                give(name, x.detach())
            done.add(name)
            if len(done) == len(names):  # the later blocks and the unembedding never run
                hooks.stop_pass()
        return hook

    with torch.no_grad():
        hooks.run_hooked(model.bridge, Batch.of(ids), [(name, handle(name)) for name in names])
    if len(done) != len(names):
        missing = [name for name in names if name not in done]
        raise WorkbenchError(f"{model.info.name}: {', '.join(missing)} never fired")


def layer_receivers(graph: Graph, layer: int) -> tuple[int, list[Receiver]]:
    """The index of the layer's first receiver and its receivers (q, k, v, MLP), or the
    logits' for ``layer == n_layers``."""
    index = [i for i, r in enumerate(graph.receivers) if r.layer == layer]
    return index[0], [graph.receivers[i] for i in index]


@contextlib.contextmanager
def attention_run(model: Model, attention: AttentionPath) -> Iterator[str]:
    """Run the block's passes with blocked attention (:mod:`workbench.models.blocked`: no
    ``[head, T, T]`` pattern, and under autograd each block of query rows recomputed in
    the backward pass) where ``attention`` asks for it and the family has it, else dense.

    Yields:
        ``blocked`` or ``dense``.
    """
    path = hooks.attention_path(model, attention)
    with blocked.blocked(model) if path == "blocked" else contextlib.nullcontext():
        yield path


def _released(grad: Tensor) -> None:
    heap.release()


@contextlib.contextmanager
def recomputed_layers(model: Model) -> Iterator[None]:
    """Run every block of the bridge checkpointed (non-reentrant) for the block's passes:
    autograd keeps each block's input instead of the activations its backward needs, and
    the backward pass runs one block's forward again at a time.

    A layer of smollm2 keeps about 10,000 floats per token for its backward (the MLP's
    ``[T, d_mlp]`` products, the norms', projections' and rotary inputs): 1.2 MB per token
    over 30 layers, where its input is 576 floats. The hooks of a pass fire again when
    its blocks are recomputed, on tensors equal to the first pass's: a hook that keeps
    what it sees keeps the first.

    The heap's free pages are given back (:func:`workbench.core.heap.release`) after each
    block, forward and backward: what a pass keeps (each block's input, the gradients
    gathered) is allocated among each layer's larger temporaries, and glibc kept the
    holes they leave resident. On smollm2 at 2,048 tokens that was more than half the
    peak (2.86 GiB above the model, 1.2 GiB of it allocated), and it grew faster than T.

    Each block's Hugging Face MLP runs :data:`MLP_POSITIONS` positions at a time, each
    piece checkpointed (:func:`_in_pieces`), so that its recomputation in the backward
    pass holds one piece's products, not the whole input's (gemma3's edge scores at
    16,384 tokens: 6.0 GiB above the model, 6.2 without).
    """
    from torch.utils.checkpoint import checkpoint

    def run(forward: Any, *args: Any, **kwargs: Any) -> Any:
        out = checkpoint(forward, *args, use_reentrant=False, **kwargs)
        heap.release()
        first = out[0] if isinstance(out, tuple) else out
        if isinstance(first, Tensor) and first.requires_grad:
            # fires when the block above has run its backward, before this one's
            first.register_hook(_released)
        return out

    blocks = list(model.bridge.blocks)
    mlps = [module for block in blocks
            if (module := getattr(getattr(block, "mlp", None), "original_component", None))
            is not None]
    try:
        for block in blocks:
            # the instance's own __dict__: the bridge forwards other attribute writes to
            # the module it wraps
            vars(block)["forward"] = partial(run, type(block).forward.__get__(block))
        for module in mlps:
            vars(module)["forward"] = partial(_in_pieces, type(module).forward.__get__(module))
        yield
    finally:
        for module in [*blocks, *mlps]:
            vars(module).pop("forward", None)


MLP_POSITIONS = 1024
"""Positions per checkpointed piece of an MLP in a recomputed block (:func:`_in_pieces`)."""


def _in_pieces(forward: Any, *args: Any, **kwargs: Any) -> Any:
    """A Hugging Face MLP's forward under autograd, ``MLP_POSITIONS`` positions at a time,
    each piece checkpointed: an MLP acts on each position alone, so its ``[pos, d_mlp]``
    products (five of them on a gated MLP: 40 KB per token on gemma3, more than the
    attention's) exist one piece at a time when its block is recomputed, not for the whole
    input. An MLP called with more than its input, or one whose output is not one tensor
    (a mixture of experts' router logits), runs whole."""
    from torch.utils.checkpoint import checkpoint

    x = args[0] if len(args) == 1 and not kwargs else None
    if (not torch.is_grad_enabled() or not isinstance(x, Tensor) or x.dim() < 2
            or x.shape[-2] <= MLP_POSITIONS):
        return forward(*args, **kwargs)
    n = x.shape[-2]
    # contiguous (a copy only where a batch has several rows): GPT-2's Conv1D views it
    pieces = [checkpoint(forward, x.narrow(-2, p0, min(MLP_POSITIONS, n - p0)).contiguous(),
                         use_reentrant=False) for p0 in range(0, n, MLP_POSITIONS)]
    if not all(isinstance(piece, Tensor) for piece in pieces):
        return forward(x)
    return torch.cat(pieces, dim=-2)
