"""Prompts and named prompt sets.

A prompt set is either a file in ``data/prompts/`` (the folder is its registry: ``NAME.txt``
holds one prompt per paragraph, ``NAME.tsv`` one sentence pair per line, separated by a tab)
or a generator registered with :func:`prompt_set`, which may depend on the model (random
token ids are drawn from its vocabulary). A generator's parameters are typed like config
fields, ranges included (``seq_len: Annotated[int, Range(min=1, max=...)] = 32``), and every
value given by name is checked against them (:func:`check_prompt_params`) before the model
is needed: ``--set seq_len=-5`` is refused with a message naming the parameter.

A prompt file is checked whole before anything runs (:func:`read_prompt_file`): a regular
file of at most :data:`MAX_PROMPT_FILE` bytes, UTF-8 text without NUL bytes, and in a
``.tsv`` exactly one tab between two sentences on every line that is not blank. A line of
only whitespace is a blank line. :func:`check_prompt_set` reads a file set's content, not
only its name, so a config naming a malformed file is refused before a run exists.

Examples:
    >>> from workbench.inputs.prompts import load_prompt_set
    >>> prompts = load_prompt_set("natural")          # doctest: +SKIP
    >>> prompts[0].text[:20]                          # doctest: +SKIP
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import torch

from workbench.core import paths
from workbench.core.errors import ConfigError, UnknownNameError, WorkbenchError, printable
from workbench.core.files import read_text
from workbench.core.registry import Registry, did_you_mean
from workbench.core.values import (
    MAX_PROMPTS,
    MAX_REPEATS,
    MAX_SEQUENCE,
    SEED,
    Range,
    check_declaration,
    check_keywords,
    keyword_types,
    shown,
)

if TYPE_CHECKING:
    from workbench.inputs.tokenizing import TokenizingModel

MAX_PROMPT_FILE = 16 << 20
"""The largest prompt file read (``record --file``, ``data/prompts``): 16 MiB holds
thousands of context-long prompts, more than a recording or an experiment takes."""

CHARS_PER_TOKEN = 32
"""A text prompt longer than this many characters per token of the model's context is
refused before it is tokenized (tokenizing 50 MB takes minutes). Prompts have their
whitespace collapsed, and text averages 3 to 5 characters per token with the byte-pair
and WordPiece vocabularies of the bundled models (long numbers, URLs and unbroken words
stay under about 10), so 32 refuses nothing that fits while it bounds the tokenizer's
work by the context."""


@dataclass(frozen=True)
class Prompt:
    """One input: text (with an optional second segment for encoders) or token ids."""

    text: str | None = None
    pair: str | None = None
    token_ids: tuple[int, ...] | None = None
    label: str = ""


def tokens_digest(prompt: Prompt) -> str:
    """The first 16 hex digits of the SHA-256 of a prompt's token ids (of its text where it
    has no ids): what tells two runs' prompt ``i`` apart when they were drawn differently
    (a per-prompt table's ``tokens`` column)."""
    if prompt.token_ids is not None:
        data = ",".join(map(str, prompt.token_ids)).encode()
    else:
        data = f"{prompt.text}\0{prompt.pair or ''}".encode()
    return hashlib.sha256(data).hexdigest()[:16]


Generator = Callable[..., Iterable[Prompt]]
GENERATORS: Registry[Generator] = Registry("prompt set")


def prompt_set(name: str) -> Callable[[Generator], Generator]:
    """Register a generated prompt set: ``fn(model, **params)`` yielding prompts one by
    one (so that a limit stops the generating, not only the keeping).

    Every parameter after ``model`` needs a type annotation and a default; numbers carry
    their range, with a finite ``max``, as ``Annotated[int, Range(min=1, max=...)]``. A
    parameter without an annotation, or a number without an upper bound, is a
    programming error, raised at registration.
    """

    def wrap(fn: Generator) -> Generator:
        types_ = keyword_types(fn, skip=1)
        untyped = [k for k, tp in types_.items() if tp is Any]
        if untyped:
            raise TypeError(f"prompt set '{name}': parameters without a type: {untyped}")
        for key, tp in types_.items():
            check_declaration(tp, f"prompt set '{name}' parameter {key}")
        return GENERATORS.register(name, fn)

    return wrap


def file_sets() -> dict[str, Path]:
    """Prompt-set files in ``data/prompts`` by name."""
    folder = paths.data_dir() / "prompts"
    found = sorted(folder.glob("*.txt")) + sorted(folder.glob("*.tsv"))
    return {p.stem: p for p in found}


def prompt_set_names() -> list[str]:
    return sorted({*file_sets(), *GENERATORS.names()})


def check_prompt_set(name: str) -> None:
    """Raise unless ``name`` is a prompt set; a file set's content is read and checked
    too (see :func:`read_prompt_file`), so a malformed file fails here, before a run.

    Raises:
        UnknownNameError: an unknown name (the message lists the known sets).
        WorkbenchError: a file set that cannot be read or is malformed.
    """
    names = prompt_set_names()
    if name not in names:
        raise UnknownNameError(
            f"unknown prompt set {shown(name)}{did_you_mean(name, names)}; "
            f"known prompt sets: {', '.join(printable(n) for n in names)}")
    path = file_sets().get(name)
    if path is not None:
        _file_prompts(path)


def check_prompt_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of prompt set ``name``, typed and checked (no model needed).

    Args:
        name: a prompt set (a file set takes no parameters).
        params: ``{name: value}``; text (from ``--set``) is parsed by the parameter's type.

    Returns:
        The values as the generator takes them.

    Raises:
        UnknownNameError: an unknown prompt set (listing the known ones).
        ConfigError: an unknown parameter (listing the known ones), a value of the wrong
            type or out of range (naming the parameter and what it expects), or any
            parameter for a file set.
        WorkbenchError: a file set that cannot be read or is malformed.
    """
    check_prompt_set(name)
    if name in file_sets():
        if params:
            raise ConfigError(f"prompt set '{name}' is a file and takes no parameters "
                              f"(got {', '.join(printable(k) for k in params)})")
        return {}
    return check_keywords(GENERATORS.get(name), params, what=f"prompt set '{name}'", skip=1)


def load_prompt_set(name: str, model: TokenizingModel | None = None, *, limit: int | None = None,
                    **params: Any) -> list[Prompt]:
    """The prompts of a named set.

    Args:
        name: a file in ``data/prompts`` or a registered generator.
        model: needed by generators that draw token ids.
        limit: keep only the first ``limit`` prompts; a generator stops after them.
        params: generator parameters (e.g. ``n_prompts``, ``seed``), checked by
            :func:`check_prompt_params`.

    Returns:
        The prompts, in the set's order.

    Raises:
        UnknownNameError: listing the known prompt sets.
        ConfigError: a parameter that is unknown, of the wrong type or out of range.
        WorkbenchError: a file set that cannot be read or is malformed.
    """
    params = check_prompt_params(name, params)
    files = file_sets()
    if name in files:
        prompts: Iterable[Prompt] = _file_prompts(files[name])
    elif model is None:
        raise WorkbenchError(f"prompt set '{name}' is generated from a model's vocabulary")
    else:
        prompts = GENERATORS.get(name)(model, **params)
    return list(itertools.islice(prompts, limit))


def _file_prompts(path: Path) -> tuple[Prompt, ...]:
    """The prompts of a prompt-set file, read once for each version of the file (a
    config is checked each time it is built)."""
    try:
        st = os.stat(path)
    except OSError:
        return tuple(read_prompt_file(path))  # refused there, with the reason
    return _read_once(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _read_once(path: str, mtime_ns: int, size: int) -> tuple[Prompt, ...]:
    return tuple(read_prompt_file(Path(path)))


def read_prompt_file(path: Path, *, pairs: bool | None = None,
                     whole: bool = False) -> list[Prompt]:
    """Read a prompt file: paragraphs (``.txt``), sentence pairs (``.tsv``), or the whole
    file as one prompt.

    Args:
        path: the file: regular, at most :data:`MAX_PROMPT_FILE` bytes, UTF-8 text.
        pairs: read tab-separated sentence pairs (default: when the name ends ``.tsv``).
        whole: the file's text is one prompt, exactly as it is (blank lines, line breaks
            and indentation kept), labelled ``<file stem>``.

    Returns:
        The prompts, labelled ``<file stem>[i]``.

    Raises:
        WorkbenchError: one line naming the file: it cannot be read, is not a regular
            file, is too large, is not UTF-8 text (naming the encoding it looks like),
            holds no prompt, or has a line that is not ``sentence<TAB>sentence``.
    """
    what = f"prompt file {printable(str(path))}"
    text = read_text(path, what="prompt file", limit=MAX_PROMPT_FILE)
    label = printable(path.stem)
    if whole:
        if not text.strip():
            raise WorkbenchError(f"{what} is empty")
        return [Prompt(text=text, label=label)]
    if pairs if pairs is not None else path.suffix == ".tsv":
        return _sentence_pairs(text, label, what)
    return prompts_from_text(text, label=label, what=what)


def _sentence_pairs(text: str, label: str, what: str) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise WorkbenchError(f"{what} line {number}: expected 'sentence<TAB>sentence' "
                                 f"(one tab between two sentences), got {shown(line)}")
        a, b = (" ".join(part.split()) for part in parts)
        prompts.append(Prompt(text=a, pair=b, label=f"{label}[{len(prompts)}]"))
    if not prompts:
        raise WorkbenchError(f"{what} holds no sentence pair")
    return prompts


def prompts_from_text(text: str, label: str = "text", what: str = "the text") -> list[Prompt]:
    """Split text into prompts at blank lines (a text with none is one prompt).

    A line that holds only whitespace is blank; within a prompt, runs of whitespace
    (line breaks included) become one space.

    Args:
        text: the text.
        label: prompts are labelled ``label[i]``.
        what: the text, for the message when it holds no prompt.

    Returns:
        One prompt per paragraph.

    Raises:
        WorkbenchError: the text holds nothing but whitespace.
    """
    paragraphs, lines = [], []
    for line in [*text.splitlines(), ""]:
        if line.strip():
            lines.append(line)
        elif lines:
            paragraphs.append(" ".join(" ".join(lines).split()))
            lines = []
    if not paragraphs:
        raise WorkbenchError(f"{what} is empty")
    return [Prompt(text=p, label=f"{label}[{i}]") for i, p in enumerate(paragraphs)]


def check_length(prompt: Prompt, n_ctx: int, model: str) -> None:
    """Refuse, before it is tokenized, a text prompt of more than :data:`CHARS_PER_TOKEN`
    characters per token of a context of ``n_ctx`` tokens.

    Raises:
        WorkbenchError: naming the prompt, its length and the model's context.
    """
    chars = len(prompt.text or "") + len(prompt.pair or "")
    limit = CHARS_PER_TOKEN * n_ctx
    if chars > limit:
        raise WorkbenchError(
            f"prompt {printable(prompt.label) or '(unlabelled)'} has {chars} characters: too long "
            f"for {model}'s context of {n_ctx} tokens (at most {limit} characters, "
            f"{CHARS_PER_TOKEN} per token, are tokenized); split it at blank lines")


def content_token_range(model: TokenizingModel) -> tuple[int, int]:
    """Token ids to sample random tokens from: the middle of the vocabulary.

    Byte-pair vocabularies are ordered roughly by merge frequency, so the lowest ids are
    bytes and the most frequent fragments and the highest are rare merges; Olsson et al.
    2022 exclude both ends. We keep the middle 80% and skip special tokens.
    """
    vocab = len(model.tokenizer)
    return max(int(0.1 * vocab), 1), int(0.9 * vocab)


def random_token_ids(model: TokenizingModel, n: int, generator: torch.Generator) -> list[int]:
    """``n`` token ids drawn uniformly from :func:`content_token_range`, no special tokens."""
    low, high = content_token_range(model)
    special = set(model.tokenizer.all_special_ids)
    ids: list[int] = []
    while len(ids) < n:
        draw = torch.randint(low, high, (n,), generator=generator).tolist()
        ids.extend(t for t in draw if t not in special)
    return ids[:n]


@prompt_set("repeated-random")
def repeated_random(model: TokenizingModel,
                    n_prompts: Annotated[int, Range(min=1, max=MAX_PROMPTS)] = 8,
                    seq_len: Annotated[int, Range(min=1, max=MAX_SEQUENCE)] = 32,
                    repeats: Annotated[int, Range(min=1, max=MAX_REPEATS)] = 2,
                    seed: Annotated[int, SEED] = 0) -> Iterator[Prompt]:
    """Random token sequences repeated ``repeats`` times, after BOS (causal models) or
    framed as ``[CLS] ... [SEP]`` (encoders).

    The standard input for induction: from the second repeat on, every token's successor
    can be copied from its earlier occurrence. The prompts are drawn one at a time, in
    the same order whatever is kept of them.
    """
    gen = torch.Generator().manual_seed(seed)
    for i in range(n_prompts):
        seq = random_token_ids(model, seq_len, gen)
        ids = model.frame(seq * repeats)
        yield Prompt(token_ids=tuple(ids), label=f"repeated-random[{i}]")
