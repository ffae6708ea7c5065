"""Attention one block of query rows at a time, inside the model's own forward pass.

The bridge's eager attention builds each layer's ``[batch, head, query, key]`` scores and
softmax pattern whole: at 8,192 tokens on smollm2, 2.4 GB each. Every row of a pattern is
a softmax of its own query's scores, so nothing needs the whole matrix at once.
:func:`blocked` swaps, for its duration, each layer's attention for one that computes the
scores, the softmax and the value mixing one block of query rows at a time, hands every
block of weights to a :class:`PatternConsumer`, and builds the layer's output from the
blocks. The arithmetic is the family's own, step for step (scale, soft-capping, ALiBi,
grouped-query heads, rotary, q/k norms, masks, softmax dtype), so the layer's output is
the bridge's eager output; no ``[head, T, T]`` tensor, and no ``[T, T]`` mask, exists.

Where it hooks in, by how the bridge runs a family's attention:

- bridges that compute attention themselves (``PositionEmbeddingsAttentionBridge``:
  Llama, Gemma, Qwen, OLMo 2, Phi, ...; the fused-QKV bridges: GPT-2, GPT-NeoX, Phi-3,
  Falcon, GPT-BigCode; BLOOM's): their projections, norms, rotary steps and hook points are
  run as they are (``hook_q/k/v``, ``hook_rot_q/k`` and ``hook_z`` still fire, so head
  masks and edits there still apply), and only the scores-to-output step is blocked;
- bridges that hand the work to the Hugging Face module (OPT, GPT-J, BERT, RoBERTa): a
  transformers ``AttentionInterface`` function that calls the family's own eager
  attention on each block of query rows; GPT-Neo's own ``_attn`` the same way.

Masks: the model's config names :data:`IMPLEMENTATION` for the duration, so transformers'
mask builders (causal, sliding-window, padding, chunked) hand each layer a
:class:`RowMask`, the mask function they would have evaluated, which is evaluated here one
block of rows at a time. Keys that no query of a block can see (the future of a causal
block, the far past of a sliding window) carry exactly zero weight, so the block is
computed over the keys some query sees (``PatternBlock.k0 .. k1``).

Block size: the most rows whose ``[batch, head, rows, key]`` float32 scores fit in
``block_bytes`` (default :data:`BLOCK_BYTES`), rounded down to a power of two; a
block's temporaries (scores, weights, a consumer's reduction) are a few of those.

What stays dense: ``hook_pattern`` and ``hook_attn_scores`` never fire in a blocked pass
(a hook there would need the whole pattern; one attached raises), and a family whose
attention this module does not know (:func:`support` says why) keeps the existing path.

Examples:
    >>> def keep_sink(block):                          # doctest: +SKIP
    ...     sinks[block.layer] += block.weights[..., 0].sum(-1) if block.k0 == 0 else 0
    >>> with blocked(model, keep_sink):                # doctest: +SKIP
    ...     model.bridge(ids, return_type=None)
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.models.base import Model

IMPLEMENTATION = "workbench_blocked"
"""The attention implementation a model's config names during a blocked pass."""
BLOCK_BYTES = 32 << 20
"""Default size of one block's float32 scores ``[batch, head, rows, key]``. At most 32 MiB:
glibc's allocator maps a larger block afresh from the kernel at every allocation (its
mmap threshold grows no further), and the page faults that costs were a sixth of an
8,192-token topk recording on smollm2 (2 cores: 80.3 s and 19.9 s of system time at 64
MiB, 72.0 s and 7.4 s at 32 MiB; 78.7 s at 16 MiB, where a block's work no longer pays
for its fixed costs)."""


@dataclass(frozen=True)
class PatternBlock:
    """The attention weights of one layer for a block of query rows.

    Every weight outside keys ``k0 .. k0 + width`` is exactly zero (no query of the block
    sees those keys), so a consumer reads the block as the rows ``q0 ..`` of the pattern
    over all ``n_keys`` keys with zeros elsewhere.

    Attributes:
        layer: the layer.
        q0: the position of the block's first query row.
        k0: the position of its first key column.
        weights: ``[batch, head_index, query_pos, key_pos]``, float32 where the family's
            softmax is float32 (most), else in the model's dtype.
        n_keys: the number of keys of the pass (the batch's padded width).
    """

    layer: int
    q0: int
    k0: int
    weights: Float[Tensor, "batch head_index query_pos key_pos"]
    n_keys: int

    @property
    def q1(self) -> int:
        return self.q0 + self.weights.shape[-2]

    @property
    def k1(self) -> int:
        return self.k0 + self.weights.shape[-1]


class PatternConsumer(Protocol):
    """Called with every block of every layer, in order of layer and then of rows."""

    def __call__(self, block: PatternBlock) -> None: ...


@dataclass(frozen=True)
class ScoreInputs:
    """What one layer's attention scores are made of, as the blocked pass computes them:
    for head ``h``, query ``i`` and key ``j`` the score is ``scale * q[h, i] . k[h // g, j]``
    (``g`` query heads per key-value head), soft-capped as ``cap * tanh(score / cap)``
    where the family has a cap, and the weights are its softmax over the keys row ``i``
    sees (:meth:`visible`).

    Attributes:
        layer: the layer.
        queries: ``[batch, head_index, query_pos, d_head]``, after the q norm and rotary.
        keys: ``[batch, kv_head, key_pos, d_head]``, after the k norm and rotary, one per
            key-value head (not repeated for grouped-query heads).
        scale: the factor on ``q . k``.
        softcap: the soft-cap, or ``None``.
        visible: ``visible(r0, r1)``: which keys rows ``r0 .. r1`` see
            (``[batch, 1, rows, key_pos]``), or ``None`` when every row sees every key.
        offset: the position of the first query (keys before it come from a cache).
        slopes: ALiBi's slope per head (``[head_index]``): head ``h``'s score on key ``j``
            gains ``slopes[h] * j``, ``j`` counted from the prompt's first token; ``None``
            without ALiBi.
    """

    layer: int
    queries: Float[Tensor, "batch head_index query_pos d_head"]
    keys: Float[Tensor, "batch kv_head key_pos d_head"]
    scale: float
    softcap: float | None
    visible: Callable[[int, int], Bool[Tensor, "batch 1 query_pos key_pos"] | None]
    offset: int = 0
    slopes: Float[Tensor, " head_index"] | None = None


ScoreConsumer = Callable[[ScoreInputs], None]
"""Called with each layer's :class:`ScoreInputs`, before its blocks."""


@dataclass(frozen=True)
class FusedInputs:
    """What one layer's fused attention is computed from (:mod:`workbench.models.fused`):
    the :class:`ScoreInputs` and the values, keys and values not repeated over grouped
    heads.

    Attributes:
        scores: the layer's queries, keys, scale, soft-cap and mask.
        values: ``[batch, kv_head, key_pos, d_head]``.
    """

    scores: ScoreInputs
    values: Float[Tensor, "batch kv_head key_pos d_head"]


FusedAttention = Callable[[FusedInputs], Tensor | None]
"""Computes one layer's attention output ``[batch, head_index, query_pos, d_head]`` (and
whatever statistics it keeps) in place of its blocks, or returns ``None`` to keep the
blocked path for that layer."""


def rows_per_block(batch: int, heads: int, n_keys: int, block_bytes: int = BLOCK_BYTES) -> int:
    """The query rows of a block: the most whose float32 ``[batch, head, rows, key]``
    scores fit in ``block_bytes``, rounded down to a power of two (at least 1)."""
    rows = max(1, block_bytes // max(1, 4 * batch * heads * n_keys))
    return 1 << (rows.bit_length() - 1)


# ---- the mask, a block of rows at a time ------------------------------------------------

class RowMask:
    """The mask transformers would build for a layer, kept as the arguments of its mask
    builder and evaluated one block of query rows at a time.

    ``visible(r0, r1)`` is exactly rows ``r0 .. r1`` of ``transformers.masking_utils``'
    ``sdpa_mask`` (the boolean mask every eager mask is made from), or ``None`` where it
    would build none (bidirectional attention without padding).
    """

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self._last: tuple[tuple[int, int], Tensor | None] | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype transformers' eager mask would have (the embeddings')."""
        return self.kwargs.get("dtype", torch.float32)

    def visible(self, r0: int, r1: int) -> Bool[Tensor, "batch 1 query key"] | None:
        from transformers.masking_utils import sdpa_mask

        # every layer of a pass reads the same mask: a prompt short enough for one block
        # per layer builds it once (only the last block is kept, so memory stays a block's)
        if self._last is not None and self._last[0] == (r0, r1):
            return self._last[1]
        kwargs = {**self.kwargs, "q_length": r1 - r0,
                  "q_offset": self.kwargs.get("q_offset", 0) + r0, "allow_is_causal_skip": False}
        visible = sdpa_mask(**kwargs)
        self._last = ((r0, r1), visible)
        return visible


def _row_mask(**kwargs: Any) -> RowMask:
    return RowMask(**kwargs)


def _register() -> None:
    """Name :data:`IMPLEMENTATION` in transformers' attention and mask interfaces."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, _interface_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, _row_mask)


@dataclass
class _Rows:
    """The mask of one attention call, by blocks of rows.

    Args of construction:
        mask: a :class:`RowMask`, a 4-D mask handed in by the caller, or ``None``.
        n_queries, n_keys: of the call; queries are the last ``n_queries`` positions.
        causal: a missing mask means causal (the bridges' rule); else it means none.
        also: a family's own visibility of rows ``r0 .. r1`` (GPT-Neo's ``bias``).
    """

    mask: RowMask | Tensor | None
    n_queries: int
    n_keys: int
    causal: bool
    also: Callable[[int, int], Bool[Tensor, "batch 1 query key"]] | None = None

    @property
    def offset(self) -> int:
        """The position of the first query (keys before it come from a cache)."""
        return self.n_keys - self.n_queries

    def _tensor_rows(self, r0: int, r1: int) -> Tensor:
        assert isinstance(self.mask, Tensor)
        mask = self.mask[..., : self.n_keys]
        if mask.shape[-2] != self.n_queries:  # a full-sequence mask: the live queries are last
            mask = mask[..., -self.n_queries:, :]
        return mask[..., r0:r1, :]

    def visible(self, r0: int, r1: int) -> Bool[Tensor, "batch 1 query key"] | None:
        """Which keys each row of the block may see (``None``: every key)."""
        if isinstance(self.mask, RowMask):
            seen = self.mask.visible(r0, r1)
        elif isinstance(self.mask, Tensor):
            rows = self._tensor_rows(r0, r1)
            seen = rows if rows.dtype == torch.bool else rows > torch.finfo(rows.dtype).min
        elif self.causal:
            keys = torch.arange(self.n_keys)
            seen = (keys[None, :] <= torch.arange(r0, r1)[:, None] + self.offset)[None, None]
        else:
            seen = None
        if self.also is not None:
            extra = self.also(r0, r1)
            seen = extra if seen is None else seen & extra
        return seen

    def given(self, r0: int, r1: int, k0: int, k1: int,
              visible: Tensor | None) -> Tensor | None:
        """The block's mask over keys ``k0 .. k1`` as the family's arithmetic adds it: the
        eager float mask transformers would have built (0 or the dtype's minimum), the
        caller's own rows, or (a causal bridge without a mask) the visible keys."""
        if isinstance(self.mask, RowMask):
            if visible is None:
                return None
            zero = torch.zeros((), dtype=self.mask.dtype, device=visible.device)
            return torch.where(visible[..., k0:k1], zero, torch.finfo(self.mask.dtype).min)
        if isinstance(self.mask, Tensor):
            return self._tensor_rows(r0, r1)[..., k0:k1]
        return None if visible is None or not self.causal else visible[..., k0:k1]


def _window(visible: Tensor | None, n_keys: int) -> tuple[int, int]:
    """The keys ``k0 .. k1`` some row of the block sees (every key outside them has weight
    exactly 0 in every row that sees a key).

    A row that sees no key at all (only a padded query can: past the end of its prompt and
    beyond a sliding window) gets eager attention's even spread over the block's keys
    instead of over every key; no real token reads a padded one.
    """
    if visible is None:
        return 0, n_keys
    # a max over uint8 along the rows, not bool's any(): several times faster on CPU
    seen = visible.view(torch.uint8).amax(dim=(0, 1, 2)).nonzero()
    if len(seen) == 0:
        return 0, n_keys
    return int(seen[0]), int(seen[-1]) + 1


# ---- the loop over blocks ---------------------------------------------------------------

BlockFn = Callable[..., tuple[Tensor, Tensor]]
"""``(r0, r1, k0, k1, mask, *tensors) -> (mixed values of rows r0..r1, their weights)``,
with ``tensors`` the layer's queries, keys and values (what :meth:`_Layer.run` is given):
passed, not closed over, so that a checkpoint keeps them as its inputs (see
:meth:`_Layer._run_recomputed`)."""


@dataclass
class _Layer:
    """What one layer's blocked attention reports to, and how it blocks."""

    layer: int
    consume: PatternConsumer | None
    block: int | None
    block_bytes: int
    scores: ScoreConsumer | None = None
    fused: FusedAttention | None = None

    def hand_scores(self, rows: _Rows, q: Tensor, k: Tensor, scale: float,
                    softcap: float | None, slopes: Tensor | None = None) -> None:
        """Give the layer's :class:`ScoreInputs` to its score consumer, if it has one."""
        if self.scores is not None:
            self.scores(ScoreInputs(self.layer, q, k, float(scale),
                                    None if softcap is None else float(softcap),
                                    rows.visible, rows.offset, slopes))

    def fuse(self, rows: _Rows, q: Tensor, k: Tensor, v: Tensor, scale: float,
             softcap: float | None) -> Tensor | None:
        """The layer's ``[batch, head, query, d_head]`` output from its fused attention, or
        ``None`` where it has none (or it keeps the blocked path)."""
        if self.fused is None:
            return None
        inputs = ScoreInputs(self.layer, q, k, float(scale),
                             None if softcap is None else float(softcap), rows.visible,
                             rows.offset)
        return self.fused(FusedInputs(inputs, v))

    def run(self, rows: _Rows, batch: int, heads: int, out_axis: int,
            block_fn: BlockFn, tensors: tuple[Tensor, ...]) -> Tensor:
        """Every block of rows through ``block_fn`` (given ``tensors`` after its mask);
        the mixed values written along ``out_axis`` (the query axis of the family's
        output)."""
        step = self.block or rows_per_block(batch, heads, rows.n_keys, self.block_bytes)
        if torch.is_grad_enabled() and self.consume is None:
            return self._run_recomputed(rows, step, out_axis, block_fn, tensors)
        out: Tensor | None = None
        for r0 in range(0, rows.n_queries, step):
            r1 = min(r0 + step, rows.n_queries)
            visible = rows.visible(r0, r1)
            k0, k1 = _window(visible, rows.n_keys)
            mixed, weights = block_fn(r0, r1, k0, k1, rows.given(r0, r1, k0, k1, visible),
                                      *tensors)
            if self.consume is not None:
                self.consume(PatternBlock(self.layer, rows.offset + r0, k0, weights,
                                          rows.n_keys))
            if out is None:
                # the whole output, allocated once: blocks kept alive between the growing
                # temporaries of later blocks fragment the heap, and a 32,768-token layer's
                # resident memory then grew by gigabytes (a run in three or four)
                shape = list(mixed.shape)
                shape[out_axis] = rows.n_queries
                out = mixed.new_empty(shape)
            out.narrow(out_axis, r0, r1 - r0).copy_(mixed)
        assert out is not None
        return out

    def _run_recomputed(self, rows: _Rows, step: int, out_axis: int,
                        block_fn: BlockFn, tensors: tuple[Tensor, ...]) -> Tensor:
        """:meth:`run` under autograd: each block's mixing is checkpointed, so the
        backward pass recomputes one block's weights at a time from the queries, keys and
        values it keeps, and no block of weights outlives its own forward or backward
        step (memory linear in the keys, per block of rows).

        A block's mask is made inside its checkpoint, so it is made again in the backward
        pass rather than kept: the masks of every block, kept, were a quarter of a
        ``[T, T]`` float32 matrix per layer (3.8 GiB on smollm2's 30 layers at 8,192
        tokens), the one term of the backward's memory quadratic in T.

        The queries, keys and values are the checkpoints' inputs, not held by their
        function: a checkpoint saves its inputs as autograd saves any tensor, so inside a
        checkpointed block (:func:`workbench.interventions.circuits.flow.recomputed_layers`)
        the block's own checkpoint lets them go until its backward pass recomputes them.
        Closed over, they were kept for every layer from the forward pass on: 1,536 floats
        per token and layer on gemma3, three times the block's input."""
        from torch.utils.checkpoint import checkpoint

        def mixed(r0: int, r1: int, k0: int, k1: int, *held: Tensor) -> Tensor:
            given = rows.given(r0, r1, k0, k1, rows.visible(r0, r1))
            return block_fn(r0, r1, k0, k1, given, *held)[0]

        out: Tensor | None = None
        for r0 in range(0, rows.n_queries, step):
            r1 = min(r0 + step, rows.n_queries)
            k0, k1 = _window(rows.visible(r0, r1), rows.n_keys)
            part: Tensor = checkpoint(mixed, r0, r1, k0, k1, *tensors, use_reentrant=False)
            if out is None:
                # allocated once, as :meth:`run`'s: blocks of rows kept until a final
                # concatenation sat above each later, larger block's freed temporaries
                # (a causal layer's blocks grow with their keys), and the holes left
                # below them stayed resident: gemma3's edge scores at 16,384 tokens
                # peaked 8.0 GiB above the model with them, 6.2 without
                shape = list(part.shape)
                shape[out_axis] = rows.n_queries
                out = part.new_empty(shape)
            out.narrow(out_axis, r0, r1 - r0).copy_(part)
            del part
        assert out is not None
        return out


def _refuse_pattern_hooks(attn: Any) -> None:
    for name in ("hook_pattern", "hook_attn_scores"):
        point = getattr(attn, name, None)
        if point is not None and point.fwd_hooks:
            raise WorkbenchError(f"a hook on {attn.name}.{name} needs the whole pattern, which "
                                 "a blocked pass never builds: run it with the dense path")


def _hidden_states(args: tuple, kwargs: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
    kwargs = dict(kwargs)
    if "hidden_states" in kwargs:
        return kwargs.pop("hidden_states"), kwargs
    return args[0], kwargs


# ---- bridges that compute attention themselves: rotary (Llama, Gemma, Qwen, ...) --------

def _rotate(attn: Any, q: Tensor, k: Tensor, position_embeddings: tuple[Tensor, Tensor],
            head_dim: int) -> tuple[Tensor, Tensor]:
    """The bridge's rotary step: full, partial, or from half-width tables."""
    from transformer_lens.utilities.hf_utils import get_rotary_pct_from_config
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cos, sin = attn._apply_position_embedding_hooks(position_embeddings)
    rotary_dim = cos.shape[-1]
    if rotary_dim * 2 == head_dim and get_rotary_pct_from_config(attn.config) == 1.0:
        return apply_rotary_pos_emb(q, k, torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))
    if rotary_dim < head_dim:
        q_rot, k_rot = apply_rotary_pos_emb(q[..., :rotary_dim], k[..., :rotary_dim], cos, sin)
        return (torch.cat([q_rot, q[..., rotary_dim:]], -1),
                torch.cat([k_rot, k[..., rotary_dim:]], -1))
    return apply_rotary_pos_emb(q, k, cos, sin)


def _rotary_qkv(attn: Any, hidden_states: Tensor, position_embeddings: Any,
                ) -> tuple[Tensor, Tensor, Tensor]:
    """Queries, keys and values ``[batch, head, pos, d_head]`` as the bridge makes them:
    its projections, q/k norms (over every head, or per head), rotary and hook points."""
    head_dim = attn.original_component.head_dim
    shape = (*hidden_states.shape[:-1], -1, head_dim)
    q, k, v = attn.q(hidden_states), attn.k(hidden_states), attn.v(hidden_states)
    has_q, has_k = "q_norm" in attn.submodules, "k_norm" in attn.submodules
    if has_q and attn._qk_norm_phase == "pre_reshape":
        q = attn._apply_pre_reshape_qk_norm(q, attn.q_norm, attn.hook_q_normed, head_dim)
        if has_k:
            k = attn._apply_pre_reshape_qk_norm(k, attn.k_norm, attn.hook_k_normed, head_dim)
    q, k, v = (x.view(shape).transpose(1, 2) for x in (q, k, v))
    if has_q and attn._qk_norm_phase == "post_reshape":
        # per-head norm weights broadcast on the [batch, pos, head, d_head] layout
        flip = (lambda x: x.transpose(1, 2)) if attn._qk_norm_per_head else (lambda x: x)
        q = attn.hook_q_normed(flip(attn.q_norm(flip(q))))
        if has_k:
            k = attn.hook_k_normed(flip(attn.k_norm(flip(k))))
    if position_embeddings is not None:
        q, k = _rotate(attn, q, k, position_embeddings, head_dim)
    if hasattr(attn, "hook_rot_q"):
        q = attn.hook_rot_q(q)
    if hasattr(attn, "hook_rot_k"):
        k = attn.hook_rot_k(k)
    return q, k, v


def _rotary_output(attn: Any, z: Tensor, input_shape: tuple[int, ...], head_dim: int) -> Tensor:
    """The bridge's output step: its seam before the projection, the projection's dtype,
    then the projection (``hook_z`` fires) or the per-head results."""
    z = attn._pre_output_projection(z)
    weight = getattr(getattr(attn.o, "original_component", None), "weight", None)
    if isinstance(weight, Tensor) and weight.dtype.is_floating_point and z.dtype != weight.dtype:
        z = z.to(weight.dtype)
    if getattr(attn.config, "use_attn_result", False):
        n_heads = int(attn.config.n_heads)
        z = attn.o.hook_in(z)
        out = attn._compute_per_head_result(z.view(*input_shape, n_heads, head_dim), n_heads,
                                            head_dim)
    else:
        out = attn.o(z)
    return attn.hook_out(out)


def _softmaxed(attn: Any, scores: Tensor, given: Tensor | None, dtype: torch.dtype
               ) -> tuple[Tensor, Tensor]:
    """The bridges' masked float32 softmax of a block (``scores`` is the block's own, and
    is overwritten): ``(weights in dtype, float32)``."""
    if given is not None and given.ndim == 4 and given.dtype == scores.dtype:
        # the bridge's rule for a 4-D float mask outside compatibility mode (which is never
        # blocked): scores + mask, here in place (a block is the largest tensor of a pass)
        scores = scores.add_(given)
    else:
        scores = attn._apply_reconstruct_attention_mask(
            attn_scores=scores, attention_mask=given, seq_len=scores.shape[-1],
            q_seq_len=scores.shape[-2])
    pattern = attn._masked_softmax(scores, dtype=torch.float32)
    weights = attn._scrub_compatibility_pattern_nans(pattern.to(dtype))
    dropout = getattr(attn.original_component, "attention_dropout", 0.0)
    if attn.training and dropout > 0.0:
        weights = torch.nn.functional.dropout(weights, p=dropout, training=True)
    return weights, pattern


def _rotary_forward(attn: Any, plan: _Layer, *args: Any, **kwargs: Any) -> tuple[Tensor, None]:
    """``PositionEmbeddingsAttentionBridge.forward``, blocked."""
    from transformers.models.llama.modeling_llama import repeat_kv

    _refuse_pattern_hooks(attn)
    hidden_states, kwargs = _hidden_states(args, kwargs)
    position_embeddings = kwargs.pop("position_embeddings", None)
    mask = kwargs.pop("attention_mask", None)
    hf = attn.original_component
    hidden_states = attn.hook_in(hidden_states)
    input_shape = hidden_states.shape[:-1]
    q, k, v = _rotary_qkv(attn, hidden_states, position_embeddings)
    k, v = attn._update_kv_cache(k, v, **kwargs)
    scaling = getattr(hf, "scaling", hf.head_dim ** -0.5)
    softcap = getattr(hf, "attn_logit_softcapping", None)
    rows = _Rows(mask, q.shape[-2], k.shape[-2], attn.is_causal and not attn.is_cross_attention)
    plan.hand_scores(rows, q, k, scaling, softcap)
    z = None if attn.training else plan.fuse(rows, q, k, v, scaling, softcap)
    if z is not None:
        z = z.transpose(1, 2).contiguous().reshape(*input_shape, -1)
        return _rotary_output(attn, z, tuple(input_shape), hf.head_dim), None
    groups = getattr(hf, "num_key_value_groups", 1)
    if groups > 1:
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)

    def block_fn(r0: int, r1: int, k0: int, k1: int, given: Tensor | None, q: Tensor,
                 k: Tensor, v: Tensor):
        # the eager arithmetic, step for step, in place on the block's own scores
        scores = torch.matmul(q[:, :, r0:r1], k[:, :, k0:k1].transpose(-2, -1)).mul_(scaling)
        if softcap is not None and torch.is_grad_enabled():
            # out of place: tanh keeps its output for the backward pass, which the
            # in-place steps after it would overwrite (unchecked inside a checkpoint)
            scores = torch.tanh(scores / softcap) * softcap
        elif softcap is not None:
            scores = scores.div_(softcap).tanh_().mul_(softcap)
        weights, pattern = _softmaxed(attn, scores, given, q.dtype)
        return torch.matmul(weights, v[:, :, k0:k1]), pattern

    z = plan.run(rows, q.shape[0], q.shape[1], -2, block_fn, (q, k, v))
    z = z.transpose(1, 2).contiguous().reshape(*input_shape, -1)
    return _rotary_output(attn, z, tuple(input_shape), hf.head_dim), None


# ---- bridges with a fused QKV projection (GPT-2, GPT-NeoX, Phi-3, Falcon, BigCode) ------

def _joint_reconstruct(attn: Any, plan: _Layer, rotary: bool, q: Tensor, k: Tensor, v: Tensor,
                       **kwargs: Any) -> tuple[Tensor, None]:
    """``JointQKVAttentionBridge._reconstruct_attention`` (and its rotary subclass's),
    blocked."""
    _refuse_pattern_hooks(attn)
    n_heads = attn.config.n_heads
    n_kv = getattr(attn.config, "n_key_value_heads", None) or n_heads
    q, k, v, batch, n_q, head_dim = attn._reshape_qkv_to_heads(q, k, v, n_heads, n_kv)
    pe = kwargs.get("position_embeddings")
    if rotary and isinstance(pe, tuple):
        q, k = attn._apply_rotary_pos_emb(q, k, *attn._apply_position_embedding_hooks(pe))
    k, v = attn._update_kv_cache(k, v, **kwargs)
    scale = head_dim ** (-0.5)
    if not rotary and getattr(attn.config, "scale_attn_by_inverse_layer_idx", False) \
            and attn._layer_idx is not None:
        scale /= float(attn._layer_idx + 1)
    rows = _Rows(kwargs.get("attention_mask"), n_q, k.shape[-2],
                 attn.is_causal and not attn.is_cross_attention)
    plan.hand_scores(rows, q, k, scale, None)
    z = None if attn.training else plan.fuse(rows, q, k, v, scale, None)
    if z is not None:
        return _joint_output(attn, attn._reshape_attn_output(z, batch, n_q, n_heads, head_dim),
                             batch, n_q, n_heads, head_dim), None
    if n_kv != n_heads:
        k, v = (x.repeat_interleave(n_heads // n_kv, dim=1) for x in (k, v))
    upcast = not rotary and getattr(attn, "_reorder_and_upcast_attn", False)
    q_s, k_s = (q.float(), k.float()) if upcast else (q, k)

    def block_fn(r0: int, r1: int, k0: int, k1: int, given: Tensor | None, q_s: Tensor,
                 k_s: Tensor, v: Tensor):
        scores = torch.matmul(q_s[:, :, r0:r1], k_s[:, :, k0:k1].transpose(-2, -1)) * scale
        scores = attn._apply_reconstruct_attention_mask(
            attn_scores=scores, attention_mask=given, seq_len=k1 - k0, q_seq_len=r1 - r0)
        weights = attn._masked_softmax(scores)
        if upcast:
            weights = weights.to(v.dtype)
        weights = attn._apply_attn_dropout(attn._scrub_compatibility_pattern_nans(weights))
        return torch.matmul(weights, v[:, :, k0:k1]), weights

    z = plan.run(rows, batch, n_heads, -2, block_fn, (q_s, k_s, v))
    return _joint_output(attn, attn._reshape_attn_output(z, batch, n_q, n_heads, head_dim),
                         batch, n_q, n_heads, head_dim), None


def _joint_output(attn: Any, z: Tensor, batch: int, n_q: int, n_heads: int, head_dim: int
                  ) -> Tensor:
    """The fused-QKV bridges' output step: the projection, or the per-head results."""
    if getattr(attn.config, "use_attn_result", False) and attn.o.original_component is not None:
        z = attn.o.hook_in(z)
        return attn._compute_per_head_result(z.view(batch, n_q, n_heads, head_dim), n_heads,
                                             head_dim)
    return attn._apply_output_projection(z)


def _bloom_reconstruct(attn: Any, plan: _Layer, q: Tensor, k: Tensor, v: Tensor,
                       **kwargs: Any) -> tuple[Tensor, None]:
    """``BloomAttentionBridge._reconstruct_attention`` (ALiBi through ``baddbmm``), blocked."""
    _refuse_pattern_hooks(attn)
    n_heads = attn.config.n_heads
    q, k, v, batch, n_q, head_dim = attn._reshape_qkv_to_heads(q, k, v, n_heads)
    k, v = attn._update_kv_cache(k, v, **kwargs)
    n_k = k.shape[-2]
    q_bh, k_bh, v_bh = (x.reshape(batch * n_heads, -1, head_dim) for x in (q, k, v))
    inv_norm = head_dim ** (-0.5)
    alibi = kwargs.get("alibi")
    if alibi is not None and alibi.shape[-1] < n_k:
        raise WorkbenchError("a blocked pass does not extend ALiBi biases over a cache")
    rows = _Rows(kwargs.get("attention_mask"), n_q, n_k, causal=False)
    if plan.scores is not None:
        plan.hand_scores(rows, q, k, inv_norm, None,
                         None if alibi is None else _alibi_slopes(alibi, batch, n_heads))

    def block_fn(r0: int, r1: int, k0: int, k1: int, given: Tensor | None, q_bh: Tensor,
                 k_bh: Tensor, v_bh: Tensor):
        keys = k_bh[:, k0:k1].transpose(-1, -2)
        if alibi is not None:
            scores = alibi[..., k0:k1].baddbmm(batch1=q_bh[:, r0:r1], batch2=keys, beta=1.0,
                                               alpha=inv_norm)
        else:
            scores = torch.bmm(q_bh[:, r0:r1], keys) * inv_norm
        scores = scores.view(batch, n_heads, r1 - r0, k1 - k0)
        if given is not None:
            scores = scores + attn._normalize_compatibility_mask_sentinel(given)
        pattern = attn._masked_softmax(scores, dtype=torch.float32)
        weights = attn._apply_attn_dropout(attn._scrub_compatibility_pattern_nans(
            pattern.to(q.dtype)))
        mixed = torch.bmm(weights.reshape(batch * n_heads, r1 - r0, -1), v_bh[:, k0:k1])
        return mixed.view(batch, n_heads, r1 - r0, head_dim), pattern

    z = plan.run(rows, batch, n_heads, -2, block_fn, (q_bh, k_bh, v_bh))
    return _joint_output(attn, attn._reshape_attn_output(z, batch, n_q, n_heads, head_dim),
                         batch, n_q, n_heads, head_dim), None


def _alibi_slopes(alibi: Tensor, batch: int, n_heads: int) -> Tensor:
    """Each head's ALiBi slope, read from the pass's own biases ``[batch * heads, 1, key]``
    (Bloom's ``build_alibi_tensor``: ``slope * position``, 0 on padding), which must be
    ``slope * j`` at every key ``j`` a prompt has, counted from its first token.

    Raises:
        WorkbenchError: biases of another form (left padding shifts every position).
    """
    bias = alibi.float().reshape(batch, n_heads, -1)
    j = torch.arange(bias.shape[-1], dtype=torch.float32)
    slopes = (bias / j.clamp(min=1)).amax(dim=(0, 2))  # Bloom's slopes are positive
    fits = torch.isclose(bias, slopes[None, :, None] * j, rtol=1e-5, atol=1e-6)
    if not (fits | (bias == 0)).all():
        raise WorkbenchError("ALiBi biases that are not slope x key position (left padding?)")
    return slopes


# ---- bridges that hand attention to the Hugging Face module -----------------------------

_INTERFACE_LAYERS: dict[Any, _Layer] = {}
"""The Hugging Face attention modules of the models in a blocked pass, and their layers."""


def _family_eager(module: Any) -> Callable[..., tuple[Tensor, Tensor]]:
    """The family's own eager attention, from the module that defines ``module``'s class."""
    return sys.modules[type(module).__module__].eager_attention_forward


def _interface_attention(module: Any, query: Tensor, key: Tensor, value: Tensor,
                         attention_mask: Any, **kwargs: Any) -> tuple[Tensor, None]:
    """The :data:`IMPLEMENTATION` attention function: the family's eager attention, one
    block of query rows at a time (its output is ``[batch, query, head, d_head]``)."""
    plan = _INTERFACE_LAYERS.get(module)
    if plan is None:
        raise WorkbenchError(f"{IMPLEMENTATION} attention runs only inside models.blocked.blocked")
    eager = _family_eager(module)

    def block_fn(r0: int, r1: int, k0: int, k1: int, given: Tensor | None, query: Tensor,
                 key: Tensor, value: Tensor):
        return eager(module, query[:, :, r0:r1], key[:, :, k0:k1], value[:, :, k0:k1], given,
                     **kwargs)

    rows = _Rows(attention_mask, query.shape[-2], key.shape[-2], causal=False)
    scaling = kwargs.get("scaling")
    plan.hand_scores(rows, query, key, query.shape[-1] ** -0.5 if scaling is None else scaling,
                     kwargs.get("softcap"))
    return plan.run(rows, query.shape[0], query.shape[1], 1, block_fn, (query, key, value)), None


def _gpt_neo_attn(module: Any, plan: _Layer, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Any = None) -> tuple[Tensor, None]:
    """``GPTNeoSelfAttention._attn`` (no scaling; its own causal or local ``bias`` buffer,
    then the mask), blocked."""
    query, key = query.to(torch.float32), key.to(torch.float32)
    n_q, n_k = query.size(-2), key.size(-2)
    first = n_k - n_q

    def bias(r0: int, r1: int) -> Tensor:
        return module.bias[:, :, first + r0: first + r1, :n_k]

    def block_fn(r0: int, r1: int, k0: int, k1: int, given: Tensor | None, query: Tensor,
                 key: Tensor, value: Tensor):
        weights = torch.matmul(query[:, :, r0:r1], key[:, :, k0:k1].transpose(-1, -2))
        floor = torch.tensor(torch.finfo(weights.dtype).min, dtype=weights.dtype,
                             device=weights.device)
        weights = torch.where(bias(r0, r1)[..., k0:k1], weights, floor)
        if given is not None:
            weights = weights + given
        weights = module.attn_dropout(torch.softmax(weights, dim=-1).to(value.dtype))
        return torch.matmul(weights, value[:, :, k0:k1]), weights

    rows = _Rows(attention_mask, n_q, n_k, causal=False, also=bias)
    plan.hand_scores(rows, query, key, 1.0, None)  # GPT-Neo does not scale its scores
    return plan.run(rows, query.shape[0], query.shape[1], -2, block_fn,
                    (query, key, value)), None


# ---- which path each layer takes --------------------------------------------------------

_UNSUPPORTED_FLAGS = ("use_split_qkv_input", "use_attn_in", "gated_q_proj",
                      "qk_norm_after_rope", "rotary_interleaved_cos_sin",
                      "rotary_adjacent_pairs")
"""Bridge config switches whose variants of the attention are not reproduced here."""


def _rotary_refusal(attn: Any) -> str | None:
    hf = attn.original_component
    rope = getattr(getattr(hf, "config", None), "rope_parameters", None)
    if getattr(hf, "key_multiplier", None) is not None or getattr(hf, "sinks", None) is not None:
        return "its attention scales keys or adds learned sink logits"
    if getattr(getattr(hf, "config", None), "clip_qkv", None) is not None:
        return "its attention clips q, k and v"
    if isinstance(rope, dict) and rope.get("llama_4_scaling_beta") is not None:
        return "its attention rescales queries by position"
    gate = attn._modules.get("gate")
    if gate is not None and gate.original_component is not None:
        return "its attention output is gated"
    return None


def _uses_interface(module: Any) -> bool:
    """Whether a Hugging Face module's forward calls ``ALL_ATTENTION_FUNCTIONS`` and its
    family defines an eager attention to call per block."""
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return False
    family = sys.modules.get(type(module).__module__)
    return "ALL_ATTENTION_FUNCTIONS" in source and hasattr(family, "eager_attention_forward")


def _kind(attn: Any) -> tuple[str | None, str | None, Any]:
    """``(kind, why not, module)``: how a layer's attention is blocked, or why it is not."""
    from transformer_lens.model_bridge.generalized_components import attention, bloom_attention
    from transformer_lens.model_bridge.generalized_components import (
        joint_qkv_attention as joint,
    )
    from transformer_lens.model_bridge.generalized_components import (
        joint_qkv_position_embeddings_attention as joint_rotary,
    )
    from transformer_lens.model_bridge.generalized_components import (
        position_embeddings_attention as rotary,
    )
    from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoSelfAttention

    cls, cfg = type(attn), attn.config
    if getattr(attn, "compatibility_mode", False):
        return None, "the bridge runs in compatibility mode", None
    flags = [f for f in _UNSUPPORTED_FLAGS if getattr(cfg, f, False)]
    if flags:
        return None, f"the bridge's {', '.join(flags)} variant of attention", None
    if cls is rotary.PositionEmbeddingsAttentionBridge:
        why = _rotary_refusal(attn)
        return (None, why, None) if why else ("rotary", None, attn)
    known = {joint.JointQKVAttentionBridge: "joint",
             joint_rotary.JointQKVPositionEmbeddingsAttentionBridge: "joint_rotary",
             bloom_attention.BloomAttentionBridge: "bloom"}
    if cls in known:
        return known[cls], None, attn
    if cls is attention.AttentionBridge and not attn.requires_relative_position_bias:
        found = [m for m in attn.original_component.modules() if _uses_interface(m)]
        if len(found) == 1:
            return "interface", None, found[0]
        neo = [m for m in attn.original_component.modules() if type(m) is GPTNeoSelfAttention]
        if len(neo) == 1:
            return "gpt_neo", None, neo[0]
    return None, f"{cls.__name__} over {type(attn.original_component).__name__}", None


def support(model: Model) -> str | None:
    """Why ``model``'s attention cannot be blocked, or ``None`` when it can (every layer)."""
    for layer, block in enumerate(model.bridge.blocks):
        kind, why, _ = _kind(block.attn)
        if kind is None:
            return f"layer {layer}: {why}"
    return None


def scores_support(model: Model) -> str | None:
    """Why a layer's scores are not :class:`ScoreInputs` alone (``scale * q . k``,
    soft-capped, under a mask), or ``None`` when every layer's are."""
    for layer, block in enumerate(model.bridge.blocks):
        kind, why, _ = _kind(block.attn)
        if kind is None:
            return f"layer {layer}: {why}"
    return None


FUSED_KINDS = ("rotary", "joint", "joint_rotary")
"""The blocked bridges whose attention the fused kernel computes as it is (scale, soft-cap,
grouped-query heads, a causal, sliding or padded mask): not BLOOM's ALiBi, GPT-Neo's
unscaled float32 step, nor a Hugging Face module's own attention function."""


def fused_support(model: Model) -> str | None:
    """Why the fused kernel (:mod:`workbench.models.fused`) cannot compute ``model``'s
    attention, or ``None`` when it can, every layer (its device and dtype included)."""
    from workbench.models import fused

    why = support(model)
    if why is not None:
        return why
    param = next(model.bridge.parameters())
    for layer, block in enumerate(model.bridge.blocks):
        kind, _, _ = _kind(block.attn)
        if kind not in FUSED_KINDS:
            return f"layer {layer}: the kernel does not compute {kind} attention"
        why = fused.support(param.device, param.dtype, model.info.d_head)
        if why is not None:
            return f"layer {layer}: {why}"
    return None


def _install(kind: str, attn: Any, module: Any, plan: _Layer) -> Callable[[], object]:
    """Swap one layer's attention for its blocked form; returns what undoes it."""
    if kind == "interface":
        _INTERFACE_LAYERS[module] = plan
        return partial(_INTERFACE_LAYERS.pop, module, None)
    name, fn = {"rotary": ("forward", partial(_rotary_forward, attn, plan)),
                "joint": ("_reconstruct_attention", partial(_joint_reconstruct, attn, plan, False)),
                "joint_rotary": ("_reconstruct_attention",
                                 partial(_joint_reconstruct, attn, plan, True)),
                "bloom": ("_reconstruct_attention", partial(_bloom_reconstruct, attn, plan)),
                "gpt_neo": ("_attn", partial(_gpt_neo_attn, module, plan))}[kind]
    # set in the instance's own __dict__: the bridge forwards other attribute writes to
    # the module it wraps
    vars(module)[name] = fn
    return partial(vars(module).pop, name, None)


_PASSES: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_PASSES_LOCK = threading.Lock()


def _lock_of(module: Any) -> threading.RLock:
    """The lock of one Hugging Face model: :func:`blocked` swaps its attention and its
    config's attention implementation, so two threads may not do it at once (the second
    would save the first's swap as the original, and leave it in place when both end)."""
    with _PASSES_LOCK:
        if module not in _PASSES:
            _PASSES[module] = threading.RLock()
        return _PASSES[module]


@contextlib.contextmanager
def blocked(model: Model, consume: PatternConsumer | None = None, *, block: int | None = None,
            block_bytes: int = BLOCK_BYTES, layers: Collection[int] | None = None,
            scores: ScoreConsumer | None = None,
            fused: FusedAttention | None = None) -> Iterator[None]:
    """Run every forward pass of ``model`` inside the block with blocked attention.

    Args:
        model: the model (every layer's attention must be supported: :func:`support`).
        consume: called with every :class:`PatternBlock` of the layers in ``layers``.
        block: query rows per block (default: from ``block_bytes``, see
            :func:`rows_per_block`).
        block_bytes: the size of one block's float32 scores.
        layers: the layers whose blocks are handed over (default every layer); the others
            are blocked too, and hand nothing over.
        scores: called with the :class:`ScoreInputs` of each layer in ``layers``, before
            its blocks (a family whose scores they cannot describe: :func:`scores_support`).
        fused: called in place of the blocks of each layer in ``layers`` whose bridge is
            one of :data:`FUSED_KINDS` (outside training): the layer's output, or ``None``
            to keep its blocks (:func:`fused_support` says whether the kernel serves the model).

    The block holds the model's lock: another thread's :func:`blocked` on the same weights
    waits until it ends (a plain pass of the model in another thread meanwhile would run
    blocked: drive one model from one thread at a time).

    Raises:
        ModelCapabilityError: a layer whose attention cannot be blocked (the message says why).
        WorkbenchError: a hook on ``hook_pattern`` or ``hook_attn_scores`` during a pass.
    """
    why = support(model)
    if why is not None:
        raise ModelCapabilityError(f"{model.info.name}: blocked attention does not apply ({why})")
    why = scores_support(model) if scores is not None else None
    if why is not None:
        raise ModelCapabilityError(f"{model.info.name}: its attention scores are not a function "
                                   f"of stored queries and keys ({why})")
    if block is not None and (not isinstance(block, int) or block < 1):
        raise WorkbenchError(f"block must be a positive number of query rows, got {block!r}")
    _register()
    config = model.bridge.original_model.config
    with _lock_of(model.bridge.original_model):
        saved, undo = config._attn_implementation, []
        try:
            for layer, stack in enumerate(model.bridge.blocks):
                kind, _, module = _kind(stack.attn)
                wanted = layers is None or layer in layers
                plan = _Layer(layer, consume if wanted else None, block, block_bytes,
                              scores if wanted else None,
                              fused if wanted and kind in FUSED_KINDS else None)
                undo.append(_install(str(kind), stack.attn, module, plan))
            config._attn_implementation = IMPLEMENTATION
            yield
        finally:
            config._attn_implementation = saved
            for step in undo:
                step()
