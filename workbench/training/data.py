"""Training text that needs no download, a byte-pair tokenizer trained on it, and batches.

The corpus is assembled from text that ships with Python itself, plus any text files the
user supplies:

- ``pydoc``: the full text of every topic of the reference documentation
  (``pydoc_data.topics``, about 80 topics, 465k characters), prose and code samples alike;
- ``docstrings``: the docstrings of the modules, classes and functions of the standard
  library, read from its source files with :mod:`ast` (nothing is imported), about 6,500
  docstrings and 1.6M characters on CPython 3.11;
- any UTF-8 text files, each paragraph (blank-line separated) a document.

Each document goes to ``fit`` or ``heldout`` by the SHA-256 of its text (1 in
``heldout_every``), so identical documents (a docstring inherited by several classes)
never straddle the split. Documents are joined into one token stream with the end-of-text
token between them; a training sequence is a random window of that stream after BOS.

Examples:
    >>> corpus = build_corpus(("pydoc", "docstrings"))          # doctest: +SKIP
    >>> tok = train_tokenizer(corpus.fit, 2048, "/tmp/tok")      # doctest: +SKIP
    >>> stream = token_stream(tok, corpus.fit)                   # doctest: +SKIP
    >>> batch = sample_windows(stream, 16, 256, bos_id=tok.bos_token_id,
    ...                        generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
"""

from __future__ import annotations

import ast
import hashlib
import logging
import re
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Int
from torch import Tensor

from workbench.core.errors import WorkbenchError, printable
from workbench.core.files import read_text

log = logging.getLogger(__name__)

Source = Literal["pydoc", "docstrings"]
SOURCES: tuple[Source, ...] = ("pydoc", "docstrings")
BOS = "<|endoftext|>"
PAD = "<pad>"
# Folders of the standard library whose docstrings are not library documentation.
_SKIP_PARTS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo",
                         "pydoc_data", "ensurepip", "__phello__"})
MIN_DOCSTRING = 40


@dataclass(frozen=True)
class Corpus:
    """Documents split into ``fit`` and ``heldout``, with a fingerprint of the whole."""

    fit: tuple[str, ...]
    heldout: tuple[str, ...]
    sources: tuple[str, ...]
    sha256: str

    def describe(self) -> dict[str, Any]:
        return {"sources": list(self.sources), "sha256": self.sha256,
                "fit_documents": len(self.fit), "heldout_documents": len(self.heldout),
                "fit_chars": sum(map(len, self.fit)),
                "heldout_chars": sum(map(len, self.heldout))}


def pydoc_topics() -> list[str]:
    """The full text of each topic of the Python reference documentation, in name order."""
    from pydoc_data.topics import topics

    return [topics[name].strip() for name in sorted(topics) if topics[name].strip()]


def stdlib_docstrings(root: Path | None = None) -> list[str]:
    """Docstrings of the standard library's modules, classes and functions.

    Source files are parsed, never imported, in path order; docstrings shorter than
    ``MIN_DOCSTRING`` characters are dropped. Files that do not parse (none on CPython
    3.11) are skipped.
    """
    root = root or Path(sysconfig.get_paths()["stdlib"])
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP_PARTS & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            log.debug("skipping %s: does not parse", path)
            continue
        for node in ast.walk(tree):
            doc = ast.get_docstring(node) if isinstance(node, kinds) else None
            if doc and len(doc) >= MIN_DOCSTRING:
                docs.append(doc)
    return docs


MAX_TEXT_FILE = 64 << 20
"""The largest training text file read: 64 MiB is some 15M tokens, many times what a
training run here reads."""


def text_files(files: Sequence[str | Path]) -> list[str]:
    """The paragraphs (separated by blank lines) of UTF-8 text files, in order.

    Args:
        files: paths of regular files of at most :data:`MAX_TEXT_FILE` bytes.

    Returns:
        The paragraphs of every file, each one document.

    Raises:
        WorkbenchError: a file that cannot be read, is not a regular file, is too large,
            is not UTF-8 text or is empty (one line naming it).
    """
    docs = []
    for name in files:
        docs.extend(_paragraphs(name))
    return docs


def _paragraphs(name: str | Path) -> list[str]:
    what = f"training text {printable(str(name))}"
    text = read_text(Path(name).expanduser(), what="training text", limit=MAX_TEXT_FILE)
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    if not paragraphs:
        raise WorkbenchError(f"{what} is empty")
    return paragraphs


_CHECKED: set[tuple[str, int, int]] = set()
"""The versions (path, modification time, size) of training texts already checked."""


def check_text_files(files: Sequence[str | Path]) -> None:
    """Read and check each training text as :func:`text_files` does, before a run
    exists; each version of a file is read once, however often a config is built.

    Raises:
        WorkbenchError: as :func:`text_files`.
    """
    for name in files:
        path = Path(name).expanduser()
        try:
            st = path.stat()
            key = (str(path), st.st_mtime_ns, st.st_size)
        except (OSError, ValueError):
            key = None  # refused by the read below, with the reason
        if key in _CHECKED:
            continue
        _paragraphs(name)
        if key is not None:
            _CHECKED.add(key)


def _heldout(doc: str, every: int) -> bool:
    return int(hashlib.sha256(doc.encode()).hexdigest(), 16) % every == 0


def build_corpus(sources: Sequence[Source] = SOURCES, files: Sequence[str | Path] = (),
                 *, heldout_every: int = 10) -> Corpus:
    """Assemble the documents of ``sources`` and ``files`` and split them.

    Args:
        sources: built-in sources (``pydoc``, ``docstrings``).
        files: user text files, one document each.
        heldout_every: one document in this many (by hash) is held out.

    Raises:
        WorkbenchError: an unknown source, or a split left empty.
    """
    docs: list[str] = []
    for source in sources:
        if source not in SOURCES:
            raise WorkbenchError(f"unknown corpus source '{source}'; expected one of "
                                 f"{', '.join(SOURCES)}")
        docs += pydoc_topics() if source == "pydoc" else stdlib_docstrings()
    docs += text_files(files)
    fit = tuple(d for d in docs if not _heldout(d, heldout_every))
    heldout = tuple(d for d in docs if _heldout(d, heldout_every))
    if not fit or not heldout:
        empty = "fit" if not fit else "heldout"
        raise WorkbenchError(
            f"the corpus has {len(docs)} documents ({len(set(docs))} distinct) and none fell "
            f"in the {empty} split (one distinct document in {heldout_every} is held out, "
            "by hash); add sources or text files")
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(hashlib.sha256(doc.encode()).digest())
    names = [*sources, *(f"file:{Path(f).name}" for f in files)]
    return Corpus(fit, heldout, tuple(names), digest.hexdigest())


def train_tokenizer(texts: Sequence[str], vocab_size: int, folder: str | Path) -> Any:
    """Train a byte-level BPE tokenizer and save it as a Hugging Face tokenizer folder.

    The vocabulary holds the 256 byte symbols, merges up to ``vocab_size``, and two
    special tokens: ``<|endoftext|>`` (BOS, EOS and document separator) and ``<pad>``.
    Training is deterministic for the same texts and size.

    Returns:
        The ``PreTrainedTokenizerFast`` reloaded from ``folder`` (the bridge wants a
        tokenizer with a ``name_or_path``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 258 + 2:
        raise WorkbenchError("vocab_size must leave room for the 256 bytes and merges")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BOS, PAD], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=BOS, eos_token=BOS,
                                  pad_token=PAD, model_max_length=1 << 30)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(folder))
    return load_tokenizer(folder)


def load_tokenizer(folder: str | Path) -> Any:
    """A tokenizer saved by :func:`train_tokenizer`."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def token_stream(tokenizer: Any, texts: Sequence[str]) -> Int[Tensor, " token"]:
    """All texts tokenized and joined, each followed by the end-of-text token."""
    eot = tokenizer.convert_tokens_to_ids(BOS)
    ids: list[int] = []
    for encoded in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def sample_windows(stream: Int[Tensor, " token"], n: int, n_ctx: int, *, bos_id: int,
                   generator: torch.Generator, repeat_fraction: float = 0.0
                   ) -> Int[Tensor, "batch pos"]:
    """``n`` random windows of ``n_ctx - 1`` tokens of ``stream``, each after BOS.

    With ``repeat_fraction > 0``, that fraction of the windows (on average) gets a repeated
    passage (:func:`repeat_passage`). Everything random comes from ``generator`` alone, so
    the data order is reproducible and independent of the global RNG.
    """
    body = n_ctx - 1
    if len(stream) <= body:
        raise WorkbenchError(f"the token stream has {len(stream)} tokens, fewer than one "
                             f"window of {body}")
    offsets = torch.randint(0, len(stream) - body, (n,), generator=generator)
    windows = torch.stack([stream[o: o + body] for o in offsets.tolist()])
    if repeat_fraction > 0:
        chosen = torch.rand(n, generator=generator) < repeat_fraction
        for row in chosen.nonzero().flatten().tolist():
            windows[row] = repeat_passage(windows[row], generator)
    return torch.cat([torch.full((n, 1), bos_id, dtype=torch.long), windows], dim=1)


MIN_PASSAGE = 8


def repeat_passage(window: Int[Tensor, " pos"], generator: torch.Generator
                   ) -> Int[Tensor, " pos"]:
    """The window with one passage of it repeated later on, as text quotes itself.

    A passage of ``k`` tokens (``MIN_PASSAGE <= k <= len / 2``, uniform) at a random place
    is copied over the tokens at a random later place that does not overlap it; the rest of
    the window is untouched. Natural text repeats passages too (quotations, boilerplate,
    repeated names and phrases), but rarely within a short context; these repeats make the
    copying that induction heads do pay off often enough to learn within a laptop budget.
    """
    n = len(window)
    if n < 2 * MIN_PASSAGE:
        return window
    k = int(torch.randint(MIN_PASSAGE, n // 2 + 1, (1,), generator=generator))
    start = int(torch.randint(0, n - 2 * k + 1, (1,), generator=generator))
    copy_at = int(torch.randint(start + k, n - k + 1, (1,), generator=generator))
    out = window.clone()
    out[copy_at: copy_at + k] = window[start: start + k]
    return out


def batches(stream: Int[Tensor, " token"], batch_size: int, n_ctx: int, *, bos_id: int,
            seed: int, repeat_fraction: float = 0.0) -> Iterator[Int[Tensor, "batch pos"]]:
    """An endless, reproducible sequence of training batches (see :func:`sample_windows`)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield sample_windows(stream, batch_size, n_ctx, bos_id=bos_id, generator=generator,
                             repeat_fraction=repeat_fraction)
