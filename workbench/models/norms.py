"""A block's first norm with its scale frozen: linear, so a residual decomposition survives it.

RMSNorm and LayerNorm divide each position's stream ``x_t`` by a scale computed from
``x_t`` itself (``s_t = sqrt(mean x_t^2 + eps)``; LayerNorm centres first), so the norm of
a sum of parts is not the sum of their norms. *Frozen*: ``s_t`` is taken from a reference
pass (``ln1.hook_scale`` on the real input) and held fixed, which leaves the linear map::

    RMSNorm:    n(x_t) = x_t / s_t * w
    LayerNorm:  n(x_t) = (x_t - mean(x_t)) / s_t * w   (+ b, a part of its own)

Split into components (:data:`EMBED`, each head's output, each MLP's), the stream then
passes through the norm exactly, and on the reference input the parts sum to the live
norm's output (TransformerLens' ``apply_ln_to_stack`` divides by the cached scale too).
:mod:`workbench.scores.qk_attribution` and :mod:`workbench.interventions.paths` use it.

Examples:
    >>> parts = normalise(stack, scale, first_norm(model, layer))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from workbench.core.errors import ModelCapabilityError
from workbench.models.base import Model

EMBED = "embed"
"""The component the embeddings write (token plus learned positions: ``hook_resid_pre`` of
block 0), among the parts the residual stream is split into."""


@dataclass(frozen=True)
class FirstNorm:
    """A layer's first norm, as the linear map it is once its scale is frozen."""

    weight: Tensor
    bias: Tensor | None
    center: bool


def first_norm(model: Model, layer: int) -> FirstNorm:
    """The layer's first norm: RMSNorm (scale only) or LayerNorm (centred, with a bias).

    Args:
        model: the model.
        layer: the block whose ``ln1`` is read.

    Returns:
        Its weight (float64), bias (LayerNorm only) and whether it centres.

    Raises:
        ModelCapabilityError: a norm without a weight.
    """
    ln = model.bridge.blocks[layer].ln1
    module = getattr(ln, "_original_component", ln)
    weight = getattr(module, "weight", None)
    if weight is None:
        raise ModelCapabilityError(f"layer {layer}'s first norm has no weight to linearise")
    center = isinstance(module, torch.nn.LayerNorm)
    bias = getattr(module, "bias", None) if center else None
    # Gemma-style RMSNorm multiplies by (1 + w); its class says so
    offset = 1.0 if "Gemma" in type(module).__name__ else 0.0
    return FirstNorm(weight.detach().double() + offset,
                     None if bias is None else bias.detach().double(), center)


def normalise(stack: Float[Tensor, "*component pos d_model"], scale: Float[Tensor, " pos"],
              norm: FirstNorm) -> Float[Tensor, "*component pos d_model"]:
    """The norm's linear part applied to components, with the per-position ``scale``
    (``ln1.hook_scale``) frozen; the norm's bias is not included (it is a component).

    Args:
        stack: component outputs ``[..., pos, d_model]``.
        scale: the norm's scale at each position, as the model computed it on the input.
        norm: :func:`first_norm`.

    Returns:
        The components' parts of the normalised stream, same shape as ``stack``.
    """
    if norm.center:
        stack = stack - stack.mean(-1, keepdim=True)
    return stack / scale[..., :, None] * norm.weight
