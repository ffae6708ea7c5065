"""Why a head attends where it does: its attention scores split exactly over upstream components.

For head ``h`` of layer ``L`` the pre-softmax score of query position ``i`` on key ``j`` is
a bilinear form of the two positions' residual streams after the layer's input norm::

    score(i, j) = < R_i (W_Q n_i + b_Q),  R_j (W_K n_j + b_K) > / sqrt(d_head)

where ``n_t`` is the normalised residual stream at ``t`` and ``R_t`` the rotary rotation at
``t`` (the identity without rotary). The stream before layer ``L`` is a sum of upstream
outputs: the embeddings (token plus learned positions, if any: ``blocks.0.hook_resid_pre``),
every earlier head's output ``z_h W_O^h``, every earlier attention output bias and every
earlier MLP's output. With the norm's per-position scale frozen at its value on the input
(:mod:`workbench.models.norms`; the scales are recorded), the norm is linear in that sum::

    RMSNorm:    n_t = sum_c c_t / s_t * w                       (s_t = sqrt(mean x_t^2 + eps))
    LayerNorm:  n_t = sum_c (c_t - mean(c_t)) / s_t * w  +  b

A per-head query or key norm (Gemma 3, Qwen 3: RMSNorm over each head's ``d_head`` between
the projection and rotary) is frozen the same way, at its scale ``s_q`` (``s_k``) of the real
query (key) at each position (``attn.q_norm.hook_scale``), so ``q = R (g * (W_Q n + b_Q) /
s_q)`` is linear in the components too (:class:`workbench.models.norms.HeadNorm`).

``R_t`` is linear and applied after the projection, so the score splits *exactly*:

- **key side**: ``score = sum_c < q_i, k_j^(c) >`` with the real query ``q_i`` whole and
  ``k_j^(c) = R_j W_K n_j^(c)`` the part of the key written by component ``c`` (the key
  bias and the norm bias are components of their own);
- **query side**: the same with the roles swapped, ``sum_c < q_i^(c), k_j >``;
- **pairs**: ``score = sum_{a, b} < q_i^(a), k_j^(b) >``, reported for the top components
  of each side plus an ``other`` row and column, so every matrix still sums to the score.

Assumptions, each checked: a pre-norm block (the attention reads ``ln1`` of the residual
stream, :func:`require_pre_norm` refuses post-norm encoders such as BERT before any run is
made); rotary in the rotate-half convention of Llama (the sum is compared with the model's
own ``hook_attn_scores`` for every pair, :attr:`HeadAttribution.error`). With grouped-query
attention the key side is the head's key-value group: ``k`` is shared by every query head
of the group (:attr:`HeadAttribution.kv_group`).

Memory: one forward pass per prompt that keeps only what the split reads (never the whole
cache) and stops after the deepest chosen layer's pattern; each head's output ``z W_O`` is
formed afterwards, at the positions some pair needs only.

Examples:
    >>> pairs = pair_positions(ids, "induction")                # doctest: +SKIP
    >>> [head] = attribute_prompt(model, ids, [(5, 1)], pairs)  # doctest: +SKIP
    >>> head.key.sum(0) - head.score                            # doctest: +SKIP
    array([ 1.2e-07, ...])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.inputs.batching import Batch
from workbench.inputs.prompts import Prompt
from workbench.models import adapters
from workbench.models.base import Model
from workbench.models.norms import (
    HeadNorm,
    LinearNorm,
    first_norm,
    head_norm,
    normalise,
)
from workbench.recording import hooks
from workbench.scores.components import part_hooks, stream_parts

Head = tuple[int, int]
PositionRule = Literal["induction", "previous", "first"]
"""Which key each query is explained on: the token after the query token's one earlier
occurrence (induction, Olsson et al.'s second repeat), the previous token, or the first."""
OTHER = "other"


# ---- which positions -----------------------------------------------------------------------

def pair_positions(ids: Sequence[int], rule: PositionRule) -> list[tuple[int, int]]:
    """The ``(query, key)`` positions a head is explained on, by ``rule``.

    Args:
        ids: one prompt's token ids (with its BOS).
        rule: ``induction``: each query whose token occurred exactly once before, at ``j``,
            with key ``j + 1`` (the second repeat of ``repeated-random`` prompts, as
            :func:`workbench.scores.patterns.induction` scores it); ``previous``: every
            query ``i >= 1`` with key ``i - 1``; ``first``: every query ``i >= 1`` with key 0.

    Returns:
        ``(query, key)`` pairs in query order (empty when the rule finds none).
    """
    if rule == "previous":
        return [(i, i - 1) for i in range(1, len(ids))]
    if rule == "first":
        return [(i, 0) for i in range(1, len(ids))]
    if rule != "induction":
        raise WorkbenchError(f"unknown position rule {rule!r}; known: induction, previous, first")
    pairs = []
    for i, token in enumerate(ids):
        earlier = [j for j in range(i) if ids[j] == token]
        if len(earlier) == 1:
            pairs.append((i, earlier[0] + 1))
    return pairs


# ---- the model must be pre-norm ------------------------------------------------------------

def require_pre_norm(model: Model) -> None:
    """Refuse, with the reason, a model whose attention does not read ``ln1(residual)``.

    Checked on a two-token forward pass: in a pre-norm block the first norm's input is the
    residual stream entering the block and its output is the attention's input. In a
    post-norm block (BERT) the first norm acts on attention output plus residual, after
    attention, so a layer's queries and keys read a stream normalised once per earlier
    sublayer, which no single frozen scale per position linearises.

    Raises:
        ModelCapabilityError: the model is post-norm, or has no first norm at all.
    """
    names = ["blocks.0.hook_resid_pre", "blocks.0.ln1.hook_in", "blocks.0.ln1.hook_out",
             "blocks.0.attn.hook_in"]
    if any(name not in model.bridge.hook_dict for name in names):
        raise ModelCapabilityError(
            f"QK attribution needs a pre-norm block with a first norm (ln1); {model.info.name}"
            " has none")
    ids = [model.info.bos_token_id or 0, model.pad_id]
    batch = model.batches([ids_prompt(ids)])[0]
    # a post-norm block's ln1 comes after its attention: stopped there, it has not fired
    seen = hooks.capture(model, batch, names, stop_after="blocks.0.attn.hook_in")
    pre_norm = (len(seen) == len(names)
                and torch.allclose(seen[names[0]], seen[names[1]])
                and torch.allclose(seen[names[2]], seen[names[3]]))
    if not pre_norm:
        raise ModelCapabilityError(
            f"QK attribution needs a pre-norm model; {model.info.name} is post-norm (its "
            "first norm acts after attention, so no frozen per-position scale linearises "
            "the stream its queries and keys read)")


PROBE_TOLERANCE = 1e-3
"""How far (relative) the parts may miss the model's own scores on the probe before the
model is refused: float32 round-off is about 1e-6; anything the linearisation leaves out
is far larger."""


def require_linearisable(model: Model) -> None:
    """Refuse, with the reason, a model whose scores this method cannot split exactly.

    :func:`require_pre_norm`, then a probe: one head of layer 1 (or 0) on a seven-token
    input must be reproduced by its parts within :data:`PROBE_TOLERANCE`. That catches
    whatever sits between the residual stream and the score without being linear once the
    norm scales are frozen (the first norm's and a per-head query/key norm's: what remains
    is a query/key norm over every head together, ALiBi or relative position biases, a
    score softcap) and any attention layout the hooks cannot read.

    Raises:
        ModelCapabilityError: the model is post-norm, unreadable, or not reproduced.
    """
    require_pre_norm(model)
    cap = getattr(getattr(model.bridge, "cfg", None), "attn_scores_soft_cap", None)
    if cap is not None and cap > 0:  # whatever the probe says: small scores barely bend it
        raise ModelCapabilityError(
            f"QK attribution cannot split {model.info.name}'s scores: they are soft-capped "
            f"({cap:g} tanh(score / {cap:g})), so not linear in the residual stream")
    info = model.info
    family = adapters.FAMILIES_BY_ARCHITECTURE.get(info.architecture)
    if family is not None and family.softcap:
        # small scores pass tanh almost unchanged, so a probe alone may not tell
        raise ModelCapabilityError(
            f"QK attribution cannot split {info.name}'s scores: they are soft-capped "
            "(cap * tanh(score / cap)), which is not linear in the components")
    content = [(7 + 11 * i) % info.d_vocab for i in range(3)]
    ids = [info.bos_token_id or 0, *content, *content]
    layer = min(1, info.n_layers - 1)
    try:
        [att] = attribute_prompt(model, ids, [(layer, info.n_heads - 1)],
                                 pair_positions(ids, "previous"))
    except (WorkbenchError, AttributeError, KeyError, IndexError, RuntimeError, TypeError,
            ValueError) as exc:
        raise ModelCapabilityError(
            f"QK attribution cannot read {info.name}'s attention "
            f"({type(exc).__name__}: {str(exc)[:120]})") from None
    if not att.error <= PROBE_TOLERANCE:
        raise ModelCapabilityError(
            f"QK attribution does not reproduce {info.name}'s scores (the parts miss them by "
            f"{att.error:.1e}, relative): something between its residual stream and its "
            "scores is not linear with the norm scales frozen (query/key norms over every "
            "head together, ALiBi or relative position biases, a softcap)")


def ids_prompt(ids: Sequence[int]) -> Prompt:
    """A pre-tokenized prompt of ``ids``."""
    return Prompt(token_ids=tuple(int(i) for i in ids), label="qk-attribution")


# ---- the result ----------------------------------------------------------------------------

@dataclass
class HeadAttribution:
    """One head's scores on one prompt, split over upstream components (float64).

    ``key[c, n]`` is component ``key_components[c]``'s part of pair ``n``'s score with the
    query whole; ``query[c, n]`` the same for the query side; each sums over components to
    the score. ``pair[a, b, n]`` splits pair ``n``'s score over query component
    ``pair_rows[a]`` and key component ``pair_cols[b]`` (the last row and column are
    ``other``: every remaining component), so it too sums to the score.
    """

    layer: int
    head: int
    kv_group: int
    query_pos: Int[np.ndarray, " pair"]
    key_pos: Int[np.ndarray, " pair"]
    score: Float[np.ndarray, " pair"]
    """the model's own pre-softmax score (``hook_attn_scores``)"""
    key_components: list[str]
    key: Float[np.ndarray, "component pair"]
    query_components: list[str]
    query: Float[np.ndarray, "component pair"]
    pair_rows: list[str]
    pair_cols: list[str]
    pair: Float[np.ndarray, "row col pair"]
    weight: Float[np.ndarray, " pair"]
    """the attention weight on each pair's key (``hook_pattern``)"""
    pattern_rows: dict[int, Float[np.ndarray, " key_pos"]] = field(default_factory=dict)
    """each query position's whole attention row"""

    @property
    def error(self) -> float:
        """``max |sum of key side - score| / max |score|`` over the pairs (0 when exact)."""
        return _relative(self.key.sum(0), self.score)

    @property
    def query_error(self) -> float:
        """The same for the query side."""
        return _relative(self.query.sum(0), self.score)


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    if not len(want):
        return 0.0
    return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))


# ---- capture: one forward pass per prompt --------------------------------------------------

@dataclass
class _Captured:
    """What one prompt's pass gives the split: components at the needed positions only."""

    positions: Tensor
    components: list[tuple[str, int, Tensor]] = field(default_factory=list)
    """``(name, layer it comes from (-1: embeddings), [P, d_model] output)``, in forward order"""
    per_layer: dict[str, Tensor] = field(default_factory=dict)
    """every kept activation of the prompt, by hook name"""


def _capture_names(model: Model, layers: Sequence[int]) -> list[str]:
    """The hook points read: each component feeding ``layers`` and, at the chosen layers,
    the norm scales, rotary tables, real q/k, scores and patterns."""
    names = part_hooks(model, max(layers))
    for layer in sorted(set(layers)):
        names += [hooks.norm_scale(layer), hooks.qkv(layer, "q"), hooks.qkv(layer, "k"),
                  hooks.scores(layer), hooks.pattern(layer)]
        names += [n for n in (f"blocks.{layer}.attn.hook_cos", f"blocks.{layer}.attn.hook_sin",
                              hooks.rotated(layer, "q"), hooks.rotated(layer, "k"),
                              hooks.qk_norm_scale(layer, "q"), hooks.qk_norm_scale(layer, "k"))
                  if n in model.bridge.hook_dict]
    return names


def _components(model: Model, w_o: Tensor, kept: dict[str, Tensor], positions: Tensor,
                deepest: int) -> _Captured:
    """Every component's output at ``positions`` (float64) below layer ``deepest``
    (:func:`workbench.scores.components.stream_parts`)."""
    cap = _Captured(positions, per_layer={name: t[0] for name, t in kept.items()})
    cap.components = [(part.name, part.layer, part.value)
                      for part in stream_parts(model, kept, (0, positions), deepest, w_o=w_o)]
    return cap


# ---- the algebra ---------------------------------------------------------------------------

def _rotate(x: Float[Tensor, "component pos d_head"], cos: Tensor | None, sin: Tensor | None
            ) -> Float[Tensor, "component pos d_head"]:
    """Rotary in Llama's rotate-half convention on the first ``cos.shape[-1]`` dims."""
    if cos is None or sin is None:
        return x
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    half1, half2 = rot[..., : rd // 2], rot[..., rd // 2:]
    rotated = rot * cos + torch.cat([-half2, half1], -1) * sin
    return torch.cat([rotated, rest], -1)


def _side(stack: Tensor, names: list[str], norm: LinearNorm, weight: Tensor, bias: Tensor | None,
          bias_name: str, cos: Tensor | None, sin: Tensor | None,
          head_norm: tuple[Float[Tensor, " pos"], HeadNorm] | None = None
          ) -> tuple[list[str], Float[Tensor, "component pos d_head"]]:
    """Each component's rotated projection ``R W n(c)`` (with the biases as components),
    through the head's own q/k norm with its scale frozen (``head_norm``: the scale at each
    position, and the norm) where the model has one."""
    parts = stack @ weight  # [C, P, d_head]
    names = list(names)
    pieces = [parts]
    if norm.bias is not None:
        pieces.append((norm.bias @ weight).expand(1, stack.shape[1], -1))
        names.append("ln_bias")
    if bias is not None:
        pieces.append(bias.expand(1, stack.shape[1], -1))
        names.append(bias_name)
    projected = torch.cat(pieces)
    if head_norm is not None:
        scale, qk = head_norm
        projected = projected / scale[None, :, None] * qk.weight
    return names, _rotate(projected, cos, sin)


def _frozen_head_norm(model: Model, cap: _Captured, layer: int, which: Literal["q", "k"],
                      index: int) -> tuple[Float[Tensor, " pos"], HeadNorm] | None:
    """The ``which`` norm of ``layer`` with its scale at the captured positions, read from
    the pass (``hook_scale``) for query head or kv head ``index``; ``None`` without one."""
    qk = head_norm(model, layer, which)
    if qk is None:
        return None
    scale = cap.per_layer.get(hooks.qk_norm_scale(layer, which))
    if scale is None:
        raise WorkbenchError(f"{model.info.name}: the bridge never calls "
                             f"{hooks.qk_norm_scale(layer, which)}, which the attribution reads")
    return scale[index, cap.positions, 0].double(), qk


@dataclass(frozen=True)
class Weights:
    """The stacked projections the attribution reads, taken from the bridge once (each of
    its ``W_*`` properties stacks every layer anew)."""

    w_q: Float[Tensor, "layer head_index d_model d_head"]
    w_k: Float[Tensor, "layer kv_head d_model d_head"]
    w_v: Float[Tensor, "layer kv_head d_model d_head"]
    w_o: Float[Tensor, "layer head_index d_head d_model"]

    @classmethod
    def of(cls, model: Model) -> Weights:
        """The model's weights (detached; share one across prompts)."""
        b = model.bridge
        return cls(b.W_Q.detach(), b.W_K.detach(), b.W_V.detach(), b.W_O.detach())


def _head_weights(model: Model, weights: Weights, layer: int, head: int) -> dict[str, Any]:
    info = model.info
    group = head // (info.n_heads // info.n_kv_heads)
    out: dict[str, Any] = {"group": group, "w_q": weights.w_q[layer, head].double(),
                           "w_k": weights.w_k[layer, group].double()}
    attn = model.bridge.blocks[layer].attn
    for side, which, index in (("b_q", "q", head), ("b_k", "k", group)):
        bias = getattr(getattr(attn, which), "bias", None)
        n_out = info.n_heads if which == "q" else info.n_kv_heads
        out[side] = None if bias is None else bias.detach().double().view(n_out, -1)[index]
    module = getattr(attn, "_original_component", attn)
    out["scaling"] = float(getattr(module, "scaling", 1 / math.sqrt(info.d_head)))
    return out


def _attribute_head(model: Model, weights: Weights, cap: _Captured, layer: int, head: int,
                    pairs: Sequence[tuple[int, int]], top: int) -> HeadAttribution:
    """Split one head's scores on ``pairs`` (see the module docstring)."""
    feeding = [(name, t) for name, origin, t in cap.components if origin < layer]
    names = [name for name, _ in feeding]
    stack = torch.stack([t for _, t in feeding])  # [C, P, d_model]
    at = {int(p): i for i, p in enumerate(cap.positions.tolist())}
    qi = torch.tensor([at[q] for q, _ in pairs])
    ki = torch.tensor([at[k] for _, k in pairs])
    fired = cap.per_layer  # what _require_fired finds here
    _require_fired(model, cap, layer)
    scale = fired[hooks.norm_scale(layer)][cap.positions, 0].double()
    cos, sin = (fired.get(f"blocks.{layer}.attn.hook_{n}") for n in ("cos", "sin"))
    cos, sin = (None if t is None else t[cap.positions].double() for t in (cos, sin))
    w = _head_weights(model, weights, layer, head)
    norm = first_norm(model, layer)
    normed = normalise(stack, scale, norm)
    q_names, q_parts = _side(normed, names, norm, w["w_q"], w["b_q"], "q_bias", cos, sin,
                             _frozen_head_norm(model, cap, layer, "q", head))
    k_names, k_parts = _side(normed, names, norm, w["w_k"], w["b_k"], "k_bias", cos, sin,
                             _frozen_head_norm(model, cap, layer, "k", w["group"]))
    q_real = fired[hooks.rotated(layer, "q") if cos is not None else hooks.qkv(layer, "q")]
    k_real = fired[hooks.rotated(layer, "k") if cos is not None else hooks.qkv(layer, "k")]
    q_whole = q_real[cap.positions, head].double()[qi]  # [N, d_head]
    k_whole = k_real[cap.positions, w["group"]].double()[ki]
    s = w["scaling"]
    key = torch.einsum("nd,cnd->cn", q_whole, k_parts[:, ki]) * s
    query = torch.einsum("cnd,nd->cn", q_parts[:, qi], k_whole) * s
    q_pos = torch.tensor([q for q, _ in pairs])
    k_pos = torch.tensor([k for _, k in pairs])
    scores = fired[hooks.scores(layer)][head]
    pattern = fired[hooks.pattern(layer)][head]
    rows, cols, pair = _pair_matrix(q_parts[:, qi], k_parts[:, ki], q_names, k_names,
                                    query, key, top, s)
    return HeadAttribution(
        layer=layer, head=head, kv_group=w["group"], query_pos=q_pos.numpy(),
        key_pos=k_pos.numpy(), score=scores[q_pos, k_pos].double().numpy(),
        key_components=k_names, key=key.numpy(), query_components=q_names,
        query=query.numpy(), pair_rows=rows, pair_cols=cols, pair=pair,
        weight=pattern[q_pos, k_pos].double().numpy(),
        pattern_rows={int(q): pattern[int(q), : int(q) + 1].double().numpy()
                      for q in sorted(set(q_pos.tolist()))})


def _require_fired(model: Model, cap: _Captured, layer: int) -> None:
    """Raise unless the hooks the split reads at ``layer`` fired (on some bridges a hook
    point exists but the attention implementation never calls it)."""
    names = [hooks.norm_scale(layer), hooks.scores(layer), hooks.pattern(layer)]
    rotary = f"blocks.{layer}.attn.hook_cos" in cap.per_layer
    names += [hooks.rotated(layer, w) if rotary else hooks.qkv(layer, w) for w in ("q", "k")]
    missing = [n for n in names if n not in cap.per_layer]
    if missing:
        raise WorkbenchError(f"{model.info.name}: the bridge never calls {', '.join(missing)}, "
                             "which the attribution reads")


def _pair_matrix(q_parts: Tensor, k_parts: Tensor, q_names: list[str], k_names: list[str],
                 query: Tensor, key: Tensor, top: int, scaling: float
                 ) -> tuple[list[str], list[str], np.ndarray]:
    """``[top + 1, top + 1, N]``: the top components of each side (by mean |part| over the
    pairs) and an ``other`` row and column holding every remaining component."""
    rows = query.abs().mean(1).argsort(descending=True)[:top]
    cols = key.abs().mean(1).argsort(descending=True)[:top]

    def grouped(parts: Tensor, keep: Tensor) -> Tensor:
        rest = torch.ones(len(parts), dtype=torch.bool)
        rest[keep] = False
        return torch.cat([parts[keep], parts[rest].sum(0, keepdim=True)])  # [top + 1, N, d]

    qg, kg = grouped(q_parts, rows), grouped(k_parts, cols)
    pair = torch.einsum("and,bnd->abn", qg, kg) * scaling
    return ([q_names[i] for i in rows] + [OTHER], [k_names[i] for i in cols] + [OTHER],
            pair.numpy())


def attribute_prompt(model: Model, ids: Sequence[int], heads: Sequence[Head],
                     pairs: Sequence[tuple[int, int]], *, top: int = 5,
                     weights: Weights | None = None) -> list[HeadAttribution]:
    """Split the chosen heads' scores on one prompt's ``(query, key)`` pairs.

    Args:
        model: a pre-norm model (:func:`require_pre_norm`).
        ids: the prompt's token ids.
        heads: ``(layer, head)`` pairs to explain.
        pairs: ``(query, key)`` positions with ``key <= query`` for causal models
            (:func:`pair_positions`).
        top: components of each side kept in the pair matrix (plus ``other``).
        weights: :meth:`Weights.of` the model, to share across prompts (read if ``None``).

    Returns:
        One :class:`HeadAttribution` per head, in the order given.

    Raises:
        WorkbenchError: no pairs, a position outside the prompt, or an unknown head.
    """
    if not pairs:
        raise WorkbenchError("no (query, key) pairs to attribute on this prompt")
    n = len(ids)
    for q, k in pairs:
        if not (0 <= k < n and 0 <= q < n) or (model.info.causal and k > q):
            raise WorkbenchError(f"pair (query {q}, key {k}) is outside a causal prompt of "
                                 f"{n} tokens")
    info = model.info
    for layer, head in heads:
        if not (0 <= layer < info.n_layers and 0 <= head < info.n_heads):
            raise WorkbenchError(f"head L{layer}H{head} does not exist: {info.name} has "
                                 f"{info.n_layers} layers of {info.n_heads} heads")
        window = info.window(layer)
        far = [(q, k) for q, k in pairs if window is not None and q - k >= window]
        if far:  # masked: no weight, and the model's score there is the mask's, not q . k
            raise WorkbenchError(
                f"pair (query {far[0][0]}, key {far[0][1]}) is beyond the {window}-key "
                f"sliding window of layer {layer} (head L{layer}H{head}): the key is masked, "
                "so there is no score to explain; use shorter sequences or a global layer")
    positions = torch.tensor(sorted({p for pair in pairs for p in pair}))
    layers = [layer for layer, _ in heads]
    batch: Batch = model.batches([ids_prompt(ids)], max_tokens=max(n, 1))[0]
    weights = weights or Weights.of(model)
    with torch.no_grad():
        kept = hooks.capture(model, batch, _capture_names(model, layers),
                             stop_after=hooks.pattern(max(layers)))
        cap = _components(model, weights.w_o, kept, positions, max(layers))
        return [_attribute_head(model, weights, cap, layer, head, pairs, top)
                for layer, head in heads]
