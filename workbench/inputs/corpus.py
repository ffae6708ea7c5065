"""Natural text that needs no download: the prose of the Python documentation.

Python ships the text of its reference documentation (``pydoc_data.topics``: about 80
topics, 465k characters). Its prose paragraphs (code samples and grammar rules removed)
are natural English, enough for losses, head scores and in-context learning on long
contexts. Topics are split deterministically into a ``fit`` part (about 80%) and a
``heldout`` part, so that a quantity estimated on one is evaluated on the other.

Examples:
    >>> docs = python_docs("heldout")
    >>> prompts = token_chunks(model, docs, n_chunks=8, n_tokens=128)   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Literal

from workbench.core.errors import WorkbenchError
from workbench.core.values import MAX_PROMPTS, MAX_SEQUENCE, Range
from workbench.inputs.prompts import Prompt, prompt_set

if TYPE_CHECKING:
    from workbench.inputs.tokenizing import TokenizingModel

Split = Literal["all", "fit", "heldout"]
_UNDERLINE = re.compile(r"^[*=\-~^\"]{3,}$")


def _heldout(topic: str) -> bool:
    return int(hashlib.sha256(topic.encode()).hexdigest(), 16) % 5 == 0


def _prose(text: str) -> str:
    """Paragraphs of running text: no indented code, grammar, tables or title underlines."""
    paragraphs = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if not lines or any(ln.startswith("   ") for ln in lines):
            continue
        lines = [ln for ln in lines if not _UNDERLINE.match(ln.strip())]
        paragraph = " ".join(ln.strip() for ln in lines)
        if len(paragraph) >= 40 and paragraph.count(" ") >= 6:
            paragraphs.append(paragraph)
    return "\n\n".join(paragraphs)


def python_docs(split: Split = "all") -> list[str]:
    """The prose of each topic of the Python reference documentation, in topic order.

    Args:
        split: ``fit`` (about 80% of the topics), ``heldout`` (the rest) or ``all``.
    """
    from pydoc_data.topics import topics

    docs = []
    for name in sorted(topics):
        if split != "all" and _heldout(name) != (split == "heldout"):
            continue
        prose = _prose(topics[name])
        if prose:
            docs.append(prose)
    return docs


def token_chunks(model: TokenizingModel, texts: Sequence[str], *, n_chunks: int, n_tokens: int,
                 label: str = "corpus") -> list[Prompt]:
    """Consecutive ``n_tokens``-token windows of the texts, framed for the model.

    The texts are joined (blank line between them) and tokenized once; each window gets
    the model's BOS (causal models) or its ``[CLS] ... [SEP]`` (encoders), counted in
    ``n_tokens``.

    Raises:
        WorkbenchError: the texts hold fewer than ``n_chunks`` windows.
    """
    bos = model.info.bos_token_id
    special = (0 if bos is None else 1) if model.info.causal else 2
    body = n_tokens - special
    if body < 1:
        raise WorkbenchError(f"n_tokens must be at least {special + 1}")
    stream = model.tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"]
    if len(stream) < n_chunks * body:
        raise WorkbenchError(
            f"the corpus has {len(stream)} tokens, fewer than {n_chunks} x {body} requested"
        )
    prompts = []
    for i in range(n_chunks):
        chunk = stream[i * body: (i + 1) * body]
        prompts.append(Prompt(token_ids=tuple(model.frame(chunk)), label=f"{label}[{i}]"))
    return prompts


@prompt_set("corpus")
def corpus(model: TokenizingModel, n_prompts: Annotated[int, Range(min=1, max=MAX_PROMPTS)] = 32,
           n_tokens: Annotated[int, Range(min=2, max=MAX_SEQUENCE)] = 128) -> Iterator[Prompt]:
    """Natural text: consecutive ``n_tokens``-token windows of the prose of the Python
    reference documentation (:func:`python_docs`), framed for the model, at most its
    context (:func:`token_chunks`)."""
    yield from token_chunks(model, python_docs(), n_chunks=n_prompts,
                            n_tokens=min(n_tokens, model.info.n_ctx), label="docs")
