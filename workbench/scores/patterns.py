"""Every per-head statistic of attention patterns, as pattern reductions.

Each function maps one layer's weights ``A[batch, head, query, key]`` and a
:class:`~workbench.recording.reductions.PatternContext` to one score per prompt and head,
averaged over the queries for which the score is defined (a score with no such query is
NaN for that prompt). Padded queries and keys are never counted. Each is a
:class:`~workbench.recording.reductions.BlockReduction`: fed one block of query rows at a
time (the context says which rows, and from which key the block's columns start), it
returns the block's sum and count of its per-query values, so the mean over every query
is the one of the whole pattern, taken once. Run them over prompts
with :func:`workbench.recording.reductions.reduce_patterns`, or with intervals and nulls
with :func:`workbench.scores.heads.score_heads`. A new metric goes here, and is declared
(its meaning, source and scale) in :mod:`workbench.scores.metrics`, under the function's
name: the name every table stores.

Shape of attention (Clark et al. 2019, "What Does BERT Look At?"):

- ``entropy``: mean entropy (nats) of each query's distribution; ``normalized_entropy``
  divides it by log(number of visible keys).
- ``mean_distance``: expected ``|query - key|`` in tokens; ``self_attention``: ``A[i, i]``.

Head kinds (Olsson et al. 2022, "In-context Learning and Induction Heads", and
TransformerLens' ``head_detector``):

- ``previous_token``: mean over queries ``i >= 1`` of ``A[i, i-1]``. TransformerLens'
  'mul' score of the previous-token detection pattern is the same sum divided by all
  ``T`` queries instead of ``T - 1``.
- ``next_token`` (bidirectional models): mean over queries ``i <= T-2`` of ``A[i, i+1]``.
- ``duplicate_token``: over queries whose token occurred earlier, the total weight on
  those earlier occurrences.
- ``induction`` (prefix matching, Olsson et al. 2022; TransformerLens' ``head_detector``):
  over the queries ``i`` whose token occurred exactly once before, at ``j < i``, the
  weight ``A[i, j + 1]`` on the token that followed that occurrence::

      induction = mean_{i in Q1} A[i, j(i) + 1],   Q1 = {i : #{j < i : t_j = t_i} = 1}

  On ``repeated-random`` prompts (``L`` distinct random tokens repeated ``R >= 2`` times)
  ``Q1`` is exactly the second repeat, and ``j(i) + 1 = i - L + 1``: Olsson et al.'s
  score, for any ``R``. TransformerLens' 'mul' score of its induction pattern on a
  two-repeat sequence is the same total divided by all ``T`` queries instead of
  ``|Q1| = L``.
- ``induction_pooled``: over every query with an earlier occurrence, the total weight
  on all the positions that followed its earlier occurrences::

      induction_pooled = mean_{i in Q} sum_{j < i, t_j = t_i} A[i, j + 1],
      Q = {i : exists j < i with t_j = t_i}

  With two repeats of distinct tokens it equals ``induction``; with more repeats it
  also pools the later repeats, whose queries may split their weight over several
  earlier successors (it differs from ``induction`` by up to 0.09 on smollm2 with
  three repeats). Position 0 (BOS) can never be a target of either score.
  ``induction_stripe_sum`` (TransformerLens' 'mul' score, the "unnormalised stripe")
  sums the pooled targets' weight over all queries and divides by ``T``.
- ``first_token``: ``alpha_1 = (1/T) sum_t A[t, 0]``, the mean weight on the first
  position over all queries (Gu et al. 2024, "When Attention Sink Emerges in Language
  Models"; their position 1 is our position 0).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from workbench.recording.fused_scan import target_keys
from workbench.recording.reductions import (
    BlockReduction,
    PatternContext,
    QueryMean,
    query_mean,
)

PerQuery = tuple[Float[Tensor, "batch head_index query_pos"], Bool[Tensor, "batch query_pos"]]
"""A block's value at each query row, and which rows count towards the mean."""


def masked_query_mean(values: Float[Tensor, "batch head_index query_pos"],
                      mask: Bool[Tensor, "batch query_pos"]) -> Float[Tensor, "batch head_index"]:
    """Mean over the queries where ``mask`` is true (NaN for a prompt with none)."""
    return QueryMean.of(values, mask).result()


def _entropy(pattern: Float[Tensor, "batch head_index query_pos key_pos"]
             ) -> Float[Tensor, "batch head_index query_pos"]:
    p = pattern.float()
    # -p log p one head at a time (entr: 0 at p = 0): a head's temporary stays in cache,
    # where a whole block's is the largest allocation of the pass (a bfloat16 scan of 8 x
    # 128 tokens on smollm2: 32 ms against 88 ms). Shared by entropy and normalized_entropy
    # through ctx.shared.
    return torch.stack([torch.special.entr(p[:, h]).sum(-1) for h in range(p.shape[1])], 1)


def weight_at(pattern: Float[Tensor, "batch head_index query_pos key_pos"], ctx: PatternContext,
              offset: int) -> Float[Tensor, "batch head_index query_pos"]:
    """Each query row's weight on the key ``offset`` positions from it (``A[i, i + offset]``;
    0 where that key is outside the block's columns, where every weight is 0)."""
    batch, heads, n_rows, n_keys = pattern.shape
    # row r's key is column r + shift of the block: one diagonal of it (a view, no copy)
    shift = ctx.q0 + offset - ctx.k0
    out = pattern.new_zeros(batch, heads, n_rows, dtype=torch.float32)
    if -n_rows < shift < n_keys:
        diagonal = pattern.diagonal(offset=shift, dim1=-2, dim2=-1)
        first = max(0, -shift)
        out[..., first:first + diagonal.shape[-1]] = diagonal
    return out


@query_mean
def entropy(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
            ctx: PatternContext) -> PerQuery:
    """Mean entropy (nats) of each query's attention distribution (Clark et al. 2019)."""
    return ctx.shared("entropy", pattern, _entropy), ctx.real_queries


@query_mean
def normalized_entropy(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                       ctx: PatternContext) -> PerQuery:
    """Entropy divided by its maximum, log(number of keys the query can see).

    1 means uniform over the visible keys, 0 means all weight on one key. Queries that see
    a single key (the first position of a causal model) are left out.
    """
    n_rows = pattern.shape[-2]
    visible = (ctx.queries + 1)[None, :].expand(len(ctx.lengths), -1) if ctx.causal else \
        ctx.lengths[:, None].expand(-1, n_rows)
    mask = ctx.real_queries & (visible > 1)
    entropy = ctx.shared("entropy", pattern, _entropy)
    return entropy / visible.clamp_min(2).log()[:, None, :], mask


@query_mean
def mean_distance(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                  ctx: PatternContext) -> PerQuery:
    """Expected |query - key| distance in tokens under the attention weights."""
    keys = ctx.keys(pattern.shape[-1])
    dist = (ctx.queries[:, None] - keys[None, :]).abs().float()
    # a row-wise dot product, with no temporary of the block's size
    return torch.einsum("bhqk,qk->bhq", pattern.float(), dist), ctx.real_queries


@query_mean
def self_attention(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                   ctx: PatternContext) -> PerQuery:
    """Mean weight a token puts on itself."""
    return weight_at(pattern, ctx, 0), ctx.real_queries


def earlier_occurrences(ctx: PatternContext) -> Bool[Tensor, "batch query key"]:
    """``[b, i, j]`` is true when token ``j < i`` equals token ``i`` (both real tokens), for
    the context's query rows ``i`` and every key ``j``."""
    ids, queries = ctx.input_ids, ctx.queries
    keys = torch.arange(ctx.n_pos)
    same = ids[:, queries, None] == ids[:, None, :]
    earlier = keys[None, :] < queries[:, None]
    real = ctx.real_queries[:, :, None] & ctx.query_mask[:, None, :]
    return same & earlier & real


def induction_targets(ctx: PatternContext) -> Bool[Tensor, "batch query key"]:
    """``[b, i, k]`` is true when ``k - 1`` is an earlier occurrence of token ``i``."""
    dup = earlier_occurrences(ctx)
    targets = torch.zeros_like(dup)
    targets[:, :, 1:] = dup[:, :, :-1]  # shift one to the right: column 0 stays false
    return targets


def _weight_on(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
               targets: Bool[Tensor, "batch query key"], ctx: PatternContext
               ) -> Float[Tensor, "batch head_index query"]:
    """The weight each row puts on its target keys (those among the block's columns)."""
    inside = targets[:, None, :, ctx.k0:ctx.k0 + pattern.shape[-1]]
    return (pattern.float() * inside.float()).sum(-1)


@query_mean
def previous_token(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                   ctx: PatternContext) -> PerQuery:
    """Mean weight from each query to the position just before it."""
    return weight_at(pattern, ctx, -1), ctx.real_queries & (ctx.queries >= 1)


@query_mean
def next_token(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
               ctx: PatternContext) -> PerQuery:
    """Mean weight from each query to the position just after it (encoders)."""
    after = ctx.queries + 1
    # query i counts when i + 1 is a real token
    has_next = ctx.query_mask[:, after.clamp(max=ctx.n_pos - 1)] & (after < ctx.n_pos)
    return weight_at(pattern, ctx, 1), has_next


@query_mean
def duplicate_token(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                    ctx: PatternContext) -> PerQuery:
    """Weight on earlier occurrences of the query's own token."""
    dup = earlier_occurrences(ctx)
    return _weight_on(pattern, dup, ctx), dup.any(-1)


def second_repeat_targets(ctx: PatternContext) -> Bool[Tensor, "batch query key"]:
    """``[b, i, k]`` is true when token ``i`` occurred exactly once before, at ``k - 1``
    (the second-repeat targets of Olsson et al.'s prefix-matching score)."""
    once = earlier_occurrences(ctx).sum(-1) == 1  # [B, Q]
    return induction_targets(ctx) & once[:, :, None]


@query_mean
def induction(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
              ctx: PatternContext) -> PerQuery:
    """Olsson et al.'s prefix-matching score: over queries whose token occurred exactly
    once before, at ``j``, the weight on ``j + 1`` (the second repeat of
    ``repeated-random`` prompts, however many repeats they have)."""
    targets = second_repeat_targets(ctx)
    return _weight_on(pattern, targets, ctx), targets.any(-1)


@query_mean
def induction_pooled(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                     ctx: PatternContext) -> PerQuery:
    """Over every query with an earlier occurrence, the total weight on the tokens that
    followed all its earlier occurrences."""
    targets = induction_targets(ctx)
    return _weight_on(pattern, targets, ctx), targets.any(-1)


@query_mean
def induction_stripe_sum(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                         ctx: PatternContext) -> PerQuery:
    """The unnormalised induction stripe: total stripe weight divided by all ``T`` queries
    (TransformerLens' 'mul' induction score)."""
    return _weight_on(pattern, induction_targets(ctx), ctx), ctx.real_queries


@query_mean
def first_token(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                ctx: PatternContext) -> PerQuery:
    """alpha_1: mean weight on position 0 over all queries."""
    first = pattern.float()[..., 0]
    return (first if ctx.k0 == 0 else torch.zeros_like(first)), ctx.real_queries


def received(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
             ctx: PatternContext) -> Float[Tensor, "batch head_index key_pos"]:
    """The weight each key receives: ``r_j = (1/T) sum_t A[t, j]`` over the ``T`` real
    queries (Gu et al. 2024's alpha for every key, so ``r_0`` is :func:`first_token`).

    Of a block of rows it is the block's share, over every key of the layer (zero outside
    the block's columns): the shares of a layer's blocks add up to ``r``.

    Returns:
        ``r`` for every key; padded keys receive 0, and the real keys' ``r`` of a head
        sum to 1 (each real query's weights do).
    """
    batch, heads, _, n_keys = pattern.shape
    weights = ctx.real_queries[:, None, :, None].to(torch.float32)
    share = (pattern.float() * weights).sum(-2) / ctx.lengths[:, None, None].float()
    if ctx.k0 == 0 and n_keys == ctx.n_pos:
        return share
    out = share.new_zeros(batch, heads, ctx.n_pos)
    out[..., ctx.k0:ctx.k0 + n_keys] = share
    return out


def received_by(r: Float[Tensor, "batch head_index key_pos"],
                keys: Bool[Tensor, "batch key_pos"]) -> Float[Tensor, "batch head_index"]:
    """The share of attention received by the keys where ``keys`` is true: the sum of
    :func:`received` over them (e.g. over every [SEP], or every punctuation token)."""
    return (r * keys[:, None, :]).sum(-1)


# ---- the same scores from the fused kernel's statistics ---------------------------------
# Each metric that declares statistics (``Metric.statistics`` in workbench.scores.metrics)
# averages its statistic over the very queries its pattern function counts.

def _reads(reduction: BlockReduction, statistic: str,
           counted: Callable[[PatternContext], Bool[Tensor, "batch query_pos"]]) -> None:
    reduction.reads(lambda stats, ctx: QueryMean.of(getattr(stats, statistic), counted(ctx)))


def _real(ctx: PatternContext) -> Bool[Tensor, "batch query_pos"]:
    return ctx.real_queries


_reads(entropy, "entropy", _real)
_reads(mean_distance, "distance", _real)
_reads(first_token, "first", _real)
_reads(previous_token, "previous", lambda ctx: ctx.real_queries & (ctx.queries >= 1))
_reads(induction, "target", lambda ctx: target_keys(ctx) >= 0)
