"""Long-context retrieval prompts: a key-value pair planted in a document of N tokens, at its
start or at a depth into its filler, and asked for at its end.

Each prompt is ``N`` tokens long, the model's BOS included::

    [BOS] The passcode for the vault is tiger.\\n\\n <filler> \\n\\nThe passcode for the vault is

At ``depth`` d in ``[0, 1)`` (as in "needle in a haystack" evaluations), ``round(d * F)``
filler tokens come before the planted line, ``F`` being the filler's tokens at depth 0,
with a break between them, and the rest after it (the break's tokens are taken from the
filler, so the document keeps its ``N`` tokens)::

    [BOS] <filler, first part> \\n\\nThe passcode for the vault is tiger.\\n\\n <filler, rest>
    \\n\\nThe passcode for the vault is

The filler is cut at a token, mid-sentence as it may be. ``d = 0`` is the layout above,
the same ids as before the depth existed; each prompt's ``key_position`` and
``value_position`` say where the pair sits.

The filler is natural text that needs no download: the prose of the Python reference
documentation (:func:`workbench.inputs.corpus.python_docs`), from a topic drawn with the
seed, cut to fill the document to exactly ``N`` tokens. A model that retrieves the pair
predicts the value (``" tiger"``) after the last ``" is"``. The corrupted twin plants
another value (drawn with the seed, never the clean one) and is otherwise the same ids, so
the two have one length: the key, the question and the filler carry no information about
which value was planted.

The key and both values are one token each with their leading space, checked on the
model's tokenizer (:func:`workbench.inputs.ioi.single_tokens`), so the answer is one next
token and the corruption changes one position.

Examples:
    >>> prompts = retrieval_prompts(model, 4, doc_tokens=512, seed=0)   # doctest: +SKIP
    >>> prompts[0].key, prompts[0].value, prompts[0].value_position     # doctest: +SKIP
    ('vault', 'tiger', 7)
    >>> deep = retrieval_prompts(model, 4, doc_tokens=512, seed=0, depth=0.5)  # doctest: +SKIP
    >>> deep[0].key_position, deep[0].value_position                    # doctest: +SKIP
    (253, 255)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workbench.core.errors import WorkbenchError
from workbench.inputs.corpus import python_docs
from workbench.inputs.ioi import single_tokens

if TYPE_CHECKING:
    from workbench.inputs.tokenizing import TokenizingModel

KEYS: tuple[str, ...] = (
    "vault", "garden", "office", "studio", "harbor", "bridge", "tower", "castle", "temple",
    "station", "library", "museum", "theater", "factory", "safe", "door", "gate", "server",
    "account", "laptop", "phone", "house", "cabin", "barn", "attic", "shed",
)
"""What a passcode is for (the workbench's own list, filtered to the model's single
tokens)."""
VALUES: tuple[str, ...] = (
    "apple", "tiger", "silver", "river", "orange", "violet", "falcon", "copper", "maple",
    "cobalt", "lemon", "panda", "marble", "velvet", "crystal", "banana", "cherry", "dragon",
    "eagle", "forest", "hammer", "island", "jungle", "kettle", "lizard", "mango", "nickel",
    "ocean", "pepper", "rabbit", "salmon", "walnut", "zebra", "piano", "rocket", "shadow",
)
"""The passcodes: concrete words, none of them a key (filtered to the model's single
tokens)."""
LEAD = "The passcode for the"
"""The text before the key, in the planted line and in the question."""
LINK = " is"
"""The text between the key and the value."""
BREAK = "\n\n"
"""What separates the planted line, the filler and the question."""


@dataclass(frozen=True)
class RetrievalPrompt:
    """One document, its corrupted twin, and where the pair sits."""

    key: str
    value: str
    corrupted_value: str
    value_id: int
    corrupted_id: int
    ids: tuple[int, ...]
    """``doc_tokens`` ids, framed as the model expects (BOS first)"""
    corrupted: tuple[int, ...]
    """the same, with the planted value's token replaced by the corrupted value's"""
    key_position: int
    """the planted key's position"""
    value_position: int
    """the planted value's position: the only position where the two versions differ"""
    position: int
    """the last position (the question's ``" is"``), where the next token is the value"""


def _ids(model: TokenizingModel, text: str) -> list[int]:
    return list(model.tokenizer(text, add_special_tokens=False)["input_ids"])


def _pool(model: TokenizingModel, words: Sequence[str], what: str, least: int
          ) -> dict[str, int]:
    found = single_tokens(model, words)
    if len(found) < least:
        raise WorkbenchError(
            f"retrieval needs at least {least} {what} that are one token with a leading space "
            f"on {model.info.name}'s tokenizer; {len(found)} of {len(set(words))} are")
    return found


def _filler(model: TokenizingModel, docs: Sequence[str], start: int, n: int) -> list[int]:
    """``n`` tokens of the documents joined from ``docs[start]`` on (wrapping round)."""
    text, i = "", start
    while True:
        for _ in range(len(docs)):
            text += docs[i % len(docs)] + BREAK
            i += 1
            if len(text) >= 6 * n + 64:  # a few characters a token; read more if short
                break
        ids = _ids(model, text)
        if len(ids) >= n:
            return ids[:n]
        if i - start > 4 * len(docs):
            raise WorkbenchError(f"the filler text has {len(ids)} tokens, fewer than {n}")


def check_doc_tokens(doc_tokens: int, n_ctx: int | None, name: str) -> None:
    """Refuse a document longer than the model's context (``None``: not known yet).

    Raises:
        WorkbenchError: one line, with the context.
    """
    if n_ctx is not None and doc_tokens > n_ctx:
        raise WorkbenchError(f"doc_tokens={doc_tokens} is beyond {name}'s context of {n_ctx} "
                             f"tokens; give at most {n_ctx}")


def check_depth(depth: float) -> None:
    """Refuse a planting depth outside ``[0, 1)``.

    Raises:
        WorkbenchError: one line, with the value.
    """
    if not (isinstance(depth, int | float) and 0 <= depth < 1):
        raise WorkbenchError(f"depth must be a fraction of the filler in [0, 1), got {depth!r}")


def retrieval_prompts(model: TokenizingModel, n: int, *, doc_tokens: int, seed: int = 0,
                      keys: Sequence[str] | None = None, values: Sequence[str] | None = None,
                      depth: float = 0.0) -> list[RetrievalPrompt]:
    """``n`` documents of ``doc_tokens`` tokens, each with a key and a value drawn with
    ``seed`` planted at its start (or ``depth`` into its filler) and asked for at its end,
    and their corrupted twins.

    Args:
        model: a causal LM (its tokenizer decides which words are single tokens).
        n: prompts.
        doc_tokens: each document's length in tokens, BOS included, at most the model's
            context.
        seed: of the draws (keys, values, corrupted values, where the filler starts).
        keys: candidate keys (default :data:`KEYS`), filtered to single tokens.
        values: candidate values (default :data:`VALUES`), filtered to single tokens.
        depth: the fraction of the filler before the planted line, in ``[0, 1)``; ``0``:
            right after BOS.

    Raises:
        WorkbenchError: one line: a depth outside ``[0, 1)``, a document beyond the
            context, no single-token key or fewer than two values, or a document too short
            for the planted line and the question.
    """
    check_depth(depth)
    check_doc_tokens(doc_tokens, model.info.n_ctx, model.info.name)
    key_pool = _pool(model, KEYS if keys is None else keys, "keys", 1)
    value_pool = _pool(model, VALUES if values is None else values, "values", 2)
    lead, link, stop, brk = (_ids(model, t) for t in (LEAD, LINK, ".", BREAK))
    frame = len(model.frame([]))
    fixed = frame + 2 * (len(lead) + 1 + len(link)) + 1 + len(stop) + 2 * len(brk)
    if doc_tokens < fixed:
        raise WorkbenchError(f"doc_tokens={doc_tokens} cannot hold the planted line and the "
                             f"question ({fixed} tokens on {model.info.name}); give at least "
                             f"{fixed}")
    rng = random.Random(seed)
    docs = python_docs()
    n_filler = doc_tokens - fixed
    # at a depth, a break separates the filler's first part from the planted line; its
    # tokens come out of the filler, so the document keeps its length
    before = min(round(depth * n_filler), n_filler - len(brk))
    sep = brk if before > 0 else []
    before = max(before, 0)
    key_at = len(model.frame([])) + before + len(sep) + len(lead)  # a causal frame's BOS
    value_at = key_at + 1 + len(link)
    out = []
    for _ in range(n):
        key = rng.choice(sorted(key_pool))
        value, other = rng.sample(sorted(value_pool), 2)
        filler = _filler(model, docs, rng.randrange(len(docs)), n_filler - len(sep))
        line = [*lead, key_pool[key], *link]
        head = [*filler[:before], *sep, *line]
        rest = [*stop, *brk, *filler[before:], *brk, *line]
        clean = model.frame([*head, value_pool[value], *rest])
        corrupted = model.frame([*head, value_pool[other], *rest])
        out.append(RetrievalPrompt(key, value, other, value_pool[value], value_pool[other],
                                   tuple(clean), tuple(corrupted), key_at, value_at,
                                   len(clean) - 1))
    return out
