"""Every per-head statistic of attention patterns, as pattern reductions.

Each function maps one layer's weights ``A[batch, head, query, key]`` and a
:class:`~workbench.recording.reductions.PatternContext` to one score per prompt and head,
averaged over the queries for which the score is defined (a score with no such query is
NaN for that prompt). Padded queries and keys are never counted. Run them over prompts
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

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from workbench.recording.reductions import PatternContext


def masked_query_mean(values: Float[Tensor, "batch head_index query_pos"],
                      mask: Bool[Tensor, "batch query_pos"]) -> Float[Tensor, "batch head_index"]:
    """Mean over the queries where ``mask`` is true (NaN for a prompt with none)."""
    mask_f = mask[:, None, :].to(values.dtype)
    total = (values * mask_f).sum(-1)
    count = mask_f.sum(-1)
    return total / count.where(count > 0, torch.full_like(count, float("nan")))


def entropy(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
            ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Mean entropy (nats) of each query's attention distribution (Clark et al. 2019)."""
    p = pattern.float()
    h = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return masked_query_mean(h, ctx.query_mask)


def normalized_entropy(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                       ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Entropy divided by its maximum, log(number of keys the query can see).

    1 means uniform over the visible keys, 0 means all weight on one key. Queries that see
    a single key (the first position of a causal model) are left out.
    """
    p = pattern.float()
    h = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    n_pos = pattern.shape[-1]
    pos = torch.arange(n_pos)
    visible = (pos + 1)[None, :].expand(len(ctx.lengths), -1) if ctx.causal else \
        ctx.lengths[:, None].expand(-1, n_pos)
    mask = ctx.query_mask & (visible > 1)
    return masked_query_mean(h / visible.clamp_min(2).log()[:, None, :], mask)


def mean_distance(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                  ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Expected |query - key| distance in tokens under the attention weights."""
    n_pos = pattern.shape[-1]
    pos = torch.arange(n_pos, dtype=torch.float32)
    dist = (pos[:, None] - pos[None, :]).abs()
    return masked_query_mean((pattern.float() * dist).sum(-1), ctx.query_mask)


def self_attention(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                   ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Mean weight a token puts on itself."""
    diag = pattern.float().diagonal(dim1=-2, dim2=-1)
    return masked_query_mean(diag, ctx.query_mask)


def _valid_pairs(ctx: PatternContext) -> Bool[Tensor, "batch query key"]:
    return ctx.query_mask[:, :, None] & ctx.query_mask[:, None, :]


def earlier_occurrences(ctx: PatternContext) -> Bool[Tensor, "batch query key"]:
    """``[b, i, j]`` is true when token ``j < i`` equals token ``i`` (both real tokens)."""
    ids = ctx.input_ids
    n = ids.shape[1]
    same = ids[:, :, None] == ids[:, None, :]
    earlier = torch.ones(n, n, dtype=torch.bool).tril(-1)
    return same & earlier & _valid_pairs(ctx)


def induction_targets(ctx: PatternContext) -> Bool[Tensor, "batch query key"]:
    """``[b, i, k]`` is true when ``k - 1`` is an earlier occurrence of token ``i``."""
    dup = earlier_occurrences(ctx)
    targets = torch.zeros_like(dup)
    targets[:, :, 1:] = dup[:, :, :-1]  # shift one to the right: column 0 stays false
    return targets


def _weight_on(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
               targets: Bool[Tensor, "batch query key"]) -> Float[Tensor, "batch head_index query"]:
    return (pattern.float() * targets[:, None].float()).sum(-1)


def previous_token(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                   ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Mean weight from each query to the position just before it."""
    values = pattern.float().diagonal(offset=-1, dim1=-2, dim2=-1)  # [B, H, T-1], query i+1
    return masked_query_mean(values, ctx.query_mask[:, 1:])


def next_token(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
               ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Mean weight from each query to the position just after it (encoders)."""
    values = pattern.float().diagonal(offset=1, dim1=-2, dim2=-1)  # [B, H, T-1], query i
    has_next = ctx.query_mask[:, 1:]  # query i has a real successor when i + 1 is real
    return masked_query_mean(values, has_next)


def duplicate_token(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                    ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Weight on earlier occurrences of the query's own token."""
    dup = earlier_occurrences(ctx)
    return masked_query_mean(_weight_on(pattern, dup), dup.any(-1))


def second_repeat_targets(ctx: PatternContext) -> Bool[Tensor, "batch query key"]:
    """``[b, i, k]`` is true when token ``i`` occurred exactly once before, at ``k - 1``
    (the second-repeat targets of Olsson et al.'s prefix-matching score)."""
    once = earlier_occurrences(ctx).sum(-1) == 1  # [B, Q]
    return induction_targets(ctx) & once[:, :, None]


def induction(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
              ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Olsson et al.'s prefix-matching score: over queries whose token occurred exactly
    once before, at ``j``, the weight on ``j + 1`` (the second repeat of
    ``repeated-random`` prompts, however many repeats they have)."""
    targets = second_repeat_targets(ctx)
    return masked_query_mean(_weight_on(pattern, targets), targets.any(-1))


def induction_pooled(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                     ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Over every query with an earlier occurrence, the total weight on the tokens that
    followed all its earlier occurrences."""
    targets = induction_targets(ctx)
    return masked_query_mean(_weight_on(pattern, targets), targets.any(-1))


def induction_stripe_sum(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                         ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """The unnormalised induction stripe: total stripe weight divided by all ``T`` queries
    (TransformerLens' 'mul' induction score)."""
    return masked_query_mean(_weight_on(pattern, induction_targets(ctx)), ctx.query_mask)


def first_token(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """alpha_1: mean weight on position 0 over all queries."""
    return masked_query_mean(pattern.float()[..., 0], ctx.query_mask)


def received(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
             ctx: PatternContext) -> Float[Tensor, "batch head_index key_pos"]:
    """The weight each key receives: ``r_j = (1/T) sum_t A[t, j]`` over the ``T`` real
    queries (Gu et al. 2024's alpha for every key, so ``r_0`` is :func:`first_token`).

    Returns:
        ``r`` for every key; padded keys receive 0, and the real keys' ``r`` of a head
        sum to 1 (each real query's weights do).
    """
    weights = ctx.query_mask[:, None, :, None].to(torch.float32)
    return (pattern.float() * weights).sum(-2) / ctx.lengths[:, None, None].float()


def received_by(r: Float[Tensor, "batch head_index key_pos"],
                keys: Bool[Tensor, "batch key_pos"]) -> Float[Tensor, "batch head_index"]:
    """The share of attention received by the keys where ``keys`` is true: the sum of
    :func:`received` over them (e.g. over every [SEP], or every punctuation token)."""
    return (r * keys[:, None, :]).sum(-1)
