"""Load any supported model by name: the one dispatcher over every model source.

A model argument may be a bundled model (:data:`workbench.models.zoo.MODELS`), a Hugging
Face hub id (needs a network the first time), a local Hugging Face folder, a local
``.gguf`` file, or a checkpoint the workbench trained (``<run-id>:<step>``, or
``<run-id>/L<n>:<step>`` for the n-layer model of a run that trained several; see
:mod:`workbench.models.checkpoints`). Every route ends in the same place: a
:class:`~workbench.models.base.Model`.

Examples:
    >>> model = load_model("smollm2")                      # doctest: +SKIP
    >>> model.info.n_layers                                # doctest: +SKIP
    30
"""

from __future__ import annotations

import logging
import re
import socket
import time
from pathlib import Path
from typing import Any

from workbench.core import checksums, paths
from workbench.core.errors import WorkbenchError
from workbench.core.options import Dtype
from workbench.models import checkpoints, zoo
from workbench.models.base import DTYPES, Model, ModelInfo
from workbench.models.hf import boot_folder, folder_checksum

log = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^(?P<run>[\w.\-]+(?:/L\d+)?):(?P<step>\d+)$")
_HUB_HOST = ("huggingface.co", 443)


def load_model(name: str, *, dtype: Dtype = "float32", device: str = "cpu") -> Model:
    """Load a model by name (see the module docstring for the accepted forms).

    Args:
        name: bundled name, hub id, local folder, ``.gguf`` file, or ``<run-id>:<step>``.
        dtype: parameter dtype; float32 by default.
        device: torch device, ``"cpu"`` by default.

    Raises:
        UnknownNameError / WorkbenchError: with the known names, or why the model cannot
            be loaded (not fetched, corrupt, no network for a hub id).
    """
    if dtype not in DTYPES:
        raise WorkbenchError(f"unknown dtype '{dtype}'; expected one of {', '.join(DTYPES)}")
    start = time.perf_counter()
    if name in zoo.MODELS:
        model = _load_bundled(name, dtype, device)
    elif (m := _CHECKPOINT.match(name)) and not Path(name).exists():
        model = checkpoints.load(m["run"], int(m["step"]), dtype=dtype, device=device)
    elif Path(name).expanduser().exists():
        model = _load_path(Path(name).expanduser(), dtype, device)
    else:
        model = _load_hub(name, dtype, device)
    info = _replace(model.info, load_seconds=round(time.perf_counter() - start, 3))
    model.info = info
    log.info("loaded %s in %.2fs", name, info.load_seconds)
    return model


def _replace(info: ModelInfo, **changes: Any) -> ModelInfo:
    return ModelInfo(**{**info.to_dict(), **changes})


def _load_bundled(name: str, dtype: Dtype, device: str) -> Model:
    spec = zoo.MODELS.get(name)
    if not zoo.is_cached(name):
        log.info("%s is not in the cache yet; fetching it", name)
        zoo.fetch(name)
    manifest = zoo.verify_cached(name)
    return boot_folder(
        zoo.hf_dir(name), name=name, source=spec.source, checksum=manifest["weights_sha256"],
        dtype=dtype, device=device, bos_token=spec.bos_token, has_lm_head=spec.has_lm_head,
    )


def _load_path(path: Path, dtype: Dtype, device: str) -> Model:
    if path.is_file() and path.suffix == ".gguf":
        digest = checksums.sha256_file(path)
        out = paths.cache_dir() / "models" / f"gguf-{digest[:16]}" / "hf"
        if not (out / "config.json").is_file():
            zoo.convert_gguf(path, out)
        return boot_folder(out, name=str(path), source="local GGUF file", checksum=digest,
                           dtype=dtype, device=device)
    if path.is_dir() and (path / "config.json").is_file():
        return boot_folder(path, name=str(path), source="local folder",
                           checksum=folder_checksum(path), dtype=dtype, device=device)
    raise WorkbenchError(
        f"{path} is neither a Hugging Face model folder (with config.json) nor a .gguf file"
    )


def _load_hub(name: str, dtype: Dtype, device: str) -> Model:
    from transformers import AutoConfig

    known = ", ".join(zoo.MODELS.names())
    try:  # a model already in the Hugging Face cache loads without a network
        AutoConfig.from_pretrained(name, local_files_only=True)
        cached = True
    except (OSError, ValueError):
        cached = False
    if not cached and not _hub_reachable():
        raise WorkbenchError(
            f"'{name}' is not a bundled model ({known}), a local folder or a .gguf file, and "
            "the Hugging Face hub is unreachable (no network), so it cannot be downloaded"
        )
    try:
        return boot_folder(name, name=name, source="Hugging Face hub", checksum="",
                           dtype=dtype, device=device, local_files_only=cached)
    except OSError as exc:
        raise WorkbenchError(
            f"'{name}' is not a bundled model ({known}) and could not be loaded from the "
            f"Hugging Face hub: {str(exc).splitlines()[0]}"
        ) from None


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(_HUB_HOST, timeout=timeout):
            return True
    except OSError:
        return False
