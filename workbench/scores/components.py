"""The residual stream as the sum of what wrote it: the embeddings, every head, every MLP, biases.

In a residual network the stream at layer boundary ``l`` (the input of block ``l``, or with
``l = n_layers`` the input of the final norm) is exactly::

    x_l = embed + sum_{l' < l} (attn_out_l' + mlp_out_l')
    attn_out_l = sum_h z_h W_O^h + b_O                      (most families)
    attn_out_l = n_post(sum_h z_h W_O^h + b_O)              (ln1_post: Gemma 2/3, OLMo 2)

Where a norm sits on the attention output before the residual add, its scale is frozen at
its value on the input (:func:`workbench.models.norms.output_norm`, the linearisation of
:mod:`workbench.models.norms`), so each head's part passes through it and the norm's bias is
a part of its own. Parallel blocks (GPT-J, GPT-NeoX, Phi, Falcon) add both sublayers to one
input, which changes nothing here. The embedding part is ``blocks.0.hook_resid_pre``
(token plus learned positions, if any).

:func:`part_hooks` names the activations a pass must keep; :func:`stream_parts` forms the
parts (float64) at chosen rows and positions only. QK attribution splits attention scores
over the parts feeding a layer (:mod:`workbench.scores.qk_attribution`); direct logit
attribution splits a logit difference over the parts feeding the final norm
(:mod:`workbench.scores.logit_attribution`).

Part names: ``embed``; ``LxHy`` (a head); ``Lxattn_bias`` (the output projection's bias);
``Lxattn_norm_bias`` (the bias of a LayerNorm on the attention output); ``LxMLP``.

Examples:
    >>> kept = hooks.capture(model, batch, part_hooks(model, model.info.n_layers))  # doctest: +SKIP
    >>> parts = stream_parts(model, kept, (rows, positions), model.info.n_layers)   # doctest: +SKIP
    >>> sum(p.value for p in parts)      # the final residual there  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from jaxtyping import Float
from torch import Tensor

from workbench.models.base import Model
from workbench.models.norms import EMBED, normalise, output_norm
from workbench.recording import hooks

PartKind = Literal["embed", "head", "bias", "mlp"]
Index = tuple[Any, Any]
"""Rows and positions of a ``[batch, pos, ...]`` activation, as for advanced indexing:
``(0, positions)`` (one prompt, several positions) or ``(rows, positions)`` (one position
per row)."""


@dataclass(frozen=True)
class Part:
    """One writer's part of the residual stream at the indexed rows and positions."""

    name: str
    kind: PartKind
    layer: int
    """the layer it comes from; -1 for the embeddings"""
    value: Float[Tensor, "n d_model"]
    """float64"""


def part_hooks(model: Model, upto: int) -> list[str]:
    """The hook points :func:`stream_parts` reads for the parts below boundary ``upto``."""
    names = [hooks.resid(0, model.info.n_layers)]
    for layer in range(upto):
        names += [hooks.z(layer), hooks.mlp_out(layer)]
        if output_norm(model, layer) is not None:
            names.append(hooks.output_norm_scale(layer))
    return names


def stream_parts(model: Model, kept: dict[str, Tensor], index: Index, upto: int, *,
                 w_o: Float[Tensor, "layer head_index d_head d_model"] | None = None
                 ) -> list[Part]:
    """Every part of the residual stream at boundary ``upto``, in forward order.

    Args:
        model: the model.
        kept: the activations at :func:`part_hooks` of one pass.
        index: the rows and positions to form them at (see :data:`Index`).
        upto: the layer boundary (``n_layers``: the final norm's input).
        w_o: ``bridge.W_O`` (detached), to share across calls; read if ``None``.

    Returns:
        The parts, each ``[n, d_model]`` in float64 (``n`` indexed entries); they sum to
        ``hooks.resid(upto)`` at ``index``.
    """
    if w_o is None:  # the bridge is untyped
        w_o = cast(Tensor, model.bridge.W_O.detach())
    embed = kept[hooks.resid(0, model.info.n_layers)][index].double()
    parts = [Part(EMBED, "embed", -1, embed)]
    n = embed.shape[0]
    for layer in range(upto):
        z = kept[hooks.z(layer)][index].double()  # [n, head, d_head]
        heads = torch.einsum("nhd,hdm->hnm", z, w_o[layer].double())
        raw: list[tuple[str, PartKind, Tensor]] = [
            (f"L{layer}H{h}", "head", heads[h]) for h in range(heads.shape[0])]
        bias = getattr(model.bridge.blocks[layer].attn.o, "bias", None)
        if bias is not None:
            raw.append((f"L{layer}attn_bias", "bias", bias.detach().double().expand(n, -1)))
        norm = output_norm(model, layer)
        if norm is not None:  # the frozen norm's linear part of each, then its bias
            scale = kept[hooks.output_norm_scale(layer)][index][..., 0].double()
            raw = [(name, kind, normalise(value, scale, norm)) for name, kind, value in raw]
            if norm.bias is not None:
                raw.append((f"L{layer}attn_norm_bias", "bias", norm.bias.expand(n, -1)))
        parts += [Part(name, kind, layer, value) for name, kind, value in raw]
        parts.append(Part(f"L{layer}MLP", "mlp", layer,
                          kept[hooks.mlp_out(layer)][index].double()))
    return parts
