"""What a circuit is found for: clean and corrupted inputs of one length and a metric.

The metric is read off the logits, one number per prompt, higher where the model does
the task: a logit difference (:class:`LogitDifference`: IOI's ``IO - S``) or the mean
log-probability of target tokens (:class:`TargetLogProb`: the negative loss on the second
repeat of a repeated random sequence) or a difference of probabilities
(:class:`ProbabilityDifference`: greater-than's years above the start year minus those at
or below it). The checks here (:func:`check_fractions`,
:func:`check_steps`, :func:`check_lengths`) need no model, so a caller refuses bad input
with them before one loads.

Examples:
    >>> task = Task(clean, corrupted, LogitDifference(io, s, positions))   # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core.errors import WorkbenchError


class Metric(Protocol):
    """Per-prompt task metric of a slice of the task's rows, differentiable in the logits.

    A metric reads the logits at a few positions of each row (:meth:`read_positions`), so a
    pass needs the unembedding only there: :meth:`at` takes the logits at those positions
    alone, and calling the metric on the whole logits is :meth:`at` of them gathered."""

    def read_positions(self, rows: slice) -> Int[Tensor, "batch k"]:
        """The positions of each row the metric reads, ``k`` of them per row."""
        ...

    def at(self, logits: Float[Tensor, "batch k d_vocab"], rows: slice
           ) -> Float[Tensor, " batch"]:
        """The metric from the logits at :meth:`read_positions` only."""
        ...

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab"], rows: slice
                 ) -> Float[Tensor, " batch"]: ...


def at_positions(x: Float[Tensor, "batch pos *rest"], positions: Int[Tensor, "batch k"]
                 ) -> Float[Tensor, "batch k *rest"]:
    """``x[b, positions[b, j]]`` for each row ``b`` and each of its ``k`` positions."""
    index = torch.arange(x.shape[0], device=x.device)[:, None]
    return x[index, positions.to(x.device)]


class _ReadsPositions:
    """The whole-logits call of a metric, shared: :meth:`at` of the logits gathered at
    :meth:`read_positions`."""

    def read_positions(self, rows: slice) -> Tensor:
        raise NotImplementedError

    def at(self, logits: Tensor, rows: slice) -> Tensor:
        raise NotImplementedError

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab"], rows: slice
                 ) -> Float[Tensor, " batch"]:
        return self.at(at_positions(logits, self.read_positions(rows)), rows)


@dataclass(frozen=True)
class LogitDifference(_ReadsPositions):
    """``logit(answer) - logit(other)`` at each row's position."""

    answer: Int[Tensor, " n"]
    other: Int[Tensor, " n"]
    positions: Int[Tensor, " n"]

    def read_positions(self, rows: slice) -> Int[Tensor, "batch 1"]:
        return self.positions[rows, None]

    def at(self, logits: Float[Tensor, "batch 1 d_vocab"], rows: slice
           ) -> Float[Tensor, " batch"]:
        at = logits[:, 0]  # [batch, d_vocab]
        return (at.gather(1, self.answer[rows, None]) - at.gather(1, self.other[rows, None]))[:, 0]


@dataclass(frozen=True)
class TargetLogProb(_ReadsPositions):
    """The mean log-probability of ``targets[row, t]`` predicted at position ``t``, over the
    positions where ``mask`` is true (the negative of the loss there)."""

    targets: Int[Tensor, "n pos"]
    mask: Float[Tensor, "n pos"]

    def read_positions(self, rows: slice) -> Int[Tensor, "batch k"]:
        """Each row's masked positions in order, ``k`` the most of any row; a row with
        fewer is filled with unmasked positions, which count for nothing."""
        read = self.mask[rows] != 0
        k = int(read.sum(1).max()) if len(read) else 0
        return torch.argsort((~read).to(torch.int8), dim=1, stable=True)[:, :k]

    def at(self, logits: Float[Tensor, "batch k d_vocab"], rows: slice
           ) -> Float[Tensor, " batch"]:
        positions = self.read_positions(rows)
        logp = torch.log_softmax(logits.float(), -1)
        targets = at_positions(self.targets[rows], positions).to(logp.device)
        got = logp.gather(2, targets[..., None])[..., 0]  # [batch, k]
        mask = at_positions(self.mask[rows], positions).to(got)
        return (got * mask).sum(1) / mask.sum(1).clamp_min(1)


@dataclass(frozen=True)
class ProbabilityDifference(_ReadsPositions):
    """Hanna et al.'s (2023) probability difference at each row's position: the summed
    next-token probabilities of the years after its threshold minus those up to it,
    ``sum_{y > t} p(y) - sum_{y <= t} p(y)``, ``y`` over the candidate tokens in order
    (greater-than: the two-digit years 00 .. 99, ``t`` the start year ``YY``)."""

    candidates: Int[Tensor, " n_candidates"]
    """the token of each candidate, in order (candidate ``i`` is ``candidates[i]``)"""
    thresholds: Int[Tensor, " n"]
    """each row's threshold: the index of the last candidate counted below"""
    positions: Int[Tensor, " n"]

    def read_positions(self, rows: slice) -> Int[Tensor, "batch 1"]:
        return self.positions[rows, None]

    def at(self, logits: Float[Tensor, "batch 1 d_vocab"], rows: slice
           ) -> Float[Tensor, " batch"]:
        probs = torch.softmax(logits[:, 0].float(), -1)
        at = probs[:, self.candidates]  # [batch, n_candidates]
        above = (torch.arange(len(self.candidates))[None] > self.thresholds[rows, None]
                 ).to(at.device)
        return torch.where(above, at, -at).sum(1)


@dataclass(frozen=True)
class Task:
    """Clean and corrupted token ids, ``[prompt, pos]`` of one shape, and the metric."""

    clean: Int[Tensor, "n pos"]
    corrupted: Int[Tensor, "n pos"]
    metric: Metric

    def __post_init__(self) -> None:
        check_lengths([len(row) for row in self.clean.tolist()],
                      [len(row) for row in self.corrupted.tolist()])
        if self.clean.shape != self.corrupted.shape or self.clean.dim() != 2:
            raise WorkbenchError(f"clean and corrupted ids must be [prompt, pos] of one shape, "
                                 f"got {tuple(self.clean.shape)} and "
                                 f"{tuple(self.corrupted.shape)}")

    @property
    def n_prompts(self) -> int:
        return int(self.clean.shape[0])

    def chunks(self, max_tokens: int, paired: bool = False) -> list[slice]:
        """Row slices of at most ``max_tokens`` tokens each (one row at least).

        Args:
            max_tokens: tokens per slice.
            paired: two rows at least in each slice, over ``max_tokens`` where two exceed
                it (a resample head mask takes each prompt's heads from another prompt of
                its pass; the rows of a task are of one length, so any two pair):
                :attr:`workbench.models.base.Model.paired_batches`.
        """
        n, width = self.clean.shape
        step = max(2 if paired else 1, max_tokens // max(1, width))
        starts = list(range(0, n, step))
        if paired and len(starts) > 1 and n - starts[-1] < 2:
            starts.pop()  # a last row alone joins the slice before it
        return [slice(i, starts[k + 1] if k + 1 < len(starts) else n)
                for k, i in enumerate(starts)]


def check_fractions(fractions: Sequence[float]) -> None:
    """Refuse a circuit size grid that is empty or has a size outside ``(0, 1]``.

    Raises:
        WorkbenchError: one line saying which size.
    """
    if not fractions:
        raise WorkbenchError("the circuit size grid is empty; give fractions in (0, 1]")
    bad = [f for f in fractions if not (math.isfinite(f) and 0 < f <= 1)]
    if bad:
        raise WorkbenchError(f"circuit sizes must be fractions of the edges in (0, 1], got "
                             f"{bad[0]}")


def check_steps(steps: int) -> None:
    """Refuse an EAP-IG step count below 1.

    Raises:
        WorkbenchError: one line.
    """
    if steps < 1:
        raise WorkbenchError(f"EAP-IG needs m >= 1 points on the path, got {steps}")


def check_lengths(clean: Sequence[int], corrupted: Sequence[int]) -> None:
    """Refuse prompts whose clean and corrupted versions differ in length (in tokens).

    Raises:
        WorkbenchError: one line naming the first such prompt.
    """
    if len(clean) != len(corrupted):
        raise WorkbenchError(f"{len(clean)} clean prompts but {len(corrupted)} corrupted ones")
    for i, (a, b) in enumerate(zip(clean, corrupted, strict=True)):
        if a != b:
            raise WorkbenchError(f"prompt {i}: its clean version has {a} tokens and its "
                                 f"corrupted version {b}; they must be of one length")
