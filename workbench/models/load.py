"""Load any supported model by name: the one dispatcher over every model source.

A model argument may be a bundled model (:data:`workbench.models.zoo.MODELS`), a Hugging
Face hub id (needs a network the first time), a local Hugging Face folder, a local
``.gguf`` file, or a checkpoint the workbench trained (``<run-id>:<step>``, or
``<run-id>/L<n>:<step>`` for the n-layer model of a run that trained several; see
:mod:`workbench.models.checkpoints`), looked up in the run store the command uses. Hub ids
never contain ``:``, so a name with one is always read as a checkpoint. Every route ends
in the same place: a :class:`~workbench.models.base.Model`.

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

from workbench.core.errors import WorkbenchError
from workbench.core.options import Dtype
from workbench.core.registry import did_you_mean
from workbench.models import cache, checkpoints, zoo
from workbench.models.base import DTYPES, Model
from workbench.models.hf import boot_folder, check_folder, folder_checksum

log = logging.getLogger(__name__)

_STEP = re.compile(r"[0-9]+")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]{0,95}(/[\w.\-]{1,96})?", re.ASCII)
_HUB_HOST = ("huggingface.co", 443)


def load_model(name: str, *, dtype: Dtype = "float32", device: str = "cpu",
               runs_dir: str | Path | None = None) -> Model:
    """Load a model by name (see the module docstring for the accepted forms).

    Args:
        name: bundled name, hub id, local folder, ``.gguf`` file, or ``<run-id>:<step>``.
        dtype: parameter dtype; float32 by default.
        device: torch device, ``"cpu"`` by default.
        runs_dir: the run store a checkpoint name is looked up in (``--out``); default
            :func:`workbench.core.paths.runs_dir`.

    Raises:
        UnknownNameError / WorkbenchError: with the known names, or why the model cannot
            be loaded (not fetched, corrupt, no such run or step, no network for a hub id).
    """
    if dtype not in DTYPES:
        raise WorkbenchError(f"unknown dtype '{dtype}'; expected one of {', '.join(DTYPES)}")
    start = time.perf_counter()
    if name in zoo.MODELS:
        model = _load_bundled(name, dtype, device)
    elif ":" in name and not _exists(name):
        model = _load_checkpoint(name, dtype, device, runs_dir)
    elif _exists(name):
        model = _load_path(Path(name).expanduser(), dtype, device)
    else:
        model = _load_hub(name, dtype, device)
    info = model.info.replace(load_seconds=round(time.perf_counter() - start, 3))
    model.info = info
    log.info("loaded %s in %.2fs", name, info.load_seconds)
    return model


def _exists(name: str) -> bool:
    """Whether ``name`` is an existing path (``False`` for names no path can have)."""
    try:
        return Path(name).expanduser().exists()
    except (OSError, ValueError):  # too long for a file name, or a NUL byte in it
        return False


def _load_bundled(name: str, dtype: Dtype, device: str) -> Model:
    spec = zoo.MODELS.get(name)
    # Fetches when not cached, re-hashes what changed, and keeps a fetch --force from
    # swapping the files while they are read.
    with cache.open_cached(name) as manifest:
        return boot_folder(
            cache.hf_dir(name), name=name, source=spec.source,
            checksum=manifest.weights_sha256, dtype=dtype, device=device,
            bos_token=spec.bos_token, has_lm_head=spec.has_lm_head,
        )


def _load_checkpoint(name: str, dtype: Dtype, device: str,
                     runs_dir: str | Path | None) -> Model:
    run_ref, _, step = name.rpartition(":")
    if not run_ref or not _STEP.fullmatch(step):
        raise WorkbenchError(
            f"{name!r} is not a checkpoint name: the step {step!r} is not a whole number; "
            "expected <run-id>:<step> or <run-id>/L<n>:<step> (or an existing path)")
    return checkpoints.load(run_ref, int(step), dtype=dtype, device=device, runs_dir=runs_dir)


def _load_path(path: Path, dtype: Dtype, device: str) -> Model:
    if path.is_file() and path.suffix == ".gguf":
        with cache.open_gguf(path) as (folder, digest):
            return boot_folder(folder, name=str(path), source="local GGUF file",
                               checksum=digest, dtype=dtype, device=device)
    if path.is_dir() and (path / "config.json").is_file():
        check_folder(path)
        return boot_folder(path, name=str(path), source="local folder",
                           checksum=folder_checksum(path), dtype=dtype, device=device)
    raise WorkbenchError(
        f"{path} is neither a Hugging Face model folder (with config.json) nor a .gguf file"
    )


def _load_hub(name: str, dtype: Dtype, device: str) -> Model:
    from transformers import AutoConfig

    known = ", ".join(zoo.MODELS.names())
    hint = did_you_mean(name, zoo.MODELS.names())  # a typo of a bundled name says so first
    if not _HUB_ID.fullmatch(name):
        raise WorkbenchError(
            f"{name[:80]!r}{hint} is not a bundled model ({known}), an existing folder or .gguf "
            "file, a checkpoint name (<run-id>/L<n>:<step>) or a Hugging Face hub id (org/name)")
    try:  # a model already in the Hugging Face cache loads without a network
        AutoConfig.from_pretrained(name, local_files_only=True)
        cached = True
    except (OSError, ValueError):
        cached = False
    if not cached and not _hub_reachable():
        raise WorkbenchError(
            f"'{name}'{hint} is not a bundled model ({known}), a local folder or a .gguf file, and "
            "the Hugging Face hub is unreachable (no network), so it cannot be downloaded"
        )
    try:
        return boot_folder(name, name=name, source="Hugging Face hub", checksum="",
                           dtype=dtype, device=device, local_files_only=cached)
    except (OSError, ValueError) as exc:
        raise WorkbenchError(
            f"'{name}'{hint} is not a bundled model ({known}) and could not be loaded from the "
            f"Hugging Face hub: {str(exc).splitlines()[0]}"
        ) from None


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(_HUB_HOST, timeout=timeout):
            return True
    except OSError:
        return False
