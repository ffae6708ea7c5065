"""The bridge's norms without the statistics no hook reads.

A TransformerLens 4 norm bridge (``NormalizationBridge``: ``ln1``, ``ln2``, ``ln_final``
and the q/k norms) computes each norm twice in every pass: once itself, in float32, to
hand ``hook_scale`` and ``hook_normalized`` their values, and once as the Hugging Face
module it wraps, whose output it returns when no hook edited those two (its native path).
When neither hook point has a hook, the first computation feeds nothing: the output is the
module's own either way. :func:`quiet` makes each such norm of a bridge skip it for the
passes in which nobody watches: ``hook_in`` and ``hook_out`` still fire, and the moment a
hook is attached to ``hook_scale`` or ``hook_normalized`` (``run_with_cache``, a frozen
norm's scale, a user's edit), the bridge's own path runs as before.

On smollm2 in bfloat16 the second computation is about 7% of a pass (8 x 128 tokens; the
copy to float32 and the variance of 61 norms); the output is bit for bit the same
(``tests/architectures/test_quiet_norms.py``).

Examples:
    >>> quiet(model.bridge)       # wrap_hf_model does this for every loaded model  # doctest: +SKIP
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import Tensor


def _watched(norm: Any) -> bool:
    points = (norm.hook_scale, norm.hook_normalized)
    return any(point.fwd_hooks or point.bwd_hooks for point in points)


def _native(norm: Any) -> bool:
    """Whether the bridge returns the wrapped module's own output when no hook edits
    (its native path), rather than a norm of its own."""
    config = norm.config
    return bool(norm.use_native_layernorm_autograd
                or getattr(config, "layer_norm_folding", False))


def _forward(norm: Any, bridge_forward: Any, hidden_states: Tensor, **kwargs: Any) -> Tensor:
    """``NormalizationBridge.forward``, without the hooks' statistics when none is read."""
    if _watched(norm):
        return bridge_forward(hidden_states, **kwargs)
    x = norm.hook_in(hidden_states)
    # what the bridge's native path returns when no hook edited (it passes no kwargs)
    result = norm.original_component(x)
    if result.dtype != x.dtype:
        result = result.to(x.dtype)
    return norm.hook_out(result)


def quiet(bridge: Any) -> int:
    """Make every native-path norm bridge of ``bridge`` skip the statistics of its
    ``hook_scale`` and ``hook_normalized`` in passes where neither has a hook.

    Only norms whose class runs ``NormalizationBridge.forward`` itself are changed (a
    subclass with a forward of its own, such as a gated norm, keeps it), and only those on
    the native path (a bridge computing the norm itself keeps doing so).

    Returns:
        How many norms were changed.
    """
    from transformer_lens.model_bridge.generalized_components.normalization import (
        NormalizationBridge,
    )

    changed = 0
    for module in bridge.modules():
        if (isinstance(module, NormalizationBridge)
                and type(module).forward is NormalizationBridge.forward
                and module.original_component is not None and _native(module)):
            # the instance's own __dict__: the bridge forwards other attribute writes to the
            # module it wraps
            bound = NormalizationBridge.forward.__get__(module)
            vars(module)["forward"] = partial(_forward, module, bound)
            changed += 1
    return changed
