"""Every attention weight of a layer, rebuilt from its queries, keys and row log-sum-exps.

A layer's weight of head ``h``, query ``i`` on key ``j`` is ``exp(s_hij - lse_hi)``, where
``s_hij = scale * q_hi . k_gj`` (``g = h // (heads / kv_heads)``: grouped-query heads share
a key head), plus ``slope_h * j`` where the family adds ALiBi biases (Bloom), soft-capped as
``cap * tanh(s / cap)`` where the family caps it, and ``lse_hi``
is the log-sum-exp of row ``i``'s scores over the keys it sees (:class:`Mask`). The
queries and keys are taken exactly as the attention computes its scores (after q/k norms
and rotary, :class:`~workbench.models.blocked.ScoreInputs`), so what grows with the prompt
is ``T x d_head`` per head, not ``T x T``; any rectangle of weights, the attention a key
receives and each row's statistics are computed from them, one block of rows at a time.

The queries and keys are stored in the model's compute dtype by default (the values the
softmax saw, so every weight is exact), or rounded to a lower dtype on request
(:data:`STORED_AS`). The log-sum-exps always come from the pass's own values, in float32,
so rounding moves only the scores: :meth:`QKLayer.score_error` bounds how far, and a
weight ``w`` is then off by at most ``w (e^eta - 1)``.

Examples:
    >>> import torch
    >>> q, k = torch.randn(2, 5, 4), torch.randn(1, 5, 4)     # 2 heads share 1 key head
    >>> layer = QKLayer.of(q, k, scale=0.5, softcap=None, mask=Mask(causal=True))
    >>> tile = layer.tile(0)                                     # the whole [5, 5] pattern
    >>> bool(torch.allclose(tile.sum(-1), torch.ones(5))), float(tile[0, 1])
    (True, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from workbench.core.errors import WorkbenchError
from workbench.core.options import Dtype

BLOCK_ELEMENTS = 1 << 22
"""Float32 scores computed at once (16 MiB): rows per block are this over the keys."""
STORED_AS: dict[Dtype, str] = {"float32": "float32", "float16": "float16", "bfloat16": "int16"}
"""The array dtype that holds queries and keys stored in each dtype: bfloat16, which numpy
lacks, as its bit patterns (int16, so that an unwritten chunk reads as +0.0)."""


def from_stored(values: np.ndarray) -> Float[Tensor, "*dims"]:
    """Stored queries or keys (an array of :data:`STORED_AS`, or float32 where float16
    would have overflowed) widened to float32, exactly."""
    tensor = torch.from_numpy(np.ascontiguousarray(values))
    if values.dtype == np.int16:
        tensor = tensor.view(torch.bfloat16)
    return tensor.float()


@dataclass(frozen=True)
class Mask:
    """Which keys each query sees, for one prompt of its own length (no padding).

    Attributes:
        causal: a query sees no later key.
        window: a query ``i`` sees keys ``i - window < j`` only (a sliding-window layer);
            ``None``: no window.
    """

    causal: bool
    window: int | None = None

    def visible(self, rows: slice, keys: slice, length: int) -> Bool[Tensor, "query key"] | None:
        """Which of ``keys`` rows ``rows`` see (``None``: all of them)."""
        window = self.window
        if not self.causal and window is None:
            return None
        i = torch.arange(length)[rows][:, None]
        j = torch.arange(length)[keys][None, :]
        if window is None:
            return j <= i
        later = j > i - window
        return later.logical_and_(j <= i) if self.causal else later

    def key_span(self, rows: slice, length: int) -> slice:
        """The keys that any of ``rows`` (a non-empty step-1 slice) can see: every key
        outside it is hidden from all of them."""
        r0, r1, _ = rows.indices(length)
        k0 = 0 if self.window is None else max(0, r0 - self.window + 1)
        return slice(k0, r1 if self.causal else length)


@dataclass(frozen=True)
class QKLayer:
    """One prompt's queries, keys and row log-sum-exps at one layer.

    Attributes:
        queries: ``[head_index, query_pos, d_head]``.
        keys: ``[kv_head, key_pos, d_head]``.
        lse: ``[head_index, query_pos]``, float32.
        scale: the factor on ``q . k``.
        softcap: the soft-cap, or ``None``.
        mask: which keys each query sees.
        slopes: ALiBi's slope per head (``[head_index]``; head ``h``'s score on key ``j``
            gains ``slopes[h] * j``), or ``None``.
    """

    queries: Float[Tensor, "head_index query_pos d_head"]
    keys: Float[Tensor, "kv_head key_pos d_head"]
    lse: Float[Tensor, "head_index query_pos"]
    scale: float
    softcap: float | None
    mask: Mask
    slopes: Float[Tensor, " head_index"] | None = None

    @classmethod
    def of(cls, queries: Float[Tensor, "head_index query_pos d_head"],
           keys: Float[Tensor, "kv_head key_pos d_head"], *, scale: float,
           softcap: float | None, mask: Mask,
           slopes: Float[Tensor, " head_index"] | None = None) -> QKLayer:
        """The layer of ``queries`` and ``keys``, with each row's log-sum-exp computed from
        them (float32), one block of rows at a time.

        Raises:
            WorkbenchError: shapes that do not fit (the key heads must divide the heads).
        """
        heads, n, d = queries.shape
        if keys.ndim != 3 or keys.shape[1:] != (n, d) or heads % keys.shape[0]:
            raise WorkbenchError(f"queries {tuple(queries.shape)} and keys "
                                 f"{tuple(keys.shape)} do not fit one prompt's layer")
        lse = torch.empty(heads, n, dtype=torch.float32)
        layer = cls(queries, keys, lse, scale, softcap, mask, slopes)
        for r0, r1 in layer.blocks(heads):
            lse[:, r0:r1] = torch.logsumexp(layer.scores(slice(None), slice(r0, r1)), -1)
        return layer

    @property
    def length(self) -> int:
        return self.queries.shape[1]

    @property
    def n_heads(self) -> int:
        return self.queries.shape[0]

    def blocks(self, heads: int = 1) -> list[tuple[int, int]]:
        """Row ranges of at most :data:`BLOCK_ELEMENTS` scores over every key."""
        step = max(1, BLOCK_ELEMENTS // max(1, heads * self.length))
        return [(r0, min(r0 + step, self.length)) for r0 in range(0, self.length, step)]

    def _span(self, part: slice, what: str) -> slice:
        start, stop, stride = part.indices(self.length)
        if stride != 1 or (part.start is not None and not 0 <= part.start < self.length) or (
                part.stop is not None and not 0 < part.stop <= self.length) or start >= stop:
            raise WorkbenchError(f"{what} {part.start}:{part.stop} is not a range of the "
                                 f"prompt's {self.length} positions")
        return slice(start, stop)

    def scores(self, head: int | slice, rows: slice, keys: slice = slice(None)
               ) -> Float[Tensor, "... query key"]:
        """The masked float32 scores of ``head`` (an int, or a slice of heads) for ``rows``
        and ``keys`` (``-inf`` where a row does not see a key)."""
        groups = self.n_heads // self.keys.shape[0]
        if isinstance(head, int):  # views, not copies, of one head's rows and keys
            heads: int | Tensor = head
            q, k = self.queries[head, rows].float(), self.keys[head // groups, keys].float()
        else:
            heads = torch.arange(self.n_heads)[head]
            q = self.queries[heads, rows].float()
            k = self.keys[torch.div(heads, groups, rounding_mode="floor"), keys].float()
        s = torch.matmul(q, k.transpose(-2, -1)).mul_(self.scale)  # in place from here on
        if self.slopes is not None:
            j = torch.arange(self.length, dtype=torch.float32)[keys]
            s.add_(self.slopes.float()[heads][..., None, None] * j)
        if self.softcap is not None:
            s.div_(self.softcap).tanh_().mul_(self.softcap)
        seen = self.mask.visible(rows, keys, self.length)
        return s if seen is None else s.masked_fill_(~seen, float("-inf"))

    def score_at(self, rows: Int[Tensor, " query"], keys: Int[Tensor, "head_index query"]
                 ) -> Float[Tensor, "head_index query"]:
        """Each head's score of query ``rows[i]`` on key ``keys[h, i]`` (unmasked: the key
        must be one the row sees), one dot product each."""
        groups = self.n_heads // self.keys.shape[0]
        kv = torch.div(torch.arange(self.n_heads), groups, rounding_mode="floor")
        q = self.queries[:, rows].float()                          # [head, query, d_head]
        k = self.keys.float()[kv[:, None], keys]                   # [head, query, d_head]
        s = (q * k).sum(-1) * self.scale
        if self.slopes is not None:
            s = s + self.slopes.float()[:, None] * keys
        return s if self.softcap is None else torch.tanh(s / self.softcap) * self.softcap

    def score_error(self, eps: float) -> Float[Tensor, "head_index query_pos"]:
        """The most each row's scores move when the queries and keys are rounded with a
        relative error of at most ``eps`` each (a format's machine epsilon,
        :data:`workbench.models.fused.HALF_EPSILON`): ``eta_hi``, the largest over the keys
        row ``i`` sees of ``(2 eps + eps^2) scale sum_d |q_hid k_gjd|``.

        Rounding makes ``q~ = q (1 + a)`` and ``k~ = k (1 + b)`` elementwise with ``|a|,
        |b| <= eps``, so ``|q~ k~ - q k| = |q k| |a + b + a b| <= (2 eps + eps^2) |q k|``,
        summed over ``d``; an ALiBi bias is not rounded and a soft-cap is 1-Lipschitz, so
        neither widens it. The stored ``lse`` is the pass's own, so a weight ``w = exp(s -
        lse)`` rebuilt from rounded values is within ``w (e^eta - 1)``, and a row's sum
        within ``e^eta - 1`` of 1. Computed from this layer's own queries and keys (the
        originals; from rounded ones it is low by a factor of at most ``(1 - eps)^2``).
        float16 keeps values under ``2^-14`` (subnormal) to within ``2^-25`` rather than
        ``eps`` of themselves, which this leaves out.
        """
        groups = self.n_heads // self.keys.shape[0]
        kv = torch.div(torch.arange(self.n_heads), groups, rounding_mode="floor")
        k = self.keys.float().abs()[kv]                              # [head, key, d_head]
        out = torch.empty(self.n_heads, self.length, dtype=torch.float32)
        for r0, r1 in self.blocks(self.n_heads):
            q = self.queries[:, r0:r1].float().abs()
            sums = torch.matmul(q, k.transpose(-2, -1))              # [head, query, key]
            seen = self.mask.visible(slice(r0, r1), slice(None), self.length)
            if seen is not None:
                sums = sums.masked_fill(~seen, 0.0)
            out[:, r0:r1] = sums.amax(-1)
        return (2 * eps + eps ** 2) * self.scale * out

    def tile(self, head: int, queries: slice = slice(None), keys: slice = slice(None)
             ) -> Float[Tensor, "query key"]:
        """The exact weights of head ``head`` for ``queries`` x ``keys`` (0 where a query
        does not see a key).

        Raises:
            WorkbenchError: a head, or a range of queries or keys, outside the prompt.
        """
        if not 0 <= head < self.n_heads:
            raise WorkbenchError(f"head {head} is not a head of the layer's {self.n_heads}")
        rows, cols = self._span(queries, "queries"), self._span(keys, "keys")
        return self.scores(head, rows, cols).sub_(self.lse[head, rows, None]).exp_()

    def pooled(self, head: int, queries: slice, keys: slice, factor: int, how: str
               ) -> Float[Tensor, "qcell kcell"]:
        """Head ``head``'s weights over ``queries`` x ``keys`` pooled ``factor`` x
        ``factor`` positions a cell (``max`` or ``sum``; a ragged last cell pools what it
        has), one block of rows at a time over the keys those rows can see
        (:meth:`Mask.key_span`, widened to whole cells): the cells of keys no row of a
        block sees are 0, as every hidden weight is, and are never computed. So a
        causal pattern costs half its rectangle, and a sliding-window layer's the band.

        Raises:
            WorkbenchError: a head, or a range of queries or keys, outside the prompt.
        """
        if not 0 <= head < self.n_heads:
            raise WorkbenchError(f"head {head} is not a head of the layer's {self.n_heads}")
        rows, cols = self._span(queries, "queries"), self._span(keys, "keys")
        k0, k1 = cols.start, cols.stop
        grid = torch.zeros(-(-(rows.stop - rows.start) // factor), -(-(k1 - k0) // factor))
        step = factor * max(1, BLOCK_ELEMENTS // max(1, (k1 - k0) * factor))
        for r0 in range(rows.start, rows.stop, step):
            r1 = min(r0 + step, rows.stop)
            seen = self.mask.key_span(slice(r0, r1), self.length)
            c0 = max(0, seen.start - k0) // factor              # the first and last cells
            c1 = -(-(min(k1, seen.stop) - k0) // factor)        # of keys the rows see
            if c1 <= c0:
                continue
            w = self.tile(head, slice(r0, r1), slice(k0 + c0 * factor,
                                                     min(k1, k0 + c1 * factor)))
            w = torch.nn.functional.pad(w, (0, (c1 - c0) * factor - w.shape[1],
                                            0, -(-w.shape[0] // factor) * factor - w.shape[0]))
            cells = w.view(w.shape[0] // factor, factor, c1 - c0, factor)
            at = (r0 - rows.start) // factor
            grid[at:at + cells.shape[0], c0:c1] = (cells.amax((1, 3)) if how == "max"
                                                  else cells.sum((1, 3)))
        return grid

    def received(self, head: int) -> Float[Tensor, " key"]:
        """The attention each key receives from every query (the pattern's column sums),
        each block of rows over the keys it can see (:meth:`Mask.key_span`)."""
        out = torch.zeros(self.length, dtype=torch.float32)
        for r0, r1 in self.blocks():
            keys = self.mask.key_span(slice(r0, r1), self.length)
            out[keys] += self.tile(head, slice(r0, r1), keys).sum(0)
        return out

    def row_stats(self, head: int) -> dict[str, Float[Tensor, " query"]]:
        """Each query row's entropy (nats), weight on the first key and on the previous key
        (0 for the first query, and where the row does not see it)."""
        entropy = torch.empty(self.length)
        first = torch.zeros(self.length)
        previous = torch.zeros(self.length)
        for r0, r1 in self.blocks():
            keys = self.mask.key_span(slice(r0, r1), self.length)
            w = self.tile(head, slice(r0, r1), keys)         # [query, the keys it can see]
            entropy[r0:r1] = torch.special.entr(w).sum(-1)
            if keys.start == 0:
                first[r0:r1] = w[:, 0]
            rows = torch.arange(max(r0, 1, keys.start + 1), r1)
            previous[rows] = w[rows - r0, rows - 1 - keys.start]
        return {"entropy": entropy, "first_token": first, "previous_token": previous}
