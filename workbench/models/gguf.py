"""GGUF files: recognising one, what it holds, and dequantizing it into a Hugging Face folder.

``transformers`` reads GGUF (with the ``gguf`` package) and dequantizes every tensor to
float32; :func:`convert_gguf` saves that once as safetensors, so every later load is a
plain safetensors read. The cache keeps the converted folder: the bundled ``smollm2`` and
``gemma3`` at fetch time, a local ``.gguf`` file on its first load
(:func:`workbench.models.cache.open_gguf`).

A GGUF file names its family in its ``general.architecture`` field. :func:`model_class`
reads it from the file's header alone (the first field, in a file written by llama.cpp)
and refuses, before minutes of dequantization, a family the workbench cannot load
(:data:`workbench.models.adapters.FAMILIES_BY_GGUF`); the converted ``config.json`` then
names the Hugging Face class the model loaded as, which the conversion itself leaves out.

Examples:
    >>> digest = gguf_digest(Path("model.gguf"))                         # doctest: +SKIP
    >>> model_class(Path("model.gguf"))                                  # doctest: +SKIP
    'Gemma3ForCausalLM'
    >>> files, loaded_as = convert_gguf(Path("model.gguf"), Path("out/hf"))  # doctest: +SKIP
    >>> sorted(files)[:2], loaded_as                                     # doctest: +SKIP
    (['hf/config.json', 'hf/model.safetensors'], 'Gemma3ForCausalLM')
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import BinaryIO, Literal

from gguf import GGUFValueType

from workbench.core import checksums
from workbench.core.errors import WorkbenchError, printable
from workbench.models import adapters

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
ARCHITECTURE_KEY = "general.architecture"
_SIZES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
          GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4,
          GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4, GGUFValueType.UINT64: 8,
          GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}
"""Bytes of each fixed-size GGUF value type."""
_MAX_STRING = 1 << 16
GGUF_VERSIONS = (2, 3)
"""The GGUF format versions the ``gguf`` package's reader (which ``transformers`` uses) reads."""


def convert_gguf(gguf_path: Path, out_dir: Path) -> tuple[dict[str, str], str]:
    """Dequantize a GGUF file into a Hugging Face folder (config, tokenizer, safetensors).

    The family is checked first (:func:`model_class`), so a file the workbench cannot load
    is refused before the dequantization; ``config.json`` names the class it loaded as.

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: the folder to write (created).

    Returns:
        ``({path relative to out_dir's parent: sha256} of the files written, the Hugging
        Face class the model loaded as)``.

    Raises:
        WorkbenchError: the file's architecture cannot be loaded (naming the ones that
            can), or it loaded as a class no family adapter knows.
    """
    model_class(gguf_path)
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.hf import quiet_transformers

    quiet_transformers()
    log.info("dequantizing %s (once; later loads read safetensors)", gguf_path.name)
    folder, fname = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    loaded_as = type(model).__name__
    if loaded_as not in adapters.FAMILIES_BY_ARCHITECTURE:
        raise WorkbenchError(f"{gguf_path} loaded as {loaded_as}, which no model family of "
                             "the workbench has")
    out_dir.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses GGUF-quantized models; the weights are plain float32 now, so
    # write them directly (save_model keeps one copy of the tied embedding/unembedding).
    safetensors.torch.save_model(model, str(out_dir / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    # The conversion leaves "architectures" null; the bridge picks its adapter by it.
    config["architectures"] = [loaded_as]
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(str(out_dir))
    files = {str(p.relative_to(out_dir.parent)): checksums.sha256_file(p)
             for p in sorted(out_dir.iterdir()) if p.is_file()}
    return files, loaded_as


def model_class(path: Path) -> str:
    """The Hugging Face class a GGUF file loads as, from its ``general.architecture``.

    Args:
        path: a ``.gguf`` file.

    Returns:
        The class name (``LlamaForCausalLM``, ``Gemma3ForCausalLM``).

    Raises:
        WorkbenchError: the file's header cannot be read, or its architecture is not one
            the workbench can load (the message names those it can).
    """
    arch = architecture(path)
    adapter = adapters.FAMILIES_BY_GGUF.get(arch)
    if adapter is None:
        raise WorkbenchError(f"{path} is a GGUF model of architecture '{printable(arch)}', which "
                             "the workbench cannot load; GGUF architectures it loads: "
                             f"{', '.join(sorted(adapters.FAMILIES_BY_GGUF))}")
    return adapter.architectures[0]


def architecture(path: Path) -> str:
    """The ``general.architecture`` field of a GGUF file, read from its header only.

    The metadata fields are walked in order up to that one, skipping values without
    reading them, so a file whose vocabulary fills the header is read in a moment.

    Raises:
        WorkbenchError: the file cannot be read, is not a GGUF file, or its header is
            damaged or has no architecture field.
    """
    try:
        with open(path, "rb") as fh:
            return _find_architecture(_Header(fh, os.fstat(fh.fileno()).st_size))
    except OSError as exc:
        raise WorkbenchError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise WorkbenchError(f"{path} could not be read as a GGUF model: {exc}") from None


class _Header:
    """Sequential reads of a GGUF header, every length checked against the file's size."""

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self.fh, self.size = fh, size
        self.order: Literal["little", "big"] = "little"

    def read(self, n: int) -> bytes:
        if n > self.size - self.fh.tell():
            raise ValueError("its header ends early")
        return self.fh.read(n)

    def uint(self, n: int) -> int:
        return int.from_bytes(self.read(n), self.order)

    def skip(self, n: int) -> None:
        if n > self.size - self.fh.tell():
            raise ValueError("its header ends early")
        self.fh.seek(n, os.SEEK_CUR)

    def string(self) -> str:
        n = self.uint(8)
        if n > _MAX_STRING:
            raise ValueError(f"a metadata key or name of {n} bytes")
        return self.read(n).decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> None:
        """Skip one value of GGUF value type ``kind``."""
        if kind in _SIZES:
            self.skip(_SIZES[GGUFValueType(kind)])
        elif kind == GGUFValueType.STRING:
            self.skip(self.uint(8))
        elif kind == GGUFValueType.ARRAY:
            item, count = self.uint(4), self.uint(8)
            if item in _SIZES:
                self.skip(count * _SIZES[GGUFValueType(item)])
            else:  # each item takes at least 8 bytes, so a damaged count soon ends the file
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"an unknown metadata value type {kind}")


def _find_architecture(header: _Header) -> str:
    if header.read(4) != GGUF_MAGIC:
        raise ValueError("it does not start with the GGUF magic bytes")
    version = header.uint(4)
    if version & 0xFFFF == 0:  # a file written on a big-endian machine
        header.order = "big"
        version = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}; versions 2 and 3 are read")
    header.skip(8)  # the tensor count
    for _ in range(header.uint(8)):
        key, kind = header.string(), header.uint(4)
        if key != ARCHITECTURE_KEY:
            header.skip_value(kind)
        elif kind != GGUFValueType.STRING:
            raise ValueError(f"its {ARCHITECTURE_KEY} is not a string")
        else:
            return header.string()
    raise ValueError(f"it has no {ARCHITECTURE_KEY} field")


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
