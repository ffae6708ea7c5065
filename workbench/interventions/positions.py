"""Taking position information out of a model, or computing it more exactly, through hooks.

Order enters a transformer through position embeddings added to the input (BERT's learned
absolute positions), through rotary embeddings that rotate queries and keys by their
position (RoPE, Su et al. 2021, "RoFormer"), or through a causal mask. The hooks here
remove the first two, each exactly, so that what is left can be measured:

- :func:`no_rope_hooks`: RoPE skipped in the given layers (``hook_rot_q``/``hook_rot_k``,
  after rotation, return the unrotated ``hook_q``/``hook_k``), whatever RoPE variant the
  model uses.
- :func:`zero_position_hooks`: learned absolute position embeddings replaced by zeros.
- :func:`float64_angle_hooks`: RoPE's cos and sin recomputed from float64 angles, to
  separate float32 angle rounding (about ``position * 6e-8`` rad) from RoPE itself.

Each returns ``[(hook name, fn)]`` for ``model.bridge.hooks(fwd_hooks=...)``.

Examples:
    >>> fwd = no_rope_hooks(range(model.info.n_layers))          # doctest: +SKIP
    >>> with model.bridge.hooks(fwd_hooks=fwd):                   # doctest: +SKIP
    ...     logits = model.bridge(ids)                            # a NoPE model, causal mask kept
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from workbench.core.errors import WorkbenchError
from workbench.models.base import Model
from workbench.recording import hooks

Hook = tuple[str, Callable[[Tensor, Any], Tensor | None]]

ANGLE_TOLERANCE = 1e-3
"""How far float64 cos/sin may be from the model's own before its RoPE counts as
non-standard: far above float32 angle rounding, far below any other rotary scheme."""


def no_rope_hooks(layers: Iterable[int]) -> list[Hook]:
    """Skip RoPE exactly in ``layers``: ``hook_rot_q``/``hook_rot_k`` return the unrotated
    ``hook_q``/``hook_k``.

    Both pairs of hooks see ``[batch, pos, head_index, d_head]`` (the bridge converts the
    rotary hooks from Hugging Face's ``[batch, head, pos, d_head]``), so the values can be
    handed over as they are.

    Args:
        layers: the layers whose rotation is skipped (each must have rotary hooks).

    Returns:
        Forward hooks: the ``hook_q``/``hook_k`` ones keep a copy, the ``hook_rot_*`` ones
        return it.
    """
    fwd: list[Hook] = []
    for layer in layers:
        names = {which: hooks.qkv(layer, which) for which in ("q", "k")}
        kept, keep = hooks.caching_hooks(list(names.values()))
        fwd += keep
        for which, name in names.items():
            def restore(tensor: Tensor, hook: Any, kept=kept, name=name) -> Tensor:
                return kept[name]

            fwd.append((hooks.rotated(layer, which), restore))
    return fwd


def zero_position_hooks() -> list[Hook]:
    """Learned absolute position embeddings (``pos_embed.hook_out``) replaced by zeros."""
    return [(hooks.POS_EMBED, lambda tensor, hook: torch.zeros_like(tensor))]


def float64_angle_hooks(model: Model, position_ids: Int[Tensor, "batch pos"]) -> list[Hook]:
    """RoPE's cos and sin recomputed from float64 angles ``position * theta``.

    The frequencies ``theta`` are the model's own (float32) ones, so only the rounding of
    the product changes. A rotary embedding this does not reproduce (to
    :data:`ANGLE_TOLERANCE`) is refused rather than silently replaced.

    Args:
        model: a rotary model (its bridge has ``rotary_emb`` with ``inv_freq``).
        position_ids: the position ids of the forward pass the hooks are used in.

    Returns:
        Hooks on ``rotary_emb.hook_cos`` and ``rotary_emb.hook_sin``.

    Raises:
        WorkbenchError: the model has no rotary ``inv_freq``, or (when the hooks run) its
            rotary embedding is not the standard RoPE.
    """
    rotary = getattr(model.bridge, "rotary_emb", None)
    inner = getattr(rotary, "original_component", None)
    inv_freq = getattr(inner, "inv_freq", None)
    if inv_freq is None:
        raise WorkbenchError(f"{model.info.name}: no rotary inv_freq to recompute angles from")
    angles = position_ids.double()[..., None] * inv_freq.double()  # [B, T, d_head/2]
    angles = torch.cat([angles, angles], dim=-1)
    scaling = float(getattr(inner, "attention_scaling", 1.0))

    def make(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor, Any], Tensor]:
        def hook(tensor: Tensor, hook: Any) -> Tensor:
            exact = (fn(angles) * scaling).to(tensor.dtype).expand_as(tensor)
            if float((exact - tensor).abs().max()) > ANGLE_TOLERANCE:
                raise WorkbenchError(f"{model.info.name}: its rotary embedding is not the "
                                     "standard RoPE; float64 angles are not supported")
            return exact

        return hook

    return [(hooks.ROTARY_COS, make(torch.cos)), (hooks.ROTARY_SIN, make(torch.sin))]
