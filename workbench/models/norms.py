"""A norm with its scale frozen: linear, so a residual decomposition survives it.

RMSNorm and LayerNorm divide each position's stream ``x_t`` by a scale computed from
``x_t`` itself (``s_t = sqrt(mean x_t^2 + eps)``; LayerNorm centres first), so the norm of
a sum of parts is not the sum of their norms. *Frozen*: ``s_t`` is taken from a reference
pass (``ln1.hook_scale``, or ``ln_final.hook_scale`` for the final norm, on the real input)
and held fixed, which leaves the linear map::

    RMSNorm:    n(x_t) = x_t / s_t * w
    LayerNorm:  n(x_t) = (x_t - mean(x_t)) / s_t * w   (+ b, a part of its own)

Split into components (:data:`EMBED`, each head's output, each MLP's), the stream then
passes through the norm exactly, and on the reference input the parts sum to the live
norm's output (TransformerLens' ``apply_ln_to_stack`` divides by the cached scale too).
A block's first norm (:func:`first_norm`) feeds its attention:
:mod:`workbench.scores.qk_attribution` and :mod:`workbench.interventions.paths` use it. The
final norm (:func:`final_norm`) feeds the unembedding: :mod:`workbench.scores.logit_attribution`
uses it for the logit lens and direct logit attribution; a norm on the attention output
(:func:`output_norm`) lets heads' outputs be parts of the stream
(:mod:`workbench.scores.components`).

A norm on the attention's output before the residual add (Gemma 2 and 3's
``post_attention_layernorm``) is frozen the same way (:func:`output_norm`), so each
head's part of the stream stays its own; and so is a per-head query or key norm (Gemma 3,
Qwen 3; :class:`HeadNorm`: ``q / s * w``, with ``s`` the norm's scale of the real ``q`` at
each position and head, ``attn.q_norm.hook_scale``), which then passes every component's
part through linearly.

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
class LinearNorm:
    """A norm, as the linear map it is once its scale is frozen."""

    weight: Tensor
    bias: Tensor | None
    center: bool


def first_norm(model: Model, layer: int) -> LinearNorm:
    """The layer's first norm: RMSNorm (scale only) or LayerNorm (centred, with a bias).

    Args:
        model: the model.
        layer: the block whose ``ln1`` is read.

    Returns:
        Its weight (float64), bias (LayerNorm only) and whether it centres.

    Raises:
        ModelCapabilityError: a norm without a weight.
    """
    return _linear(model.bridge.blocks[layer].ln1, f"layer {layer}'s first norm")


def final_norm(model: Model) -> LinearNorm:
    """The norm between the last block and the unembedding (``ln_final``), as
    :func:`first_norm` reads a block's.

    Raises:
        ModelCapabilityError: the model has no final norm, or one without a weight.
    """
    ln = getattr(model.bridge, "ln_final", None)
    if ln is None:
        raise ModelCapabilityError(f"{model.info.name} has no final norm (ln_final) before "
                                   "its unembedding")
    return _linear(ln, "the final norm")


def output_norm(model: Model, layer: int) -> LinearNorm | None:
    """The norm on the attention sublayer's output before it joins the residual stream
    (``ln1_post``: Gemma 2 and 3's sandwich norms, OLMo 2's post-norm), or ``None`` when the
    output is added as it is. Frozen at its scale (``ln1_post.hook_scale``), it passes the
    heads' outputs through as a sum of parts too.

    Raises:
        ModelCapabilityError: a norm without a weight.
    """
    ln = getattr(model.bridge.blocks[layer], "ln1_post", None)
    return None if ln is None else _linear(ln, f"layer {layer}'s attention output norm")


def _linear(ln: object, what: str) -> LinearNorm:
    module = getattr(ln, "_original_component", ln)
    weight = getattr(module, "weight", None)
    if weight is None:
        raise ModelCapabilityError(f"{what} has no weight to linearise")
    center = isinstance(module, torch.nn.LayerNorm)
    bias = getattr(module, "bias", None) if center else None
    return LinearNorm(_weight(module, weight), None if bias is None else bias.detach().double(),
                      center)


def _weight(module: object, weight: Tensor) -> Tensor:
    # Gemma-style RMSNorm multiplies by (1 + w); its class says so
    offset = 1.0 if "Gemma" in type(module).__name__ else 0.0
    return weight.detach().double() + offset


@dataclass(frozen=True)
class HeadNorm:
    """A per-head query or key norm (Gemma 3, Qwen 3: RMSNorm over each head's ``d_head``,
    after the projection and before rotary), as the linear map it is once its scale is
    frozen: ``n(q) = q / s * w``, with ``s = sqrt(mean q^2 + eps)`` of the whole ``q``."""

    weight: Tensor
    eps: float

    def scale(self, x: Float[Tensor, "*batch d_head"]) -> Float[Tensor, "*batch"]:
        """``s`` of ``x``, as the norm computes it."""
        return (x.double().pow(2).mean(-1) + self.eps).sqrt()


def head_norm(model: Model, layer: int, which: str) -> HeadNorm | None:
    """The attention's per-head ``q_norm`` or ``k_norm`` of ``layer``, or ``None`` when it
    has none.

    Raises:
        ModelCapabilityError: a norm over every head together (OLMo 2's full-width
            q/k norm: one scale mixes the heads), or one without a weight or epsilon.
    """
    attn = model.bridge.blocks[layer].attn
    norm = getattr(attn, f"{which}_norm", None) if f"{which}_norm" in getattr(
        attn, "submodules", {}) else None
    if norm is None:
        return None
    if getattr(attn, "_qk_norm_phase", "post_reshape") != "post_reshape":
        raise ModelCapabilityError(f"layer {layer}'s {which}_norm normalizes every head "
                                   "together, so one head's scores are not linear in its own "
                                   "projection")
    module = getattr(norm, "_original_component", norm)
    weight = getattr(module, "weight", None)
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if weight is None or eps is None:
        raise ModelCapabilityError(f"layer {layer}'s {which}_norm has no weight or epsilon "
                                   "to linearise")
    return HeadNorm(_weight(module, weight), float(eps))


def normalise(stack: Float[Tensor, "*component pos d_model"], scale: Float[Tensor, " pos"],
              norm: LinearNorm) -> Float[Tensor, "*component pos d_model"]:
    """The norm's linear part applied to components, with the per-position ``scale``
    (``ln1.hook_scale``) frozen; the norm's bias is not included (it is a component).

    Args:
        stack: component outputs ``[..., pos, d_model]``.
        scale: the norm's scale at each position, as the model computed it on the input
            (``hook_scale`` without its last axis).
        norm: :func:`first_norm` or :func:`final_norm`.

    Returns:
        The components' parts of the normalised stream, same shape as ``stack``.
    """
    if norm.center:
        stack = stack - stack.mean(-1, keepdim=True)
    return stack / scale[..., :, None] * norm.weight
