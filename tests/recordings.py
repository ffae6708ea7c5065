"""A format-1 recording writer (the block files the workbench wrote before Zarr), so tests
can check that such recordings still open. It is the old writer's logic, kept only here."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from workbench.core import checksums
from workbench.recording.reader import Recording


def write_format1(source: Recording, out: Path) -> Path:
    """Write ``source`` (a dense recording, any format) as a format-1 recording in ``out``.

    Blocks are float16, as the old writer stored them unless a value overflowed it.
    """
    out.mkdir(parents=True)
    kinds = {"attn": source.n_layers}
    if source.has_resid:
        kinds["resid"] = source.n_layers + 1
    files, blocks = {}, {}
    for kind, count in kinds.items():
        (out / kind).mkdir()
        for layer in range(count):
            rel = f"{kind}/{'L' if kind == 'attn' else 'B'}{layer:03d}.bin"
            data, entries = bytearray(), []
            for prompt in range(len(source)):
                array = (source.pattern(prompt, layer) if kind == "attn"
                         else source.resid(prompt, layer)).astype(np.float16)
                entries.append([len(data), "float16"])
                data += array.tobytes()
            (out / rel).write_bytes(bytes(data))
            files[rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            blocks[f"{kind}/{layer}"] = entries
    index = {
        "format_version": 1, "model": source.model.to_data(), "n_layers": source.n_layers,
        "n_heads": source.n_heads, "d_model": source.d_model, "store_dtype": "float16",
        "prompts": [{"label": p.label, "text": p.text, "pair": p.pair,
                     "token_ids": p.token_ids, "tokens": p.tokens} for p in source.prompts],
        "blocks": blocks, "files": files,
    }
    checksums.write_json_atomic(out / "index.json", index)
    return out
