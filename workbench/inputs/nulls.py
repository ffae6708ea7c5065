"""Structured null inputs: a prompt with the structure a head metric detects taken out.

Each builder takes one prompt of the ``repeated-random`` set (``seq_len`` random tokens
repeated ``repeats`` times, framed as the model frames text) and returns its null twin:
the same length, the same framing and the same first occurrence, with the repeats after
the first changed so that the relation the metric reads no longer holds at the positions
where it held. A null twin is scored at the *real* prompt's targets
(:func:`workbench.recording.reductions.reduce_patterns` with ``reference=``): the weight
the head puts, on the null input, where the metric looked on the real one.

- :func:`shuffled_repeats` (Olsson's prefix-matching ``induction`` score): every repeat
  after the first is a derangement of the first, the same tokens with none at its own
  offset, so the key after each token's first occurrence (``i - seq_len + 1``) no longer
  continues the token at the query. A prefix-matching head still finds the token's real
  successor, elsewhere; only at the real target is its weight chance.
- :func:`fresh_repeats` (``duplicate_token``): every repeat after the first is replaced by
  fresh random tokens that occur nowhere earlier in the prompt, so no query has an earlier
  copy of itself. Shuffling would not do: every token of a shuffled repeat still has its
  earlier copy, at another offset.

Examples:
    >>> gen = torch.Generator().manual_seed(0)                       # doctest: +SKIP
    >>> twin = shuffled_repeats(model, prompt, 40, 2, gen)           # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workbench.core.errors import WorkbenchError
from workbench.inputs.prompts import Prompt, content_token_range, random_token_ids

if TYPE_CHECKING:
    from workbench.inputs.tokenizing import TokenizingModel


def body_start(model: TokenizingModel) -> int:
    """Where the content of a framed prompt starts (after a BOS or a [CLS])."""
    return len(model.frame([])) - (0 if model.info.causal else 1)


def _split(model: TokenizingModel, prompt: Prompt, seq_len: int, repeats: int
           ) -> tuple[list[int], int, list[int]]:
    """The prompt's ids, where its body starts, and the first repeat.

    Raises:
        WorkbenchError: the prompt is not ``repeats`` copies of one ``seq_len`` sequence.
    """
    ids, _ = model.encode(prompt)
    start = body_start(model)
    body = ids[start:start + seq_len * repeats]
    first = body[:seq_len]
    if len(body) != seq_len * repeats or body != first * repeats:
        raise WorkbenchError(f"prompt {prompt.label} is not {repeats} repeats of a "
                             f"{seq_len}-token sequence")
    return ids, start, first


def derangement(n: int, generator: torch.Generator) -> list[int]:
    """A random permutation of ``range(n)`` with no fixed point (the identity when n < 2,
    which has no derangement)."""
    if n < 2:
        return list(range(n))
    while True:
        order = torch.randperm(n, generator=generator).tolist()
        if all(i != j for i, j in enumerate(order)):
            return order


def shuffled_repeats(model: TokenizingModel, prompt: Prompt, seq_len: int, repeats: int,
                     generator: torch.Generator) -> Prompt:
    """The null twin for induction: each repeat after the first a derangement of it."""
    ids, start, first = _split(model, prompt, seq_len, repeats)
    out = list(ids)
    for r in range(1, repeats):
        order = derangement(seq_len, generator)
        at = start + r * seq_len
        out[at:at + seq_len] = [first[j] for j in order]
    return Prompt(token_ids=tuple(out), label=f"{prompt.label} (repeats shuffled)")


def fresh_problem(model: TokenizingModel, prompt: Prompt, seq_len: int, repeats: int) -> str | None:
    """Why :func:`fresh_repeats` cannot make the twin of ``prompt``: the vocabulary has too
    few content tokens the prompt does not use (``None``: it can)."""
    ids, _, _ = _split(model, prompt, seq_len, repeats)
    need = seq_len * (repeats - 1)
    low, high = content_token_range(model)
    unused = len(set(range(low, high)) - set(ids) - set(model.tokenizer.all_special_ids))
    if unused >= need:
        return None
    return (f"{model.info.name}'s vocabulary has {unused} content tokens that prompt "
            f"{prompt.label} does not use, too few for the {need} fresh ones its null needs")


def fresh_repeats(model: TokenizingModel, prompt: Prompt, seq_len: int, repeats: int,
                  generator: torch.Generator) -> Prompt:
    """The null twin for duplicate-token: each repeat after the first replaced by fresh
    random tokens, none of which occurs earlier in the prompt (nor twice in the twin)."""
    problem = fresh_problem(model, prompt, seq_len, repeats)
    if problem is not None:
        raise WorkbenchError(problem)
    ids, start, _ = _split(model, prompt, seq_len, repeats)
    seen = set(ids)
    need = seq_len * (repeats - 1)
    fresh: list[int] = []
    while len(fresh) < need:
        for token in random_token_ids(model, seq_len, generator):
            if token not in seen:
                seen.add(token)
                fresh.append(token)
    out = list(ids)
    out[start + seq_len:start + seq_len * repeats] = fresh[:need]
    return Prompt(token_ids=tuple(out), label=f"{prompt.label} (fresh repeats)")
