"""Record the residual stream and every attention pattern to disk, and read them back lazily.

:func:`record` hooks the bridge so that each layer's attention patterns and residual stream
are written to disk as soon as the forward pass produces them; nothing accumulates in
memory, so peak memory does not grow with the number of layers or prompts. Blocks are
stored as float16 unless a value would overflow it (smollm2's residual stream reaches about
2.5e4 at the first token, near float16's limit of 65504): such a block is kept in float32,
so nothing is ever silently clipped to infinity.

On disk (``recording/`` inside a run)::

    index.json         prompts, tokens, shapes, and for every block its offset and dtype
    attn/L{l:03d}.bin  layer l's patterns, prompt after prompt, each [head, query, key]
    resid/B{b:03d}.bin boundary b's residual stream, each [pos, d_model]

Examples:
    >>> rec = Recording.open("data/runs/<run-id>")        # doctest: +SKIP
    >>> rec.tokens(0)[:3], rec.pattern(0, layer=3, head=1).shape   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from jaxtyping import Float

from workbench.core import checksums, progress
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.options import StoreDtype
from workbench.inputs.batching import Batch, make_batches
from workbench.inputs.prompts import Prompt
from workbench.models.base import Model
from workbench.recording import hooks
from workbench.store.validate import confined_file, real

FLOAT16_MAX = float(np.finfo(np.float16).max)
INDEX = "index.json"
FORMAT_VERSION = 1


class _BlockFile:
    """An append-only binary file of blocks, hashed as it is written."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fh: IO[bytes] = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.offset = 0
        self.digest = hashlib.sha256()

    def append(self, array: np.ndarray) -> int:
        data = np.ascontiguousarray(array).tobytes()
        start = self.offset
        self.fh.write(data)
        self.digest.update(data)
        self.offset += len(data)
        return start

    def close(self) -> dict[str, Any]:
        self.fh.close()
        return {"sha256": self.digest.hexdigest(), "size": self.offset}


def _storable(block: torch.Tensor, dtype: StoreDtype) -> np.ndarray:
    """The block as a numpy array in ``dtype``, or float32 when float16 would overflow."""
    block = block.detach().float()
    if dtype == "float16" and float(block.abs().max()) <= FLOAT16_MAX:
        return block.half().numpy()
    return block.numpy()


class _Writer:
    """Hook functions that append each prompt's slice of a layer's tensors to disk."""

    def __init__(self, root: Path, n_layers: int, store_dtype: StoreDtype,
                 include_resid: bool = True) -> None:
        self.store_dtype = store_dtype
        self.files = {("attn", layer): _BlockFile(root / "attn" / f"L{layer:03d}.bin")
                      for layer in range(n_layers)}
        if include_resid:
            self.files.update({("resid", b): _BlockFile(root / "resid" / f"B{b:03d}.bin")
                               for b in range(n_layers + 1)})
        # (kind, layer) -> {prompt index: [offset, dtype]}
        self.blocks: dict[tuple[str, int], dict[int, list[Any]]] = {k: {} for k in self.files}
        self.batch: Batch | None = None

    def hook_fns(self, n_layers: int) -> list[tuple[str, Any]]:
        fns = [(hooks.pattern(layer), self._make_hook("attn", layer)) for layer in range(n_layers)]
        if ("resid", 0) in self.files:
            fns += [(hooks.resid(b, n_layers), self._make_hook("resid", b))
                    for b in range(n_layers + 1)]
        return fns

    def last_hook(self, n_layers: int) -> str:
        """The last hook point whose tensor is written; the forward pass stops there."""
        if ("resid", 0) in self.files:
            return hooks.resid(n_layers, n_layers)
        return hooks.pattern(n_layers - 1)

    def _make_hook(self, kind: str, layer: int):
        def hook(tensor: torch.Tensor, hook: Any) -> None:
            assert self.batch is not None
            rows = zip(self.batch.indices, self.batch.lengths, strict=True)
            for row, (index, n) in enumerate(rows):
                part = tensor[row, :, :n, :n] if kind == "attn" else tensor[row, :n]
                array = _storable(part, self.store_dtype)
                offset = self.files[(kind, layer)].append(array)
                self.blocks[(kind, layer)][index] = [offset, str(array.dtype)]

        return hook

    def close(self) -> dict[str, Any]:
        return {f"{kind}/{f.path.name}": f.close() for (kind, _), f in self.files.items()}


def record(model: Model, prompts: Sequence[Prompt], out: str | Path, *,
           store_dtype: StoreDtype = "float16", max_batch_tokens: int = 2048,
           include_resid: bool = True) -> Recording:
    """Run ``model`` on ``prompts`` and write a recording into folder ``out``.

    Args:
        model: the model to record.
        prompts: texts, sentence pairs or token ids; lengths may differ.
        out: a new or empty folder.
        store_dtype: ``float16`` (default; falls back to float32 per block on overflow)
            or ``float32``.
        max_batch_tokens: prompts are right-padded into batches of at most this many tokens.
        include_resid: also record the residual stream (patterns only when false).

    Returns:
        The recording, opened for reading.

    Raises:
        WorkbenchError: an empty prompt, or one longer than the model's context.
    """
    if not prompts:
        raise WorkbenchError("no prompts to record")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    encoded = [model.encode(p) for p in prompts]
    n_layers = model.info.n_layers
    writer = _Writer(root, n_layers, store_dtype, include_resid)
    batches = list(make_batches(encoded, pad_id=model.pad_id, max_tokens=max_batch_tokens))
    try:
        with torch.inference_mode():
            for batch in progress.track(batches, desc="recording"):
                writer.batch = batch
                hooks.run_hooked(model.bridge, batch, writer.hook_fns(n_layers),
                                 stop_after=writer.last_hook(n_layers))
    finally:
        files = writer.close()
    index = {
        "format_version": FORMAT_VERSION,
        "model": model.info.to_dict(),
        "n_layers": n_layers,
        "n_heads": model.info.n_heads,
        "d_model": model.info.d_model,
        "store_dtype": store_dtype,
        "prompts": [
            {"label": p.label, "text": p.text, "pair": p.pair, "token_ids": ids,
             "tokens": model.str_tokens(ids)}
            for p, (ids, _) in zip(prompts, encoded, strict=True)
        ],
        "blocks": {f"{kind}/{layer}": [writer.blocks[(kind, layer)][i] for i in range(len(prompts))]
                   for (kind, layer) in writer.blocks},
        "files": files,
    }
    checksums.write_json_atomic(root / INDEX, index)
    return Recording.open(root)


MAX_INDEX = 256 << 20
"""An ``index.json`` larger than this is not one (a big recording's is tens of megabytes)."""
_BLOCK_DTYPES = {"float16": 2, "float32": 4}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _read_index(root: Path) -> dict[str, Any]:
    """``index.json`` of recording folder ``root``, parsed and checked.

    Raises:
        WorkbenchError: unreadable, not JSON, or not the shape of an index.
    """
    where = root / INDEX
    file = confined_file(root, INDEX, what=f"recording {root}")
    try:
        with open(file, "rb") as fh:
            data = fh.read(MAX_INDEX + 1)
    except OSError as exc:
        raise WorkbenchError(f"cannot read {where} ({exc.strerror})") from None
    if len(data) > MAX_INDEX:
        raise WorkbenchError(f"{where} is larger than {MAX_INDEX >> 20} MiB: not an index")
    try:
        index = json.loads(data)
    except (ValueError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WorkbenchError(f"{where} is not valid JSON ({first}): the recording is "
                             "damaged") from None
    if (problem := _index_problem(index)) is not None:
        raise WorkbenchError(f"{where}: {problem}: the recording is damaged")
    return index


def _count(value: Any, *, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _index_problem(index: Any) -> str | None:
    """What is wrong with a parsed ``index.json`` (``None`` if nothing)."""
    if not isinstance(index, dict):
        return f"holds {type(index).__name__}, expected an object"
    if index.get("format_version") != FORMAT_VERSION:
        return (f"format_version {index.get('format_version')!r} is not supported "
                f"(expected {FORMAT_VERSION})")
    if not isinstance(index.get("model"), dict):
        return "'model' is not an object"
    for key in ("n_layers", "n_heads", "d_model"):
        if not _count(index.get(key), least=1):
            return f"'{key}' is not a positive integer"
    prompts = index.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        return "'prompts' is not a non-empty list"
    for i, prompt in enumerate(prompts):
        if (problem := _prompt_problem(prompt)) is not None:
            return f"prompt {i}: {problem}"
    files = index.get("files")
    if not isinstance(files, dict):
        return "'files' is not an object"
    for rel, entry in files.items():
        if not (isinstance(entry, dict) and _count(entry.get("size"))
                and isinstance(entry.get("sha256"), str) and _SHA256.match(entry["sha256"])):
            return f"file {rel!r} has no size and sha256"
    return _blocks_problem(index)


def _prompt_problem(prompt: Any) -> str | None:
    if not isinstance(prompt, dict):
        return "not an object"
    if not isinstance(prompt.get("label"), str):
        return "'label' is not a string"
    for key in ("text", "pair"):
        if prompt.get(key) is not None and not isinstance(prompt[key], str):
            return f"'{key}' is not a string or null"
    ids, tokens = prompt.get("token_ids"), prompt.get("tokens")
    if not isinstance(ids, list) or not ids or not all(_count(t) for t in ids):
        return "'token_ids' is not a non-empty list of token ids"
    if not isinstance(tokens, list) or len(tokens) != len(ids) \
            or not all(isinstance(t, str) for t in tokens):
        return "'tokens' is not a list of strings, one per token id"
    return None


def _blocks_problem(index: dict[str, Any]) -> str | None:
    """Every layer has one block per prompt, of a known dtype, inside its listed file."""
    blocks, files = index.get("blocks"), index["files"]
    n_layers, n_heads, d_model = index["n_layers"], index["n_heads"], index["d_model"]
    if not isinstance(blocks, dict):
        return "'blocks' is not an object"
    kinds = {"attn": n_layers}
    if "resid/0" in blocks:
        kinds["resid"] = n_layers + 1
    lengths = [len(p["token_ids"]) for p in index["prompts"]]
    for kind, count in kinds.items():
        for layer in range(count):
            rel = f"{kind}/{'L' if kind == 'attn' else 'B'}{layer:03d}.bin"
            entries = blocks.get(f"{kind}/{layer}")
            if rel not in files:
                return f"data file {rel} is not listed in 'files'"
            if not isinstance(entries, list) or len(entries) != len(lengths):
                return f"'blocks' has no {kind}/{layer} entry for each prompt"
            for n, entry in zip(lengths, entries, strict=True):
                if not (isinstance(entry, list) and len(entry) == 2 and _count(entry[0])
                        and entry[1] in _BLOCK_DTYPES):
                    return f"block {kind}/{layer} is not [offset, float16|float32]"
                size = n_heads * n * n if kind == "attn" else n * d_model
                if entry[0] + size * _BLOCK_DTYPES[entry[1]] > files[rel]["size"]:
                    return f"a block of {kind}/{layer} lies beyond the end of {rel}"
    return None


@dataclass(frozen=True)
class RecordedPrompt:
    label: str
    text: str | None
    pair: str | None
    token_ids: list[int]
    tokens: list[str]


class Recording:
    """Lazy, read-only access to a recording: each call reads one slice from disk."""

    def __init__(self, root: Path, index: dict[str, Any]) -> None:
        self.root = root
        self._index = index
        self.model: dict[str, Any] = index["model"]
        self.n_layers: int = index["n_layers"]
        self.n_heads: int = index["n_heads"]
        self.d_model: int = index["d_model"]
        self.prompts = [
            RecordedPrompt(p["label"], p["text"], p["pair"], p["token_ids"], p["tokens"])
            for p in index["prompts"]
        ]

    @classmethod
    def open(cls, path: str | Path) -> Recording:
        """Open a recording folder, or the run folder that holds one.

        ``index.json`` is checked before anything else is read: its shape and types, every
        data file it lists being a regular file inside the recording folder (symlinks
        resolved) with the recorded size, and every block lying within its file. A
        recording folder inside a run folder must resolve inside that run folder.

        Raises:
            WorkbenchError: no recording there, or an ``index.json`` that is not one (the
                message names the file and what is wrong).
            ChecksumError: a data file is missing or has the wrong size (truncated or
                replaced; :meth:`verify` also checks the SHA-256).
        """
        root = Path(path)
        if (root / "recording" / INDEX).is_file():
            root = root / "recording"
        if not (root / INDEX).is_file():
            raise WorkbenchError(f"no recording in {path} (expected {INDEX})")
        # a recording inside a run (recording/, example/) must not be a symlink out of it
        run_dir = root.parent if (root.parent / "run.json").is_file() else root
        if not real(root).is_relative_to(real(run_dir)):
            raise WorkbenchError(f"recording {root} leads outside its run folder {run_dir} "
                                 "(through a symlink)")
        index = _read_index(root)
        for rel, entry in index["files"].items():
            file = confined_file(root, rel, what=f"{root / INDEX} file")
            size = file.stat().st_size
            if size != entry["size"]:
                raise ChecksumError(
                    f"{root / rel} has {size} bytes, expected {entry['size']}: "
                    "the recording is damaged"
                )
        return cls(root, index)

    def verify(self) -> None:
        """Check every data file's SHA-256 against the index.

        Raises:
            ChecksumError: a file changed since it was written.
        """
        for rel, entry in self._index["files"].items():
            actual = checksums.sha256_file(self.root / rel)
            if actual != entry["sha256"]:
                raise ChecksumError(f"checksum mismatch for {self.root / rel}")

    def __len__(self) -> int:
        return len(self.prompts)

    def tokens(self, prompt: int) -> list[str]:
        """Token strings of prompt ``prompt``."""
        return self._prompt(prompt).tokens

    def pattern(self, prompt: int, layer: int, head: int | None = None
                ) -> Float[np.ndarray, "*head query key"]:
        """Attention weights ``[query, key]`` of one head, or ``[head, query, key]`` of all."""
        self._check(layer, self.n_layers, "layer")
        n = len(self._prompt(prompt).token_ids)
        block = self._block("attn", layer, prompt, (self.n_heads, n, n))
        if head is None:
            return np.array(block, dtype=np.float32)
        self._check(head, self.n_heads, "head")
        return np.array(block[head], dtype=np.float32)

    @property
    def has_resid(self) -> bool:
        return "resid/0" in self._index["blocks"]

    def resid(self, prompt: int, layer: int) -> Float[np.ndarray, "pos d_model"]:
        """Residual stream ``[pos, d_model]`` at boundary ``layer`` (0 .. n_layers)."""
        if not self.has_resid:
            raise WorkbenchError(f"{self.root} recorded attention patterns only")
        self._check(layer, self.n_layers + 1, "layer boundary")
        n = len(self._prompt(prompt).token_ids)
        return np.array(self._block("resid", layer, prompt, (n, self.d_model)), dtype=np.float32)

    def _prompt(self, prompt: int) -> RecordedPrompt:
        self._check(prompt, len(self.prompts), "prompt")
        return self.prompts[prompt]

    @staticmethod
    def _check(value: int, bound: int, what: str) -> None:
        if not 0 <= value < bound:
            raise WorkbenchError(f"{what} {value} is out of range 0..{bound - 1}")

    def _block(self, kind: str, layer: int, prompt: int, shape: tuple[int, ...]) -> np.memmap:
        offset, dtype = self._index["blocks"][f"{kind}/{layer}"][prompt]
        fname = f"L{layer:03d}.bin" if kind == "attn" else f"B{layer:03d}.bin"
        return np.memmap(self.root / kind / fname, dtype=dtype, mode="r", offset=offset,
                         shape=shape)
