"""Batches of encoded prompts: right-padded, sorted by length, with what undoes the padding.

Right padding with an attention mask leaves every real position's activations unchanged,
for causal models (a real query never sees a later position) and encoders (padded keys
are masked out). ``Model.batches(prompts, max_tokens=...)`` is the usual entry point: it
encodes the prompts and calls :func:`make_batches`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """Right-padded token ids of several prompts, with what is needed to undo the padding."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    lengths: list[int]
    indices: list[int]

    def forward_kwargs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for ``bridge(input_ids, **kwargs)``."""
        kwargs = {"attention_mask": self.attention_mask}
        if self.token_type_ids is not None:
            kwargs["token_type_ids"] = self.token_type_ids
        return kwargs

    def repeat(self, copies: int) -> Batch:
        """``copies`` copies of the batch stacked along the batch axis (copy-major: row
        ``k * n + i`` is row ``i`` of copy ``k``), as a replayed pass repeats its reference
        (:func:`workbench.interventions.replay.replayed`)."""
        return Batch(self.input_ids.repeat(copies, 1), self.attention_mask.repeat(copies, 1),
                     None if self.token_type_ids is None else
                     self.token_type_ids.repeat(copies, 1),
                     self.lengths * copies, self.indices * copies)

    @classmethod
    def of(cls, input_ids: torch.Tensor) -> Batch:
        """Rows of equal length, unpadded."""
        n, width = input_ids.shape
        return cls(input_ids, torch.ones_like(input_ids), None, [width] * n, list(range(n)))


def make_batches(encoded: Sequence[tuple[list[int], list[int] | None]], *, pad_id: int,
                 max_tokens: int = 4096, paired: bool = False) -> Iterator[Batch]:
    """Group encoded prompts into right-padded batches of at most ``max_tokens`` tokens.

    Prompts are sorted by length so that little padding is needed; right padding with an
    attention mask leaves every real position's activations unchanged, for causal models
    (a real query never sees a later position) and encoders (padded keys are masked).

    ``paired``: for a resample ablation, which takes each prompt's ablated heads from
    another prompt of its length in its batch
    (:func:`workbench.interventions.masks.donors`): the prompts of each length are kept
    together in twos (threes, where their count is odd), and such a unit is never split,
    even where two prompts exceed ``max_tokens``. A prompt whose length no other prompt
    has stays alone (the resample refuses it).
    """
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    units = _pairs(order, [len(encoded[i][0]) for i in order]) if paired else \
        [[i] for i in order]
    group: list[int] = []
    for unit in units:
        longest = len(encoded[unit[-1]][0])
        if group and longest * (len(group) + len(unit)) > max_tokens:
            yield _pad(encoded, group, pad_id)
            group = []
        group.extend(unit)
    if group:
        yield _pad(encoded, group, pad_id)


def _pairs(order: list[int], lengths: list[int]) -> list[list[int]]:
    """``order`` (sorted by length) cut into units of one length: twos, and a three at the
    end of an odd count; a length held once is a unit of one."""
    units: list[list[int]] = []
    start = 0
    while start < len(order):
        end = start
        while end < len(order) and lengths[end] == lengths[start]:
            end += 1
        run = order[start:end]
        while len(run) >= 4:
            units.append(run[:2])
            run = run[2:]
        units.append(run)
        start = end
    return units


def _pad(encoded: Sequence[tuple[list[int], list[int] | None]], group: list[int],
         pad_id: int) -> Batch:
    lengths = [len(encoded[i][0]) for i in group]
    width = max(lengths)
    ids = torch.full((len(group), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(group), width), dtype=torch.long)
    has_types = encoded[group[0]][1] is not None
    types = torch.zeros((len(group), width), dtype=torch.long) if has_types else None
    for row, i in enumerate(group):
        tokens, type_ids = encoded[i]
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
        if types is not None and type_ids is not None:
            types[row, : len(tokens)] = torch.tensor(type_ids)
    return Batch(ids, mask, types, lengths, list(group))
