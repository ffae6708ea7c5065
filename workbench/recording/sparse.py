"""Sparse attention patterns: the k largest weights of each query row, plus exact channels.

A dense pattern costs ``head x T^2`` numbers per layer (36 GB per 8,192-token smollm2 prompt
in float16). The sparse form keeps, for every query row, the ``k`` largest weights and their
key positions, and stores separately, exactly (float32), four *channels* per row:

- ``first``: the weight on key 0 (the attention-sink score reads it),
- ``diagonal``: the weight on the query's own position (self-attention),
- ``previous``: the weight on the position before it (previous-token; 0 for query 0),
- ``left_out``: the mass of every weight not among the ``k`` kept, ``row sum - kept sum``
  computed from the full row, so kept + left out = the row's sum (1 for a softmax row).

So a sink, self or previous-token score computed from a sparse recording equals the dense
one, and no row silently loses mass. A kept slot of weight 0 (a row with fewer than
``k`` visible keys) holds :func:`key_dtype`'s sentinel, not a key.

It also pools patterns to screen resolution (:func:`pool_dense`, :func:`pool_entries`) for
the long-context view.

Examples:
    >>> rows = topk_rows(pattern[0], q0=0, k=16)                      # doctest: +SKIP
    >>> (rows.weights.sum(-1) + rows.left_out)  # 1 per row           # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

Pooling = Literal["max", "sum"]
"""How the long-context overview pools a cell of many weights: the largest, or their sum."""
DEFAULT_TOPK = 16
"""The weights a row keeps unless asked otherwise: what ``record`` keeps of a ``topk``
recording, and what the sparse view of a dense one computes."""
CHANNELS = ("first", "diagonal", "previous", "left_out")
"""The exact channels, in their order on the last axis of the stored ``exact`` array."""


def key_dtype(n_keys: int) -> np.dtype:
    """The smallest unsigned dtype for key positions ``0 .. n_keys - 1`` plus a sentinel
    (its largest value) marking an empty top-k slot."""
    return np.dtype(np.uint16) if n_keys < np.iinfo(np.uint16).max else np.dtype(np.uint32)


@dataclass(frozen=True)
class SparsePattern:
    """The sparse form of some query rows of one or all heads.

    ``weights``/``keys`` are ``[*head, query, k]`` (largest first; empty slots have weight
    0 and key :attr:`sentinel`); each channel is ``[*head, query]``; ``queries`` are the
    query positions of the rows.
    """

    weights: Float[np.ndarray, "*head query k"]
    keys: Int[np.ndarray, "*head query k"]
    first: Float[np.ndarray, "*head query"]
    diagonal: Float[np.ndarray, "*head query"]
    previous: Float[np.ndarray, "*head query"]
    left_out: Float[np.ndarray, "*head query"]
    queries: Int[np.ndarray, " query"]

    @property
    def sentinel(self) -> int:
        return int(np.iinfo(self.keys.dtype).max)

    def dense(self, n_keys: int) -> Float[np.ndarray, "*head query key"]:
        """A dense ``[*head, query, key]`` view: the kept weights and the exact channels at
        their keys, 0 elsewhere. The left-out mass is spread nowhere: a row sums to less
        than 1 (to ``1 - left_out`` plus the channels' weights outside the kept keys)."""
        out = np.zeros((*self.weights.shape[:-1], n_keys + 1), dtype=np.float32)
        keys = np.where(self.keys == self.sentinel, n_keys, self.keys).astype(np.int64)
        np.put_along_axis(out, keys, self.weights.astype(np.float32), axis=-1)
        rows = np.arange(len(self.queries))
        out[..., rows, 0] = self.first
        out[..., rows, np.minimum(self.queries, n_keys - 1)] = self.diagonal
        before = self.queries > 0
        out[..., rows[before], self.queries[before] - 1] = self.previous[..., before]
        return out[..., :n_keys]


def topk_rows(rows: Float[Tensor, "head_index query_pos key_pos"], *, q0: int, k: int,
              k0: int = 0, n_keys: int | None = None) -> dict[str, np.ndarray]:
    """The sparse form of some query rows of every head, as the arrays to store.

    Args:
        rows: weights of queries ``q0 .. q0 + query_pos - 1`` over keys ``k0 ..
            k0 + key_pos - 1``; every weight outside those keys is zero (a block of
            blocked attention, :class:`workbench.models.blocked.PatternBlock`).
        q0: the position of the first row.
        k: how many weights to keep per row (a slot with weight 0 keeps no key: the
            sentinel, so ties among zero weights leave nothing arbitrary on disk).
        k0: the position of the first key column.
        n_keys: the keys of the prompt, which set the key dtype (default ``k0 + key_pos``).

    Returns:
        ``weights`` ``[head, query, k]`` float32, ``keys`` ``[head, query, k]``
        (:func:`key_dtype`), ``exact`` ``[head, query, 4]`` float32 (:data:`CHANNELS`).
    """
    rows = rows.float()
    n_heads, n_rows, width = rows.shape
    kept, where = rows.topk(min(k, width), dim=-1)
    dtype = key_dtype(k0 + width if n_keys is None else n_keys)
    weights = np.zeros((n_heads, n_rows, k), dtype=np.float32)
    keys = np.full((n_heads, n_rows, k), np.iinfo(dtype).max, dtype=dtype)
    weights[..., : kept.shape[-1]] = kept.numpy()
    found = (where + k0).numpy()
    keys[..., : kept.shape[-1]] = np.where(kept.numpy() > 0, found, np.iinfo(dtype).max)
    q = torch.arange(q0, q0 + n_rows)
    exact = torch.zeros(n_heads, n_rows, len(CHANNELS))
    exact[..., 0] = rows[..., 0] if k0 == 0 else 0.0
    exact[..., 1] = _weight_at(rows, q - k0)
    exact[..., 2] = torch.where(q > 0, _weight_at(rows, q - 1 - k0), 0.0)
    # both sums in float32 (no float64 copy of the rows): the left-out mass is exact to
    # about 1e-7, float32's rounding of a sum near 1
    exact[..., 3] = rows.sum(-1) - kept.sum(-1)
    return {"weights": weights, "keys": keys, "exact": exact.numpy()}


def _weight_at(rows: Float[Tensor, "head_index query_pos key_pos"],
               columns: Int[Tensor, " query_pos"]) -> Float[Tensor, "head_index query_pos"]:
    """Each row's weight at its column (0 for a column outside the rows' keys)."""
    inside = (columns >= 0) & (columns < rows.shape[-1])
    index = columns.clamp(0, rows.shape[-1] - 1)[None, :, None].expand(rows.shape[0], -1, 1)
    picked = rows.gather(-1, index)[..., 0]  # gather: fast on a view, where indexing is not
    return torch.where(inside, picked, torch.zeros_like(picked))


def cells(span: int, max_cells: int) -> int:
    """The pooling factor that fits ``span`` positions into at most ``max_cells``."""
    return max(1, -(-span // max_cells))


def pool_dense(block: Float[np.ndarray, "query key"], factor: int, how: Pooling,
               ) -> Float[np.ndarray, "qcell kcell"]:
    """Pool a dense block whose first row and column start cells, ``factor`` x ``factor``
    positions per cell (a ragged last cell pools what it has)."""
    q, k = block.shape
    padded = np.zeros((-(-q // factor) * factor, -(-k // factor) * factor), dtype=np.float32)
    padded[:q, :k] = block
    grid = padded.reshape(padded.shape[0] // factor, factor, padded.shape[1] // factor, factor)
    return grid.max(axis=(1, 3)) if how == "max" else grid.sum(axis=(1, 3))


def pool_entries(rows: Int[np.ndarray, " n"], cols: Int[np.ndarray, " n"],
                 values: Float[np.ndarray, " n"], shape: tuple[int, int], factor: int,
                 how: Pooling) -> Float[np.ndarray, "qcell kcell"]:
    """Pool scattered weights (row, column relative to a window's corner) into cells.

    Entries outside ``shape`` (the window) are dropped; a position must appear once for
    ``sum`` pooling to be right (the caller drops a channel already among the kept keys).
    """
    keep = (rows >= 0) & (rows < shape[0]) & (cols >= 0) & (cols < shape[1])
    grid = np.zeros((-(-shape[0] // factor), -(-shape[1] // factor)), dtype=np.float32)
    at = (rows[keep] // factor, cols[keep] // factor)
    if how == "max":
        np.maximum.at(grid, at, values[keep])
    else:
        np.add.at(grid, at, values[keep])
    return grid
