"""A small, readable reference implementation of scaled dot-product attention.

One head of attention (Vaswani et al. 2017, "Attention Is All You Need", section 3.2.1)::

    Q = X W_Q,  K = X W_K,  V = X W_V
    S = Q K^T                                 raw scores        [query, key]
    A = softmax_rows(S / sqrt(d_k) + M)       weights           [query, key]
    O = A V                                   output            [query, d_v]

``M`` is 0 where a query may see a key and minus infinity where it may not; here a mask is
a boolean ``[query, key]`` tensor (``True`` = may attend) and masked entries are simply
left out of the softmax. A query that may see no key at all has no distribution to put
weight on: :func:`masked_softmax` raises :class:`FullyMaskedRowError` for it instead of
returning the ``0 / 0 = NaN`` row that a naive ``-inf`` mask produces.

Everything works on leading batch dimensions too (``*batch query key``), so the same
functions check a bridge's attention head by head. :func:`worked_example` lays out the
four-token example of the ``permutation-equivariance`` experiment step by step, for the
tests and the dashboard.

Examples:
    >>> ex = worked_example()
    >>> ex.scores[3].tolist()                  # raw scores of "hungry"
    [6.0, 11.0, 6.0, 10.0]
    >>> [round(w, 4) for w in ex.weights[3].tolist()]
    [0.0333, 0.5978, 0.0333, 0.3356]
    >>> out = attention(ex.q, ex.k, ex.v, causal_mask(4))
    >>> out.output[0].tolist()                 # the first causal row is V's first row
    [3.0, 1.0, 3.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from workbench.core.errors import WorkbenchError


class FullyMaskedRowError(WorkbenchError, ValueError):
    """A query row whose mask hides every key: its softmax would be 0/0 (NaN)."""


def attention_scores(q: Float[Tensor, "*batch query d_k"], k: Float[Tensor, "*batch key d_k"]
                     ) -> Float[Tensor, "*batch query key"]:
    """Raw scores ``S = Q K^T`` (not yet scaled by ``1 / sqrt(d_k)``)."""
    return q @ k.transpose(-2, -1)


def causal_mask(n_query: int, n_key: int | None = None) -> Bool[Tensor, "query key"]:
    """``True`` where query ``i`` may see key ``j``: ``j <= i`` (lower triangle).

    With more keys than queries (a cached prefix) the queries are the last ``n_query``
    positions, so query ``i`` sees keys ``0 .. i + n_key - n_query``.
    """
    n_key = n_query if n_key is None else n_key
    if n_query < 1 or n_key < n_query:
        raise ValueError(f"need 1 <= n_query <= n_key, got {n_query} and {n_key}")
    return torch.ones(n_query, n_key, dtype=torch.bool).tril(diagonal=n_key - n_query)


def sliding_window_mask(n: int, window: int) -> Bool[Tensor, "query key"]:
    """``True`` where query ``i`` may see key ``j`` through a sliding window of ``window``
    keys, its own included: ``i - window < j <= i`` (a band under the diagonal)."""
    if window < 1:
        raise ValueError(f"need a window of at least 1 key, got {window}")
    return causal_mask(n) & ~torch.ones(n, n, dtype=torch.bool).tril(diagonal=-window)


def full_mask(n_query: int, n_key: int | None = None) -> Bool[Tensor, "query key"]:
    """Every query sees every key (bidirectional attention, "no mask")."""
    return torch.ones(n_query, n_query if n_key is None else n_key, dtype=torch.bool)


def additive_mask(mask: Bool[Tensor, "*batch query key"], dtype: torch.dtype = torch.float32
                  ) -> Float[Tensor, "*batch query key"]:
    """The same mask as the additive form Hugging Face's eager attention adds to scores:
    0 where allowed and the dtype's most negative finite number elsewhere."""
    zero = torch.zeros((), dtype=dtype)
    return torch.where(mask, zero, torch.tensor(torch.finfo(dtype).min, dtype=dtype))


def masked_softmax(scores: Float[Tensor, "*batch query key"],
                   mask: Bool[Tensor, "*batch query key"] | None = None
                   ) -> Float[Tensor, "*batch query key"]:
    """Softmax over keys, counting only the keys a query may see.

    Masked weights are exactly 0, every visible weight is positive, and each row sums to 1.

    Raises:
        FullyMaskedRowError: some query may see no key (the error lists which).
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    mask = mask.expand_as(scores)
    empty = ~mask.any(dim=-1)
    if bool(empty.any()):
        rows = [tuple(i) if len(i) > 1 else i[0] for i in empty.nonzero().tolist()][:8]
        raise FullyMaskedRowError(
            f"{int(empty.sum())} query row(s) see no key at all, e.g. {rows}: their attention "
            "weights would be 0/0 (NaN); give every query at least one visible key")
    # subtract the largest *visible* score: exp never overflows and masked keys drop out
    top = scores.masked_fill(~mask, -torch.inf).amax(dim=-1, keepdim=True)
    exp = torch.exp(scores - top).masked_fill(~mask, 0.0)
    return exp / exp.sum(dim=-1, keepdim=True)


@dataclass(frozen=True)
class AttentionOutput:
    """Every intermediate of one call of :func:`attention`."""

    scores: Float[Tensor, "*batch query key"]
    """raw ``Q K^T``"""
    scaled: Float[Tensor, "*batch query key"]
    """``Q K^T / sqrt(d_k)``"""
    weights: Float[Tensor, "*batch query key"]
    output: Float[Tensor, "*batch query d_v"]


def attention(q: Float[Tensor, "*batch query d_k"], k: Float[Tensor, "*batch key d_k"],
              v: Float[Tensor, "*batch key d_v"],
              mask: Bool[Tensor, "*batch query key"] | None = None) -> AttentionOutput:
    """Scaled dot-product attention ``softmax(Q K^T / sqrt(d_k), mask) V``.

    Args:
        q, k, v: queries, keys and values (``d_k`` is ``q``'s last dimension).
        mask: ``True`` where a query may see a key; ``None`` lets every query see every key.

    Raises:
        FullyMaskedRowError: a query row that may see no key.
    """
    scores = attention_scores(q, k)
    scaled = scores / math.sqrt(q.shape[-1])
    weights = masked_softmax(scaled, mask)
    return AttentionOutput(scores=scores, scaled=scaled, weights=weights, output=weights @ v)


def permutation_matrix(perm: Int[Tensor, " n"] | list[int],
                       dtype: torch.dtype = torch.float64) -> Float[Tensor, "n n"]:
    """``P`` with ``(P X)[i] = X[perm[i]]``: row ``i`` of ``P`` is one-hot at ``perm[i]``."""
    perm = torch.as_tensor(perm)
    return torch.eye(len(perm), dtype=dtype)[perm]


def inverse_permutation(perm: Int[Tensor, " n"]) -> Int[Tensor, " n"]:
    """``inv`` with ``x[perm][inv] == x``."""
    return torch.argsort(perm)


# ---- the worked four-token example -------------------------------------------------------

EXAMPLE_TOKENS = ("the", "cat", "was", "hungry")
EXAMPLE_X = ((1, 0, 1, 0), (0, 1, 0, 1), (1, 1, 0, 0), (0, 1, 1, 0))
EXAMPLE_W_Q = ((1, 0, 0), (1, 1, 2), (0, 1, 0), (1, 1, 0))
EXAMPLE_W_K = ((1, 0, 0), (1, 0, 2), (1, 1, 1), (0, 1, 2))
EXAMPLE_W_V = ((2, 0, 1), (0, 2, 0), (1, 1, 2), (0, 1, 1))
EXAMPLE_SHUFFLE = (3, 1, 0, 2)  # (hungry, cat, the, was)


@dataclass(frozen=True)
class WorkedExample:
    """The four-token example, every step computed in float64 by :func:`attention`."""

    tokens: tuple[str, ...]
    x: Float[Tensor, "pos d_model"]
    w_q: Float[Tensor, "d_model d_k"]
    w_k: Float[Tensor, "d_model d_k"]
    w_v: Float[Tensor, "d_model d_v"]
    q: Float[Tensor, "pos d_k"]
    k: Float[Tensor, "pos d_k"]
    v: Float[Tensor, "pos d_v"]
    scores: Float[Tensor, "query key"]
    scaled: Float[Tensor, "query key"]
    weights: Float[Tensor, "query key"]
    output: Float[Tensor, "query d_v"]
    causal_weights: Float[Tensor, "query key"]
    causal_output: Float[Tensor, "query d_v"]
    shuffle: tuple[int, ...]
    shuffled_tokens: tuple[str, ...]
    shuffled_output: Float[Tensor, "query d_v"]
    """the unmasked output of the shuffled input ``P X``; equals ``P O``"""


def worked_example() -> WorkedExample:
    """"the cat was hungry" with the published X, W_Q, W_K, W_V and d_k = 3."""

    def t(rows: tuple[tuple[int, ...], ...]) -> Tensor:
        return torch.tensor(rows, dtype=torch.float64)

    x, w_q, w_k, w_v = t(EXAMPLE_X), t(EXAMPLE_W_Q), t(EXAMPLE_W_K), t(EXAMPLE_W_V)
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    plain = attention(q, k, v)
    causal = attention(q, k, v, causal_mask(len(x)))
    px = permutation_matrix(list(EXAMPLE_SHUFFLE)) @ x
    shuffled = attention(px @ w_q, px @ w_k, px @ w_v)
    return WorkedExample(
        tokens=EXAMPLE_TOKENS, x=x, w_q=w_q, w_k=w_k, w_v=w_v, q=q, k=k, v=v,
        scores=plain.scores, scaled=plain.scaled, weights=plain.weights, output=plain.output,
        causal_weights=causal.weights, causal_output=causal.output,
        shuffle=EXAMPLE_SHUFFLE, shuffled_tokens=tuple(EXAMPLE_TOKENS[i] for i in EXAMPLE_SHUFFLE),
        shuffled_output=shuffled.output,
    )


# ---- comparing outputs -------------------------------------------------------------------

def relative_error(after: Float[Tensor, "*batch pos d"], before: Float[Tensor, "*batch pos d"],
                   scale_of: Float[Tensor, "*batch pos d"], positions: slice = slice(None)
                   ) -> float:
    """``max |after - before| / max |scale_of|``, over the positions (dim -2) selected.

    The error measure of an equivariance check ``f(P X)`` against ``P f(X)``: the largest
    difference relative to the largest output, computed in float64 so that the measure
    adds no rounding of its own. ``scale_of`` is read over every position, so a check on
    a few positions is still relative to the whole output.

    Args:
        after, before: the two outputs compared (same shape).
        scale_of: the output whose largest entry sets the scale (usually ``before``).
        positions: the positions compared (e.g. ``slice(i, None)``: from ``i`` on).

    Returns:
        The relative error (0 when equal; an all-zero ``scale_of`` counts as 1e-30).
    """
    diff = (after[..., positions, :].double() - before[..., positions, :].double()).abs().max()
    return float(diff / scale_of.double().abs().max().clamp_min(1e-30))
