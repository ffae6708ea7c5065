"""Names of the bridge's hook points, in one place.

TransformerLens' canonical names are used throughout (``blocks.{l}.attn.hook_pattern`` is
``[batch, head_index, query_pos, key_pos]``, ``hook_z`` is ``[batch, pos, head_index,
d_head]``). The residual stream is read at layer *boundaries*: boundary ``l`` for
``l < n_layers`` is the input of block ``l`` and boundary ``n_layers`` is the output of
the last block, before the final norm.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.core.options import AttentionPath
from workbench.core.registry import did_you_mean

if TYPE_CHECKING:
    from torch import Tensor

    from workbench.inputs.batching import Batch
    from workbench.models.base import Model
    from workbench.models.blocked import PatternConsumer

log = logging.getLogger(__name__)


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


def attn_in(layer: int) -> str:
    """The attention sublayer's input (after the block's first norm): ``[batch, pos, d_model]``."""
    return f"blocks.{layer}.attn.hook_in"


def mlp_out(layer: int) -> str:
    """The MLP sublayer's contribution to the residual stream."""
    return f"blocks.{layer}.hook_mlp_out"


def norm_scale(layer: int) -> str:
    """The per-position scale of the block's first norm (``ln1``): ``[batch, pos, 1]``."""
    return f"blocks.{layer}.ln1.hook_scale"


def output_norm_scale(layer: int) -> str:
    """The per-position scale of the norm on the attention output (``ln1_post``, where the
    block has one: :func:`workbench.models.norms.output_norm`): ``[batch, pos, 1]``."""
    return f"blocks.{layer}.ln1_post.hook_scale"


FINAL_SCALE = "ln_final.hook_scale"
"""The per-position scale of the final norm: ``[batch, pos, 1]``."""
FINAL_OUT = "ln_final.hook_out"
"""The final norm's output, the unembedding's input: ``[batch, pos, d_model]``."""


def qk_norm_scale(layer: int, which: Literal["q", "k"]) -> str:
    """The per-head, per-position scale of the attention's query or key norm (Gemma 3,
    Qwen 3: ``q_norm``/``k_norm`` over each head's ``d_head``), ``sqrt(mean x^2 + eps)`` of
    ``hook_q``/``hook_k``: ``[batch, head_index, pos, 1]`` (key-value heads for ``k``)."""
    return f"blocks.{layer}.attn.{which}_norm.hook_scale"


def attn_o_out(layer: int) -> str:
    """The output projection's result, the sublayer's output before the residual add."""
    return f"blocks.{layer}.attn.o.hook_out"


def qkv(layer: int, which: str) -> str:
    """Queries, keys or values (``which`` = ``q``, ``k``, ``v``) before any rotary
    embedding: ``[batch, pos, head_index, d_head]``."""
    if which not in ("q", "k", "v"):
        raise ValueError(f"which must be q, k or v, got {which!r}")
    return f"blocks.{layer}.attn.hook_{which}"


def rotated(layer: int, which: str) -> str:
    """Queries or keys (``which`` = ``q``, ``k``) after the rotary embedding."""
    if which not in ("q", "k"):
        raise ValueError(f"which must be q or k, got {which!r}")
    return f"blocks.{layer}.attn.hook_rot_{which}"


POS_EMBED = "pos_embed.hook_out"
"""Learned position embeddings, before they are added to the token embeddings."""
ROTARY_COS, ROTARY_SIN = "rotary_emb.hook_cos", "rotary_emb.hook_sin"
"""The rotary embedding's cos and sin tables, shared by every layer."""


def resid(boundary: int, n_layers: int) -> str:
    """The residual stream at a layer boundary (0 .. n_layers, see the module docstring)."""
    if not 0 <= boundary <= n_layers:
        raise ValueError(f"boundary must be in 0..{n_layers}, got {boundary}")
    if boundary < n_layers:
        return f"blocks.{boundary}.hook_resid_pre"
    return f"blocks.{n_layers - 1}.hook_resid_post"


def after(layer: int, n_layers: int) -> str:
    """A hook point that fires once every hook of block ``layer`` has: its output boundary
    (a pass that needs nothing beyond the block stops there; an encoder's attention fires
    its pattern hook after its output, so ``attn_out`` would be too early)."""
    return resid(layer + 1, n_layers)


class _Stop(Exception):
    """Raised by the last hook a caller needs, to skip the rest of the forward pass."""


def stop_pass() -> None:
    """Skip the rest of a :func:`run_hooked` pass from inside it (a hook, or a pattern
    consumer that has read all it needs)."""
    raise _Stop


def stoppable() -> contextlib.AbstractContextManager[None]:
    """A context in which a pass stopped by :func:`stop_pass` ends quietly, for a pass the
    caller runs itself (:func:`run_hooked` discards the output)."""
    return contextlib.suppress(_Stop)


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
    with bridge.hooks(fwd_hooks=hooks_list), stoppable():
        bridge(batch.input_ids, return_type=None, **batch.forward_kwargs())


def caching_hooks(names: Sequence[str], *, detach: bool = True
                  ) -> tuple[dict[str, Tensor], list[tuple[str, Callable[[Tensor, Any], None]]]]:
    """Forward hooks keeping the activations at ``names``, for a pass the caller runs some
    other way (an attention called on its own, say); :func:`capture` runs a batch.

    Each is kept as a copy in its own dtype: hook points can hand over the same tensor
    (``ln1.hook_out`` is ``attn.hook_in``), which a later hook may edit in place
    (TransformerLens' ``z[:, :, head] = 0`` idiom).

    Args:
        names: hook points (canonical names or aliases such as ``hook_resid_pre``).
        detach: keep the copies out of the autograd graph (``False``: a gradient flows).

    Returns:
        ``(kept, fwd_hooks)``: ``kept[name]`` is set (again) each time ``name`` fires.
    """
    kept: dict[str, Tensor] = {}

    def keep(name: str) -> Callable[[Tensor, Any], None]:
        def hook(tensor: Tensor, hook: Any) -> None:
            kept[name] = (tensor.detach() if detach else tensor).clone()
        return hook

    return kept, [(name, keep(name)) for name in dict.fromkeys(names)]


def capture(model: Model, batch: Batch, names: Sequence[str], *, stop_after: str | None = None,
            detach: bool = True) -> dict[str, Tensor]:
    """Run a batch and keep the activations at ``names`` (copied by :func:`caching_hooks`):
    ``run_with_cache(names_filter=names)``, stopped once the last of them has fired (or
    after ``stop_after``), so later blocks and the unembedding never run. Hooks and head
    masks active on the bridge apply; a point firing twice before the stop (Gemma 3's
    rotary tables, once per layer type) keeps its last firing.

    Args:
        model: the model (the hooks go on ``model.bridge``).
        batch: right-padded inputs (:meth:`Model.batches`), run with their mask.
        names: hook points (canonical names or aliases).
        stop_after: the hook point to stop after instead.
        detach: see :func:`caching_hooks`.

    Returns:
        ``{name: activation}`` of the whole batch in the order of ``names``; a point the
        bridge never calls, or one after ``stop_after``, is absent.

    Raises:
        WorkbenchError: a name (or ``stop_after``) that is no hook point of the model.
    """
    wanted, known = list(dict.fromkeys(names)), model.bridge.hook_dict  # built anew per read
    for name in [*wanted, *([stop_after] if stop_after else [])]:
        if name not in known:
            raise WorkbenchError(f"{model.info.name} has no hook point {name!r}"
                                 f"{did_you_mean(name, known)}")
    kept, fwd = caching_hooks(wanted, detach=detach)
    if stop_after is None:
        def stop_when_all_kept(tensor: Tensor, hook: Any) -> None:
            if len(kept) == len(wanted):
                raise _Stop

        fwd += [(name, stop_when_all_kept) for name in wanted]
    run_hooked(model.bridge, batch, fwd, stop_after=stop_after)
    return {name: kept[name] for name in wanted if name in kept}


def attention_kwargs(bridge: Any, layer: int, input_ids: Any, *,
                     position_ids: Any | None = None) -> dict[str, Any]:
    """The keyword arguments the attention of block ``layer`` receives in a forward pass,
    so that it can be called on its own input with the same positional inputs.

    Whatever the family hands its attention is captured as it is: rotary cos and sin of
    the layer's own type (Gemma 3's local and global layers differ), GPT-J's position ids,
    BLOOM's ALiBi biases. The pass stops at that attention.

    Args:
        bridge: a ``TransformerBridge``.
        layer: the block whose attention is called.
        input_ids: ``[batch, pos]`` tokens of the pass (the positional inputs depend only
            on their number and on ``position_ids``).
        position_ids: explicit ``[batch, pos]`` position ids (default ``0 .. pos-1``).

    Returns:
        The keyword arguments, except the mask and any cache.
    """
    captured: dict[str, Any] = {}

    def grab(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        captured.update(kwargs)
        raise _Stop

    extra = {} if position_ids is None else {"position_ids": position_ids}
    handle = bridge.blocks[layer].attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with contextlib.suppress(_Stop):
            bridge(input_ids, return_type=None, **extra)
    finally:
        handle.remove()
    dropped = ("hidden_states", "attention_mask", "past_key_value", "past_key_values",
               "layer_past", "use_cache", "output_attentions")
    return {k: v for k, v in captured.items() if k not in dropped}


def attention_path(model: Model, attention: AttentionPath) -> Literal["blocked", "dense"]:
    """The path a pass that reads patterns takes for ``attention`` (see
    :data:`AttentionPath`) on ``model``. ``fused`` serves only scans of kernel statistics
    (:mod:`workbench.recording.fused_scan`): for a pattern reader it means ``auto``.

    Raises:
        WorkbenchError: ``attention`` is not one of :data:`AttentionPath`.
        ModelCapabilityError: ``blocked`` asked of a model whose attention cannot be blocked.
    """
    from workbench.models import blocked

    if attention not in get_args(AttentionPath):
        raise WorkbenchError(f"attention must be one of {', '.join(get_args(AttentionPath))}, "
                             f"got {attention!r}")
    if attention == "dense":
        return "dense"
    why = blocked.support(model)
    if why is None:
        return "blocked"
    if attention == "blocked":
        raise ModelCapabilityError(f"{model.info.name}: blocked attention does not apply ({why})")
    log.info("%s keeps the dense attention path: %s", model.info.name, why)
    return "dense"


@contextlib.contextmanager
def patterns_fed(model: Model, consume: PatternConsumer, *, attention: AttentionPath = "auto",
                 layers: Collection[int] | None = None, block: int | None = None
                 ) -> Iterator[Literal["blocked", "dense"]]:
    """Hand every pass's attention weights to ``consume``, one block of query rows at a
    time (:class:`~workbench.models.blocked.PatternBlock`), whichever path computes them.

    ``blocked``: the model's own attention computed block by block, so no pattern is ever
    whole. ``dense``: the bridge's pattern at :func:`pattern`, cut into blocks of rows over
    every key; other hooks on the pattern then see it whole (the path for a hook that needs
    it, or a family the blocked path does not know). A pass that needs only some layers
    stops at :func:`after` the deepest (every path has handed its blocks by then).

    Args:
        model: the model.
        consume: called with every block of the layers in ``layers``.
        attention: the path (default ``auto``: blocked where the family has it).
        layers: the layers handed over (default all).
        block: query rows per block (default: from the blocked path's memory budget).

    Yields:
        The path taken.
    """
    from workbench.core import attention as run_attention
    from workbench.models import blocked

    path = attention_path(model, attention)
    run_attention.note("blocked" if path == "blocked" else "eager")
    wanted = range(model.info.n_layers) if layers is None else layers
    if path == "blocked":
        with blocked.blocked(model, consume, layers=set(wanted), block=block):
            yield path
        return

    def feed(layer: int) -> Callable[[Tensor, Any], None]:
        def hook(tensor: Tensor, hook: Any) -> None:
            batch, heads, n_query, n_key = tensor.shape
            step = block or blocked.rows_per_block(batch, heads, n_key)
            for q0 in range(0, n_query, step):
                consume(blocked.PatternBlock(layer, q0, 0, tensor[:, :, q0:q0 + step], n_key))
        return hook

    with model.bridge.hooks(fwd_hooks=[(pattern(layer), feed(layer)) for layer in wanted]):
        yield path
