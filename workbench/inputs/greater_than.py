"""Greater-than prompts (Hanna et al. 2023, "How does GPT-2 compute greater-than?").

"The war lasted from the year 1732 to the year 17" is completed, by a model that does the
task, with a two-digit year above 32. Each prompt takes a noun from :data:`NOUNS` and a
start year ``YY`` from :data:`START_YEARS` (02 to 98, as in the paper), both drawn with a
seed; its corrupted twin is the same prompt with the start year ``01`` ("1701"), which
leaves no year below the answer's range, so it carries none of the task's information.

The prompts need a tokenizer that writes ``" 17YY"`` as the tokens of ``" 17"`` followed by
one token ``"YY"``, for every ``YY`` from 00 to 99 (GPT-2's does): then the clean and
corrupted prompts have one length, the last token is ``" 17"``, and the probability of each
year is that of one next token. :func:`year_tokens` checks this on a tokenizer alone, so a
caller refuses a model before its weights load.

Examples:
    >>> prompts = greater_than_prompts(model, 8, seed=0)     # doctest: +SKIP
    >>> prompts[0].text, prompts[0].start                     # doctest: +SKIP
    ('The siege lasted from the year 1745 to the year 17', 45)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.core.errors import WorkbenchError

if TYPE_CHECKING:
    from workbench.inputs.tokenizing import TokenizingModel

NOUNS: tuple[str, ...] = (
    "war", "siege", "drought", "famine", "reign", "campaign", "voyage", "expedition",
    "occupation", "rebellion", "truce", "embargo", "blockade", "strike", "trial", "exile",
    "alliance", "plague", "dispute", "survey", "mission", "festival", "tradition", "empire",
)
"""Nouns of events that last a span of years (the workbench's own list; the paper's is
longer and filtered to GPT-2's single tokens, which these need not be: the corruption only
changes the year)."""
START_YEARS = range(2, 99)
"""The start years ``YY`` drawn: 02 to 98, as Hanna et al. draw them."""
CORRUPTED_YEAR = 1
"""The corrupted prompts' start year: "1701"."""
TEMPLATE = "The {noun} lasted from the year 17{yy:02d} to the year 17"
CENTURY = " 17"
"""The text before each two-digit year."""


@dataclass(frozen=True)
class GreaterThanPrompt:
    """One prompt, its corrupted twin, and its start year."""

    noun: str
    start: int
    """the start year ``YY``, 2 to 98"""
    text: str
    ids: tuple[int, ...]
    """framed as the model expects (BOS first); ends with the tokens of ``" 17"``"""
    corrupted: tuple[int, ...]
    """the same with the start year's token replaced by ``"01"``'s"""
    position: int
    """the last position, where the next token is the answer's year"""


def year_tokens(tokenizer: Any, name: str = "the model") -> tuple[int, ...]:
    """The token of each two-digit year ``"00"`` .. ``"99"`` as it follows ``" 17"``.

    Args:
        tokenizer: a Hugging Face tokenizer (no weights are needed).
        name: the model, as the message names it.

    Returns:
        100 token ids, the year ``YY``'s at index ``YY``.

    Raises:
        WorkbenchError: one line, with what the tokenizer gives instead: a year that is not
            one token after ``" 17"``, or two years that share a token.
    """
    century = _ids(tokenizer, CENTURY)
    found: list[int] = []
    split: list[str] = []
    example = ""
    for yy in range(100):
        ids = _ids(tokenizer, f"{CENTURY}{yy:02d}")
        if ids[: len(century)] == century and len(ids) == len(century) + 1:
            found.append(ids[-1])
        else:
            split.append(f"{yy:02d}")
            if len(split) == 1:
                example = (f"' 17{yy:02d}' is {_shown(tokenizer, ids)} and ' 17' is "
                           f"{_shown(tokenizer, century)}")
    if split:
        raise WorkbenchError(
            f"greater-than needs each two-digit year YY as one token after ' 17' (Hanna et "
            f"al. 2023); {name}'s tokenizer gives {100 - len(split)} of 100 so: {example}")
    if len(set(found)) < 100:
        raise WorkbenchError(f"greater-than needs a distinct token for each year 00..99; "
                             f"{name}'s tokenizer has {len(set(found))}")
    return tuple(found)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _shown(tokenizer: Any, ids: list[int]) -> str:
    return "[" + ", ".join(repr(t) for t in tokenizer.convert_ids_to_tokens(ids)) + "]"


def greater_than_prompts(model: TokenizingModel, n: int, *, seed: int = 0,
                         nouns: Sequence[str] | None = None) -> list[GreaterThanPrompt]:
    """``n`` greater-than prompts, each a noun and a start year drawn with ``seed``, and their
    corrupted twins (start year 01).

    Args:
        model: a causal LM whose tokenizer writes each year as one token after ``" 17"``.
        n: prompts.
        seed: of the draws.
        nouns: candidates (default :data:`NOUNS`).

    Raises:
        WorkbenchError: a tokenizer that splits the years (:func:`year_tokens`), or no noun.
    """
    years = year_tokens(model.tokenizer, model.info.name)
    pool = list(dict.fromkeys(NOUNS if nouns is None else nouns))
    if not pool:
        raise WorkbenchError("greater-than needs at least one noun")
    rng = random.Random(seed)
    century = _ids(model.tokenizer, CENTURY)
    out = []
    for _ in range(n):
        noun, start = rng.choice(pool), rng.choice(START_YEARS)
        head = _ids(model.tokenizer, f"The {noun} lasted from the year")
        tail = [*_ids(model.tokenizer, " to the year"), *century]
        clean = [*head, *century, years[start], *tail]
        corrupted = [*head, *century, years[CORRUPTED_YEAR], *tail]
        framed = model.frame(clean)
        out.append(GreaterThanPrompt(noun, start, TEMPLATE.format(noun=noun, yy=start),
                                     tuple(framed), tuple(model.frame(corrupted)),
                                     len(framed) - 1))
    return out
