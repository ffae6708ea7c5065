"""A scan's pattern reductions read off the fused kernel's statistics
(:mod:`workbench.models.fused`) instead of blocks of weights.

:func:`scan_path` chooses a scan's path: ``fused`` where every reduction declares how it
reads the kernel's statistics (``BlockReduction.from_statistics``), the model's every
layer is one the kernel computes (:func:`workbench.models.blocked.fused_support`: its
family, device, dtype and head width), and the caller asked for it (``attention="fused"``)
or left it to ``auto`` on a CUDA device; on CPU ``auto`` keeps the torch blocked path,
which is faster there. Anything else keeps the path :func:`workbench.recording.hooks.
attention_path` gives.

:class:`FusedScan` is the blocked pass's ``fused`` callback: each layer's queries, keys
and values go through :func:`~workbench.models.fused.attention_statistics` under the
model's mask (causal or not, its sliding window, the batch's padding), and each
reduction's share of the layer's score is read off the statistics. Before it, the mask
the model would have applied is checked against the kernel's on the first and last rows;
a layer where they differ keeps its blocks (logged), and the run then says ``blocked``.

Examples:
    >>> scan_path(model, {"previous_token": previous_token}, "fused")  # doctest: +SKIP
    'fused'
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from workbench.core.options import AttentionPath
from workbench.models.base import Model
from workbench.models.blocked import FusedInputs, ScoreInputs
from workbench.models.fused import Variant, attention_statistics
from workbench.recording import hooks

if TYPE_CHECKING:  # reductions imports this module: its types only, for the checker
    from workbench.recording.reductions import Partial, PatternContext, StatisticsPart

log = logging.getLogger(__name__)

ScanPath = Literal["fused", "blocked", "dense"]
CHECKED_ROWS = 32
"""Rows at each end of a layer whose model mask is compared with the kernel's."""


def scan_path(model: Model, readers: Mapping[str, StatisticsPart | None],
              attention: AttentionPath) -> ScanPath:
    """The path a scan takes on ``model`` for ``attention``, given how each of its
    reductions reads the kernel's statistics (``None``: it needs the pattern).

    Raises:
        WorkbenchError: ``attention`` is not an :data:`AttentionPath`.
        ModelCapabilityError: ``blocked`` asked of a model whose attention cannot be blocked.
    """
    from workbench.core import attention as run_attention

    attention = run_attention.resolved(attention)
    # auto off CUDA is decided without looking at the layers: the CPU path stays as it was
    if attention == "fused" or (attention == "auto" and _device(model).type == "cuda"):
        why = _fused_refusal(model, readers)
        if why is None:
            return "fused"
        if attention == "fused":
            log.info("%s: the scan keeps the blocked path: %s", model.info.name, why)
        attention = "auto"
    return hooks.attention_path(model, attention)


def _device(model: Model) -> torch.device:
    return next(model.bridge.parameters()).device


def _fused_refusal(model: Model, readers: Mapping[str, StatisticsPart | None]) -> str | None:
    """Why a scan cannot take the fused path on ``model``, or ``None``."""
    from workbench.models import blocked

    lacking = [name for name, read in readers.items() if read is None]
    if lacking:
        return f"{', '.join(lacking)} need{'s' if len(lacking) == 1 else ''} the pattern itself"
    return blocked.fused_support(model)


def induction_target_keys(ctx: PatternContext) -> Int[Tensor, "batch query_pos"]:
    """Each query's induction target: where its token occurred exactly once before, at
    ``j``, the key ``j + 1``; -1 for every other query (padded ones included). The same
    targets as :func:`workbench.scores.patterns.second_repeat_targets`, found by sorting
    rather than by comparing every pair (no ``[T, T]`` tensor)."""
    ids, real = ctx.input_ids, ctx.query_mask
    batch, n = ids.shape
    pos = torch.arange(n).expand(batch, n)
    # a padded position gets an id of its own, below every token's: it matches nothing
    keyed = torch.where(real, ids.long(), -1 - pos)
    _, order = torch.sort(keyed, dim=-1, stable=True)  # by token, then by position
    same = keyed.gather(-1, order)
    starts = torch.ones_like(same, dtype=torch.bool)
    starts[:, 1:] = same[:, 1:] != same[:, :-1]
    first = torch.where(starts, pos, torch.zeros_like(pos)).cummax(-1).values
    rank = pos - first  # earlier occurrences of the token
    before = torch.full_like(order, -1)
    before[:, 1:] = order[:, :-1]
    target = torch.where(rank == 1, before + 1, torch.full_like(before, -1))
    out = torch.full_like(target, -1)
    out.scatter_(-1, order, target)
    return out[:, ctx.q0:ctx.q1]


def target_keys(ctx: PatternContext) -> Int[Tensor, "batch query_pos"]:
    """:func:`induction_target_keys` of the batch, computed once per context (every layer
    of a pass reads the same)."""
    return ctx.shared("induction_target_keys", ctx.input_ids,
                      lambda _: induction_target_keys(ctx))


class FusedScan:
    """The ``fused`` callback of a scan's blocked pass (see the module docstring).

    Args:
        model: the model.
        readers: how each metric of the scan reads the statistics.
        context: the current batch's :class:`PatternContext` (whole rows).
        take: called with each (layer, metric) share of the batch's scores.
        last: the deepest layer read (the pass stops after it).
    """

    def __init__(self, model: Model, readers: Mapping[str, StatisticsPart | None],
                 context: Callable[[], PatternContext],
                 take: Callable[[int, str, Partial], None], last: int) -> None:
        self.model, self.readers, self.context = model, dict(readers), context
        self.take, self.last = take, last
        self.fell_back = False

    def path(self, attention: AttentionPath) -> ScanPath:
        """The path of this scan for ``attention`` (:func:`scan_path`)."""
        return scan_path(self.model, self.readers, attention)

    def __call__(self, inputs: FusedInputs) -> Tensor | None:
        s = inputs.scores
        ctx = self.context()  # the batch's, whole rows (a reader needs no layer)
        variant = self.variant(s)
        device = s.queries.device
        key_mask = None if bool(ctx.query_mask.all()) else ctx.query_mask.to(device)
        why = _disagreement(s, variant, ctx.query_mask)
        if why is not None:
            log.warning("%s layer %d keeps the blocked path: %s", self.model.info.name,
                        s.layer, why)
            self.fell_back = True
            return None
        stats = attention_statistics(s.queries, s.keys, inputs.values, variant,
                                     key_mask=key_mask, targets=target_keys(ctx).to(device),
                                     received=False)
        for metric, read in self.readers.items():
            if read is not None:
                self.take(s.layer, metric, read(stats, ctx))
        if s.layer == self.last:
            hooks.stop_pass()  # nothing after the deepest layer read is needed
        return stats.output

    def variant(self, s: ScoreInputs) -> Variant:
        """The kernel's variant of a layer: the model's mask kind and window, the layer's
        scale and soft-cap."""
        causal = bool(self.model.info.causal)
        window = self.model.info.window(s.layer) if causal else None
        return Variant(causal=causal, window=window, scale=s.scale, softcap=s.softcap)


def _expected(variant: Variant, rows: Tensor, n_keys: int,
              real: Bool[Tensor, "batch key_pos"]) -> Bool[Tensor, "batch 1 query_pos key_pos"]:
    """The keys each of ``rows`` sees under ``variant`` and the batch's padding."""
    keys = torch.arange(n_keys)[None, :]
    seen = torch.ones(len(rows), n_keys, dtype=torch.bool)
    if variant.causal:
        seen &= keys <= rows[:, None]
    if variant.window is not None:
        seen &= keys > rows[:, None] - variant.window
    return seen[None, None] & real[:, None, None, :]


def _disagreement(s: ScoreInputs, variant: Variant, real: Bool[Tensor, "batch key_pos"]
                  ) -> str | None:
    """Where the model's mask and the kernel's differ on a real query of the first or last
    :data:`CHECKED_ROWS` rows, or ``None``."""
    n_q, n_k = s.queries.shape[-2], s.keys.shape[-2]
    if s.offset != 0 or n_q != n_k or real.shape[1] != n_k:
        return "its queries follow a cache"
    for r0, r1 in dict.fromkeys(((0, min(n_q, CHECKED_ROWS)),
                                 (max(0, n_q - CHECKED_ROWS), n_q))):
        rows = torch.arange(r0, r1)
        want = _expected(variant, rows, n_k, real)
        got = s.visible(r0, r1)
        got = torch.ones_like(want) if got is None else got.cpu().expand_as(want)
        counted = real[:, None, r0:r1, None]
        if bool(((got != want) & counted).any()):
            return f"the model's mask is not the kernel's {variant} on rows {r0}..{r1}"
    return None
