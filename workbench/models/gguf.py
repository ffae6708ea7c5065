"""GGUF files: recognising one, and dequantizing it into a Hugging Face folder.

``transformers`` reads GGUF (with the ``gguf`` package) and dequantizes every tensor to
float32; :func:`convert_gguf` saves that once as safetensors, so every later load is a
plain safetensors read. The cache keeps the converted folder: the bundled ``smollm2`` at
fetch time, a local ``.gguf`` file on its first load
(:func:`workbench.models.cache.open_gguf`).

Examples:
    >>> digest = gguf_digest(Path("model.gguf"))                         # doctest: +SKIP
    >>> files = convert_gguf(Path("model.gguf"), Path("out/hf"))         # doctest: +SKIP
    >>> sorted(files)[:2]                                                # doctest: +SKIP
    ['hf/config.json', 'hf/model.safetensors']
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from workbench.core import checksums
from workbench.core.errors import WorkbenchError

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
"""The GGUF format versions the ``gguf`` package's reader (which ``transformers`` uses) reads."""


def convert_gguf(gguf_path: Path, out_dir: Path) -> dict[str, str]:
    """Dequantize a GGUF file into a Hugging Face folder (config, tokenizer, safetensors).

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: the folder to write (created).

    Returns:
        ``{path relative to out_dir's parent: sha256}`` for the files written.
    """
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.hf import quiet_transformers

    quiet_transformers()
    log.info("dequantizing %s (once; later loads read safetensors)", gguf_path.name)
    folder, fname = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses GGUF-quantized models; the weights are plain float32 now, so
    # write them directly (save_model keeps one copy of the tied embedding/unembedding).
    safetensors.torch.save_model(model, str(out_dir / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(str(out_dir))
    return {
        str(p.relative_to(out_dir.parent)): checksums.sha256_file(p)
        for p in sorted(out_dir.iterdir())
        if p.is_file()
    }


def check_gguf(path: Path, *, version: bool = True) -> None:
    """Refuse a file that does not start like a GGUF model: the magic bytes, then (with
    ``version``) a format version the reader knows. Reads 8 bytes, so a plan can check a
    model without hashing or converting it.

    Args:
        path: the file.
        version: check the format version too (conversion reports it otherwise).

    Raises:
        WorkbenchError: the file cannot be read or is not a GGUF file.
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(GGUF_MAGIC) + 4)
    except OSError as exc:
        raise WorkbenchError(f"cannot read {path}: {exc.strerror}") from None
    if head[:len(GGUF_MAGIC)] != GGUF_MAGIC:
        raise WorkbenchError(f"{path} is not a GGUF file (it does not start with the GGUF "
                             "magic bytes); expected a .gguf model file")
    found = int.from_bytes(head[len(GGUF_MAGIC):], "little") if len(head) == 8 else None
    if version and found not in GGUF_VERSIONS:
        raise WorkbenchError(f"{path} is not a GGUF file this workbench reads (format version "
                             f"{found if found is not None else 'missing'}; expected "
                             f"{' or '.join(map(str, GGUF_VERSIONS))})")


def gguf_digest(path: Path) -> str:
    """SHA-256 of a local GGUF file, after checking that it starts like one.

    Raises:
        WorkbenchError: the file cannot be read or is not a GGUF file.
    """
    check_gguf(path, version=False)  # converting it says what else is wrong
    try:
        return checksums.sha256_file(path)
    except OSError as exc:
        raise WorkbenchError(f"cannot read {path}: {exc.strerror}") from None
