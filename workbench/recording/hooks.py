"""Names of the bridge's hook points, in one place.

TransformerLens' canonical names are used throughout (``blocks.{l}.attn.hook_pattern`` is
``[batch, head_index, query_pos, key_pos]``, ``hook_z`` is ``[batch, pos, head_index,
d_head]``). The residual stream is read at layer *boundaries*: boundary ``l`` for
``l < n_layers`` is the input of block ``l`` and boundary ``n_layers`` is the output of
the last block, before the final norm.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.inputs.batching import Batch


def pattern(layer: int) -> str:
    """Attention weights after softmax: ``[batch, head_index, query_pos, key_pos]``."""
    return f"blocks.{layer}.attn.hook_pattern"


def scores(layer: int) -> str:
    """Attention scores before softmax (and after masking)."""
    return f"blocks.{layer}.attn.hook_attn_scores"


def z(layer: int) -> str:
    """Per-head attention output before the output projection: ``[batch, pos, head, d_head]``."""
    return f"blocks.{layer}.attn.hook_z"


def attn_out(layer: int) -> str:
    """The attention sublayer's contribution to the residual stream."""
    return f"blocks.{layer}.hook_attn_out"


def resid(boundary: int, n_layers: int) -> str:
    """The residual stream at a layer boundary (0 .. n_layers, see the module docstring)."""
    if not 0 <= boundary <= n_layers:
        raise ValueError(f"boundary must be in 0..{n_layers}, got {boundary}")
    if boundary < n_layers:
        return f"blocks.{boundary}.hook_resid_pre"
    return f"blocks.{n_layers - 1}.hook_resid_post"


class _Stop(Exception):
    """Raised by the last hook a caller needs, to skip the rest of the forward pass."""


def run_hooked(bridge: Any, batch: Batch, fwd_hooks: list[tuple[str, Any]], *,
               stop_after: str | None = None) -> None:
    """Run the bridge on a batch with temporary forward hooks, discarding its output.

    Args:
        bridge: a ``TransformerBridge``.
        batch: right-padded inputs (:func:`workbench.inputs.batching.make_batches`).
        fwd_hooks: ``[(hook name, fn)]``; each ``fn(tensor, hook)`` may return a
            replacement tensor or ``None``.
        stop_after: a hook point after which nothing is needed: the pass stops there, so
            e.g. the unembedding (a 49152 x 576 matmul per token on smollm2) is skipped.
    """
    hooks_list = list(fwd_hooks)
    if stop_after is not None:
        def stop(tensor: Any, hook: Any) -> None:
            raise _Stop

        hooks_list.append((stop_after, stop))
    with bridge.hooks(fwd_hooks=hooks_list), contextlib.suppress(_Stop):
        bridge(batch.input_ids, return_type=None, **batch.forward_kwargs())
