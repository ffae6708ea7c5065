"""Format 1 recordings (``index.json`` + ``attn/L*.bin`` + ``resid/B*.bin``), read-only.

Recordings written before the Zarr store (:mod:`workbench.recording.zarr_store`) keep
opening: :class:`workbench.recording.record.Recording` reads them through this module.
On disk::

    index.json         prompts, tokens, shapes, and for every block its offset and dtype
    attn/L{l:03d}.bin  layer l's patterns, prompt after prompt, each [head, query, key]
    resid/B{b:03d}.bin boundary b's residual stream, each [pos, d_model]

Nothing writes this format any more.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
BLOCK_DTYPES = {"float16": 2, "float32": 4}
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def count(value: Any, *, least: int = 0) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def header_problem(index: dict[str, Any]) -> str | None:
    """What is wrong with the fields every format shares (``None`` if nothing)."""
    if not isinstance(index.get("model"), dict):
        return "'model' is not an object"
    for key in ("n_layers", "n_heads", "d_model"):
        if not count(index.get(key), least=1):
            return f"'{key}' is not a positive integer"
    prompts = index.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        return "'prompts' is not a non-empty list"
    for i, prompt in enumerate(prompts):
        if (problem := prompt_problem(prompt)) is not None:
            return f"prompt {i}: {problem}"
    files = index.get("files")
    if not isinstance(files, dict):
        return "'files' is not an object"
    for rel, entry in files.items():
        if not (isinstance(entry, dict) and count(entry.get("size"))
                and isinstance(entry.get("sha256"), str) and SHA256.match(entry["sha256"])):
            return f"file {rel!r} has no size and sha256"
    return None


def prompt_problem(prompt: Any) -> str | None:
    """What is wrong with one entry of ``prompts`` (``None`` if nothing)."""
    if not isinstance(prompt, dict):
        return "not an object"
    if not isinstance(prompt.get("label"), str):
        return "'label' is not a string"
    for key in ("text", "pair"):
        if prompt.get(key) is not None and not isinstance(prompt[key], str):
            return f"'{key}' is not a string or null"
    ids, tokens = prompt.get("token_ids"), prompt.get("tokens")
    if not isinstance(ids, list) or not ids or not all(count(t) for t in ids):
        return "'token_ids' is not a non-empty list of token ids"
    if not isinstance(tokens, list) or len(tokens) != len(ids) \
            or not all(isinstance(t, str) for t in tokens):
        return "'tokens' is not a list of strings, one per token id"
    return None


def blocks_problem(index: dict[str, Any]) -> str | None:
    """Every layer has one block per prompt, of a known dtype, inside its listed file."""
    blocks, files = index.get("blocks"), index["files"]
    n_layers, n_heads, d_model = index["n_layers"], index["n_heads"], index["d_model"]
    if not isinstance(blocks, dict):
        return "'blocks' is not an object"
    kinds = {"attn": n_layers}
    if "resid/0" in blocks:
        kinds["resid"] = n_layers + 1
    lengths = [len(p["token_ids"]) for p in index["prompts"]]
    for kind, n_files in kinds.items():
        for layer in range(n_files):
            rel = data_file(kind, layer)
            entries = blocks.get(f"{kind}/{layer}")
            if rel not in files:
                return f"data file {rel} is not listed in 'files'"
            if not isinstance(entries, list) or len(entries) != len(lengths):
                return f"'blocks' has no {kind}/{layer} entry for each prompt"
            for n, entry in zip(lengths, entries, strict=True):
                if not (isinstance(entry, list) and len(entry) == 2 and count(entry[0])
                        and entry[1] in BLOCK_DTYPES):
                    return f"block {kind}/{layer} is not [offset, float16|float32]"
                size = n_heads * n * n if kind == "attn" else n * d_model
                if entry[0] + size * BLOCK_DTYPES[entry[1]] > files[rel]["size"]:
                    return f"a block of {kind}/{layer} lies beyond the end of {rel}"
    return None


def data_file(kind: str, layer: int) -> str:
    """The data file of layer (or boundary) ``layer`` of ``kind`` (``attn`` or ``resid``)."""
    return f"{kind}/{'L' if kind == 'attn' else 'B'}{layer:03d}.bin"


def block(root: Path, index: dict[str, Any], kind: str, layer: int, prompt: int,
          shape: tuple[int, ...]) -> np.memmap:
    """One prompt's block of a format-1 recording, memory-mapped (nothing else is read).

    Args:
        root: the recording folder.
        index: its checked ``index.json``.
        kind: ``attn`` (shape ``[head, query, key]``) or ``resid`` (``[pos, d_model]``).
        layer: the layer, or the boundary for ``resid``.
        prompt: the prompt.
        shape: the block's shape.

    Returns:
        The block, read-only.
    """
    offset, dtype = index["blocks"][f"{kind}/{layer}"][prompt]
    return np.memmap(root / data_file(kind, layer), dtype=dtype, mode="r", offset=offset,
                     shape=shape)
