"""The seeded permutations of ``permutation-equivariance``: of positions (every one moves, or
only a prefix) and of heads, each fixed by its seed and by the prompt or layer it is for,
so that a run is reproducible and every check on one prompt sees the same permutation."""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

from workbench.models.head_permutation import head_permutation

_FULL, _PREFIX, _HEADS, _FAR = 1, 2, 3, 4  # keep the kinds of draws apart for one seed


def _generator(*parts: int) -> torch.Generator:
    seed = 0
    for part in parts:
        seed = seed * 1_000_003 + part
    return torch.Generator().manual_seed(seed % 2**63)


def _non_identity(n: int, gen: torch.Generator) -> Int[Tensor, " n"]:
    while True:
        perm = torch.randperm(n, generator=gen)
        if n < 2 or not bool((perm == torch.arange(n)).all()):
            return perm


def full_permutation(n: int, seed: int, prompt: int) -> Int[Tensor, " pos"]:
    """A random non-identity permutation of ``n`` positions, fixed by seed and prompt."""
    return _non_identity(n, _generator(seed, prompt, _FULL))


def prefix_permutation(n: int, seed: int, prompt: int) -> tuple[int, Int[Tensor, " pos"]]:
    """``(i, perm)``: ``perm`` shuffles positions ``0 .. i-1`` (never as the identity) and
    fixes every later one; ``2 <= i <= n - 1``, drawn with the permutation."""
    gen = _generator(seed, prompt, _PREFIX)
    i = int(torch.randint(2, n, (1,), generator=gen))
    return i, torch.cat([_non_identity(i, gen), torch.arange(i, n)])


def far_past_permutation(n: int, window: int, seed: int, prompt: int
                         ) -> tuple[int, Int[Tensor, " pos"]] | None:
    """``(i, perm)``: ``perm`` shuffles positions ``0 .. i-1`` (never as the identity) and
    fixes every later one, with ``i = max(2, (n - window + 1) // 2)``, so that the queries
    ``t >= i + window - 1`` (at least one) see none of the moved tokens through a window of
    ``window`` keys; ``None`` when ``n < window + 2`` leaves no room."""
    if n < window + 2:
        return None
    i = max(2, (n - window + 1) // 2)
    gen = _generator(seed, prompt, _FAR)
    return i, torch.cat([_non_identity(i, gen), torch.arange(i, n)])


def seeded_head_permutation(n_heads: int, n_kv_heads: int, seed: int, layer: int
                            ) -> tuple[Int[Tensor, " head_index"], Int[Tensor, " kv_head"]]:
    """:func:`~workbench.models.head_permutation.head_permutation` fixed by seed and layer."""
    return head_permutation(n_heads, n_kv_heads, _generator(seed, layer, _HEADS))
