"""Sentences of natural text: one splitting rule, sentence prompts, and sentence pairs.

Every experiment that needs sentences takes them from here, so there is one rule for
where a sentence ends: after ``.``, ``!`` or ``?`` and white space, before a capital letter
(so ``e.g. the`` and ``i.e. a`` stay inside their sentence). The text is the prose of the
Python documentation (:func:`workbench.inputs.corpus.python_docs`), split into ``fit`` and
``heldout`` topics.

Examples:
    >>> split_sentences("One sentence here. Another one, e.g. this. Last!")
    ['One sentence here.', 'Another one, e.g. this.', 'Last!']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.inputs.corpus import Split, python_docs
from workbench.inputs.prompts import Prompt

if TYPE_CHECKING:
    from workbench.inputs.tokenizing import TokenizingModel

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def split_sentences(paragraph: str) -> list[str]:
    """The sentences of one paragraph (see the module docstring for the rule)."""
    return [s for s in _SENTENCE_END.split(paragraph.strip()) if s]


def paragraphs(split: Split) -> Iterator[str]:
    """Every paragraph of the documentation prose of ``split``, in topic order."""
    for doc in python_docs(split):
        yield from doc.split("\n\n")


def corpus_sentences(split: Split, *, min_words: int = 6, max_words: int = 40) -> list[str]:
    """Sentences of ``min_words`` to ``max_words`` words from one split, in order."""
    return [s for p in paragraphs(split) for s in split_sentences(p)
            if min_words <= len(s.split()) <= max_words]


def sentence_prompts(model: TokenizingModel, split: Split, n_tokens: int, seed: int
                     ) -> list[Prompt]:
    """Sentences in a seeded order until they hold ``n_tokens`` tokens (with specials).

    Raises:
        WorkbenchError: the split has fewer tokens than asked for.
    """
    sentences = corpus_sentences(split)
    order = np.random.default_rng(seed).permutation(len(sentences))
    prompts, total = [], 0
    for i in order:
        prompt = Prompt(text=sentences[i], label=f"python-docs-{split}[{i}]")
        prompts.append(prompt)
        total += len(model.encode(prompt)[0])
        if total >= n_tokens:
            return prompts
    raise WorkbenchError(f"the {split} sentences hold {total} tokens, fewer than {n_tokens}")


def prefix_holding(prompts: Sequence[Prompt], model: TokenizingModel, n_tokens: int
                   ) -> list[Prompt]:
    """The first prompts that together hold at least ``n_tokens`` tokens (all if fewer)."""
    total = 0
    for i, prompt in enumerate(prompts):
        total += len(model.encode(prompt)[0])
        if total >= n_tokens:
            return list(prompts[: i + 1])
    return list(prompts)


def fit_pair(tokenizer: Callable[..., Mapping[str, Any]], a: str, b: str,
             seq_len: int) -> tuple[str, str] | None:
    """Drop words from the end of the longer sentence until the encoded pair
    ``[CLS] a [SEP] b [SEP]`` fits ``seq_len`` tokens; ``None`` if it never does."""
    words_a, words_b = a.split(), b.split()
    while words_a and words_b:
        if len(tokenizer(" ".join(words_a), " ".join(words_b))["input_ids"]) <= seq_len:
            return " ".join(words_a), " ".join(words_b)
        longer = words_a if len(words_a) >= len(words_b) else words_b
        longer.pop()
    return None


def sentence_pairs(model: TokenizingModel, n: int, seq_len: int, split: Split) -> list[Prompt]:
    """``n`` pairs of consecutive sentences (of three words or more) as encoder inputs
    ``[CLS] a [SEP] b [SEP]``, each cut to ``seq_len`` tokens at a word boundary (Clark et
    al. 2019 cut at 128 tokens).

    Raises:
        WorkbenchError: the split holds fewer than ``n`` pairs.
    """
    pairs: list[Prompt] = []
    for paragraph in paragraphs(split):
        sentences = [s for s in split_sentences(paragraph) if len(s.split()) >= 3]
        for a, b in zip(sentences[::2], sentences[1::2], strict=False):
            if (fitted := fit_pair(model.tokenizer, a, b, seq_len)) is not None:
                pairs.append(Prompt(text=fitted[0], pair=fitted[1], label=f"pair[{len(pairs)}]"))
            if len(pairs) == n:
                return pairs
    raise WorkbenchError(f"the corpus holds only {len(pairs)} sentence pairs; {n} were "
                         "requested")
