"""Prompts and named prompt sets.

A prompt set is either a file in ``data/prompts/`` (the folder is its registry: ``NAME.txt``
holds one prompt per paragraph, ``NAME.tsv`` one sentence pair per line, separated by a tab)
or a generator registered with :func:`prompt_set`, which may depend on the model (random
token ids are drawn from its vocabulary). A generator's parameters are typed like config
fields, ranges included (``seq_len: Annotated[int, Range(min=1)] = 32``), and every value
given by name is checked against them (:func:`check_prompt_params`) before the model is
needed: ``--set seq_len=-5`` is refused with a message naming the parameter.

Examples:
    >>> from workbench.inputs.prompts import load_prompt_set
    >>> prompts = load_prompt_set("natural")          # doctest: +SKIP
    >>> prompts[0].text[:20]                          # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import torch

from workbench.core import paths
from workbench.core.errors import ConfigError, UnknownNameError, WorkbenchError
from workbench.core.registry import Registry, did_you_mean
from workbench.core.values import SEED, Range, check_keywords, keyword_types

if TYPE_CHECKING:
    from workbench.models.base import Model


@dataclass(frozen=True)
class Prompt:
    """One input: text (with an optional second segment for encoders) or token ids."""

    text: str | None = None
    pair: str | None = None
    token_ids: tuple[int, ...] | None = None
    label: str = ""


Generator = Callable[..., list[Prompt]]
GENERATORS: Registry[Generator] = Registry("prompt set")


def prompt_set(name: str) -> Callable[[Generator], Generator]:
    """Register a generated prompt set: ``fn(model, **params) -> list[Prompt]``.

    Every parameter after ``model`` needs a type annotation and a default; numbers carry
    their range as ``Annotated[int, Range(min=1)]``. A parameter without an annotation is
    a programming error, raised at registration.
    """

    def wrap(fn: Generator) -> Generator:
        untyped = [k for k, tp in keyword_types(fn, skip=1).items() if tp is Any]
        if untyped:
            raise TypeError(f"prompt set '{name}': parameters without a type: {untyped}")
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
    """Raise :class:`UnknownNameError` (listing the known sets) unless ``name`` exists."""
    if name not in prompt_set_names():
        raise UnknownNameError(
            f"unknown prompt set '{name}'{did_you_mean(name, prompt_set_names())}; "
            f"known prompt sets: {', '.join(prompt_set_names())}"
        )


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
    """
    check_prompt_set(name)
    if name in file_sets():
        if params:
            raise ConfigError(f"prompt set '{name}' is a file and takes no parameters "
                              f"(got {', '.join(params)})")
        return {}
    return check_keywords(GENERATORS.get(name), params, what=f"prompt set '{name}'", skip=1)


def load_prompt_set(name: str, model: Model | None = None, **params: Any) -> list[Prompt]:
    """The prompts of a named set.

    Args:
        name: a file in ``data/prompts`` or a registered generator.
        model: needed by generators that draw token ids.
        params: generator parameters (e.g. ``n_prompts``, ``seed``), checked by
            :func:`check_prompt_params`.

    Raises:
        UnknownNameError: listing the known prompt sets.
        ConfigError: a parameter that is unknown, of the wrong type or out of range.
    """
    params = check_prompt_params(name, params)
    files = file_sets()
    if name in files:
        return read_prompt_file(files[name])
    if model is None:
        raise WorkbenchError(f"prompt set '{name}' is generated from a model's vocabulary")
    return GENERATORS.get(name)(model, **params)


def read_prompt_file(path: Path) -> list[Prompt]:
    """Read a ``.txt`` (paragraphs) or ``.tsv`` (sentence pairs) prompt file.

    Raises:
        WorkbenchError: the file cannot be read, is not UTF-8, or has a malformed line.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkbenchError(f"cannot read prompt set {path}: {exc}") from None
    if path.suffix == ".tsv":
        prompts = []
        for i, line in enumerate(ln for ln in text.splitlines() if ln.strip()):
            a, sep, b = line.partition("\t")
            if not sep:
                raise WorkbenchError(f"{path.name} line {i + 1}: expected 'sentence<TAB>sentence'")
            prompts.append(Prompt(text=a.strip(), pair=b.strip(), label=f"{path.stem}[{i}]"))
        return prompts
    return prompts_from_text(text, label=path.stem)


def prompts_from_text(text: str, label: str = "text") -> list[Prompt]:
    """Split text into prompts at blank lines (a text with none is one prompt)."""
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    paragraphs = [p for p in paragraphs if p]
    if not paragraphs:
        raise WorkbenchError("the text is empty")
    return [Prompt(text=p, label=f"{label}[{i}]") for i, p in enumerate(paragraphs)]


def content_token_range(model: Model) -> tuple[int, int]:
    """Token ids to sample random tokens from: the middle of the vocabulary.

    Byte-pair vocabularies are ordered roughly by merge frequency, so the lowest ids are
    bytes and the most frequent fragments and the highest are rare merges; Olsson et al.
    2022 exclude both ends. We keep the middle 80% and skip special tokens.
    """
    vocab = len(model.tokenizer)
    return max(int(0.1 * vocab), 1), int(0.9 * vocab)


def random_token_ids(model: Model, n: int, generator: torch.Generator) -> list[int]:
    """``n`` token ids drawn uniformly from :func:`content_token_range`, no special tokens."""
    low, high = content_token_range(model)
    special = set(model.tokenizer.all_special_ids)
    ids: list[int] = []
    while len(ids) < n:
        draw = torch.randint(low, high, (n,), generator=generator).tolist()
        ids.extend(t for t in draw if t not in special)
    return ids[:n]


@prompt_set("repeated-random")
def repeated_random(model: Model, n_prompts: Annotated[int, Range(min=1)] = 8,
                    seq_len: Annotated[int, Range(min=1)] = 32,
                    repeats: Annotated[int, Range(min=1)] = 2,
                    seed: Annotated[int, SEED] = 0) -> list[Prompt]:
    """Random token sequences repeated ``repeats`` times, after BOS (causal models) or
    framed as ``[CLS] ... [SEP]`` (encoders).

    The standard input for induction: from the second repeat on, every token's successor
    can be copied from its earlier occurrence.
    """
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(n_prompts):
        seq = random_token_ids(model, seq_len, gen)
        ids = model.frame(seq * repeats)
        prompts.append(Prompt(token_ids=tuple(ids), label=f"repeated-random[{i}]"))
    return prompts
