"""Permuting a layer's attention heads in its weights, grouped-query attention included.

Multi-head attention is a sum over heads (Vaswani et al. 2017, section 3.2.2:
``MultiHead(X) = Concat(head_1, ..., head_h) W_O``), so reordering the heads, together
with the matching input slices of ``W_O``, leaves the layer's output unchanged, and each
head's pattern moves with its head. With grouped-query attention (Ainslie et al. 2023,
"GQA") query head ``h`` reads key-value head ``h // r`` (``r = n_heads / n_kv_heads``),
so a query head may only move together with its key-value group: :func:`head_permutation`
draws such permutations (whole groups, and heads within each group), and
:func:`permuted_head_weights` applies one to a layer's ``W_Q, W_K, W_V`` (and ``W_O``)
for the duration of a ``with`` block.

Conventions: new query head ``j`` is old head ``q_perm[j]``; new kv head ``g`` is old kv
head ``kv_perm[g]`` (as for positions: ``x_new = x_old[perm]``).

Examples:
    >>> q_perm, kv_perm = head_permutation(9, 3, torch.Generator().manual_seed(0))
    >>> sorted(q_perm.tolist()) == list(range(9))
    True
    >>> with permuted_head_weights(model, 4, q_perm, kv_perm):   # doctest: +SKIP
    ...     logits = model.bridge(ids)                            # same logits as before
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import einops
import torch
from jaxtyping import Int
from torch import Tensor

from workbench.core.errors import WorkbenchError
from workbench.models.base import Model


def head_permutation(n_heads: int, n_kv_heads: int, generator: torch.Generator | None = None
                     ) -> tuple[Int[Tensor, " head_index"], Int[Tensor, " kv_head"]]:
    """A random query- and kv-head permutation that keeps every query head with its kv head.

    New query head ``j`` is old head ``q_perm[j]``; it reads new kv head ``j // r`` (``r``
    query heads per kv head), which is old kv head ``kv_perm[j // r]``, and that must be
    old head ``q_perm[j]``'s own kv head: groups move whole and heads move within them.
    The query permutation is never the identity (unless there is a single head).

    Args:
        n_heads: query heads of the layer.
        n_kv_heads: key-value heads (``n_heads`` for plain multi-head attention); must
            divide ``n_heads``.
        generator: the source of randomness (``None``: torch's global one).

    Returns:
        ``(q_perm, kv_perm)``.
    """
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise WorkbenchError(f"{n_kv_heads} kv heads do not divide {n_heads} query heads")
    r = n_heads // n_kv_heads
    while True:
        kv_perm = torch.randperm(n_kv_heads, generator=generator)
        within = torch.stack([torch.randperm(r, generator=generator) for _ in range(n_kv_heads)])
        q_perm = einops.rearrange(kv_perm[:, None] * r + within, "g r -> (g r)")
        if n_heads < 2 or not bool((q_perm == torch.arange(n_heads)).all()):
            return q_perm, kv_perm


def _feature_index(perm: Int[Tensor, " head"], d_head: int) -> Int[Tensor, " feature"]:
    """Feature indices of ``(head d_head)`` when the heads are taken in ``perm`` order."""
    return einops.rearrange(perm[:, None] * d_head + torch.arange(d_head), "h d -> (h d)")


@contextlib.contextmanager
def permuted_head_weights(model: Model, layer: int, q_perm: Int[Tensor, " head_index"],
                          kv_perm: Int[Tensor, " kv_head"], *, output_slices: bool = True
                          ) -> Iterator[None]:
    """Permute one layer's heads in its weights for the duration of the block.

    New query head ``j`` gets old head ``q_perm[j]``'s rows of W_Q (and b_Q), new kv head
    ``g`` old kv head ``kv_perm[g]``'s rows of W_K, W_V (and biases), and, with
    ``output_slices``, W_O's input columns move with the query heads. The original
    tensors are put back afterwards, even on error.

    Args:
        model: a model whose bridge exposes ``q``, ``k``, ``v``, ``o`` projections on
            ``blocks[layer].attn`` (``Linear`` or GPT-2's transposed ``Conv1D``).
        layer: the layer whose heads move.
        q_perm: a permutation of the query heads (see :func:`head_permutation`).
        kv_perm: a permutation of the kv heads; for grouped-query attention it must keep
            each query head with its kv head, or the layer computes something else.
        output_slices: move W_O's slices with the heads (``False``: a control that must
            change the output).
    """
    attn = model.bridge.blocks[layer].attn
    d = model.info.d_head
    q_idx, kv_idx = _feature_index(q_perm, d), _feature_index(kv_perm, d)
    plan = [(attn.q, q_idx, 0), (attn.k, kv_idx, 0), (attn.v, kv_idx, 0)]
    if output_slices:
        plan.append((attn.o, q_idx, 1))
    saved: list[tuple[torch.nn.Parameter, Tensor]] = []
    try:
        with torch.no_grad():
            for bridge, idx, dim in plan:
                linear = bridge.original_component
                # W_O's bias is added after the heads are summed: it does not move
                params = [linear.weight] + ([linear.bias] if dim == 0 and
                                            linear.bias is not None else [])
                for param in params:
                    saved.append((param, param.data))
                    axis = _axis(linear, dim) if param.ndim == 2 else 0
                    param.data = param.data.index_select(axis, idx)
        yield
    finally:
        for param, data in reversed(saved):
            param.data = data


def _axis(linear: torch.nn.Module, dim: int) -> int:
    """The weight axis of a projection's output (``dim=0``) or input (``dim=1``) features:
    a ``Linear`` stores ``[out, in]``, GPT-2's ``Conv1D`` stores ``[in, out]``."""
    from transformers.pytorch_utils import Conv1D

    return 1 - dim if isinstance(linear, Conv1D) else dim
