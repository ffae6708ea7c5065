"""Load any supported model by name: the one dispatcher over every model source.

A model argument may be a bundled model (:data:`workbench.models.zoo.MODELS`), a Hugging
Face hub id (needs a network the first time), a local Hugging Face folder, a local
``.gguf`` file, or a checkpoint the workbench trained (``<run-id>:<step>``, or
``<run-id>/L<n>:<step>`` for the n-layer model of a run that trained several; see
:mod:`workbench.models.checkpoints`), looked up in the run store the command uses. Which
one a name is, is decided by :func:`workbench.models.reference.parse_model`, the same for
every command. Every route ends in the same place: a :class:`~workbench.models.base.Model`.

Examples:
    >>> model = load_model("smollm2")                      # doctest: +SKIP
    >>> model.info.n_layers                                # doctest: +SKIP
    30
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.core.errors import WorkbenchError
from workbench.core.options import Dtype
from workbench.models import adapters, cache, checkpoints, reference, zoo
from workbench.models.base import DTYPES, Model, Tokenizing
from workbench.models.hf import (
    boot_folder,
    bos_id,
    check_folder,
    config_context,
    config_facts,
    folder_checksum,
)
from workbench.models.reference import Bundled, Checkpoint, CheckpointGlob, Folder, Gguf, Hub

log = logging.getLogger(__name__)


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
            be loaded (not fetched, corrupt, no such run or step, no network for a hub id,
            a checkpoint glob, which names several models).
    """
    if dtype not in DTYPES:
        raise WorkbenchError(f"unknown dtype '{dtype}'; expected one of {', '.join(DTYPES)}")
    start = time.perf_counter()
    match reference.parse_model(name):
        case Bundled() as ref:
            model = _load_bundled(ref.name, dtype, device)
        case Checkpoint() as ref:
            model = checkpoints.load(ref.run, ref.model, ref.step, dtype=dtype, device=device,
                                     runs_dir=runs_dir)
        case CheckpointGlob():
            raise WorkbenchError(f"{name!r} is a checkpoint glob, which names several models; "
                                 "load one (<run-id>/L<n>:<step>), or sweep over them "
                                 "(`workbench sweep`)")
        case Folder(path=path):
            check_folder(path)
            model = boot_folder(path, name=str(path), source="local folder",
                                checksum=folder_checksum(path), dtype=dtype, device=device)
        case Gguf(path=path):
            with cache.open_gguf(path) as (folder, digest):
                model = boot_folder(folder, name=str(path), source="local GGUF file",
                                    checksum=digest, dtype=dtype, device=device)
        case Hub() as ref:
            model = _load_hub(ref, dtype, device)
    info = model.info.replace(load_seconds=round(time.perf_counter() - start, 3))
    model.info = info
    log.info("loaded %s in %.2fs", name, info.load_seconds)
    return model


def load_tokenizer(name: str) -> Any | None:
    """A model's tokenizer alone, read without its weights, for the checks an experiment
    makes before the model loads.

    Read for a bundled model that is fetched, a local Hugging Face folder and a hub id in
    the local Hugging Face cache; ``None`` for the rest (a bundled model not yet fetched,
    a GGUF file, a checkpoint, an uncached hub id), whose tokenizer is known once the model
    loads.

    Args:
        name: a model argument, as :func:`load_model` takes it.

    Raises:
        UnknownNameError / WorkbenchError: a name that names no model, or a tokenizer that
            does not load (one line).
    """
    from transformers import AutoTokenizer

    match reference.parse_model(name):
        case Bundled(name=bundled) if cache.is_cached(bundled):
            src: str | Path = cache.hf_dir(bundled)
        case Folder(path=path):
            src = path
        case Hub(id=hub_id, cached=True):
            src = hub_id
        case _:
            return None
    try:
        return AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    except (OSError, ValueError) as exc:
        said = " ".join(str(exc).split())[:300]
        raise WorkbenchError(f"the tokenizer of {name} could not be read: {said}") from None


@dataclass(frozen=True)
class FramingFacts:
    """What encoding a prompt needs of a model, known before its weights load."""

    name: str
    causal: bool
    bos_token_id: int | None
    n_ctx: int


def load_tokenizing(name: str) -> Tokenizing[FramingFacts] | None:
    """A model's tokenizer with the facts that frame its prompts, read without its
    weights: what encodes and batches prompts as the loaded model will
    (:class:`~workbench.models.base.Tokenizing`), for the checks an experiment makes on
    its inputs before the model loads (e.g. that a resample ablation finds every prompt a
    partner of its length).

    Read for a bundled model that is fetched (its entry says whether it is causal, its
    BOS and its context), and for a local folder or a cached hub model of a family the
    workbench knows (its config says the family, so whether it is causal, and the
    context; the BOS is the tokenizer's, as the loaded model's is); ``None`` for the rest,
    whose inputs are checked once the model loads.

    Raises:
        UnknownNameError / WorkbenchError: a name that names no model, or a tokenizer or
            config that does not load (one line).
    """
    match reference.parse_model(name):
        case Bundled(name=bundled):
            spec = zoo.MODELS.get(bundled)
            causal, bos_token, n_ctx = spec.causal, spec.bos_token, spec.n_ctx
        case Folder(path=path):
            (causal, n_ctx), bos_token = _config_framing(path), None
        case Hub(id=hub_id, cached=True):
            (causal, n_ctx), bos_token = _config_framing(hub_id), None
        case _:
            return None
    tokenizer = load_tokenizer(name) if causal is not None and n_ctx is not None else None
    if tokenizer is None or causal is None or n_ctx is None:
        return None
    return Tokenizing(tokenizer, FramingFacts(name, causal, bos_id(tokenizer, causal,
                                                                   bos_token), n_ctx))


def _config_framing(src: str | Path) -> tuple[bool | None, int | None]:
    """Whether a folder's or cached hub model's family is causal, and its context, from its
    config (``None`` where unknown)."""
    architecture, _ = config_facts(src)
    adapter = adapters.FAMILIES_BY_ARCHITECTURE.get(architecture or "")
    return (adapter.causal if adapter else None), config_context(src)


@dataclass(frozen=True)
class KnownFacts:
    """What is known of a model before its weights load (``None``: known once it loads).
    It meets :class:`workbench.models.base.Capabilities`, so ``require`` reads it."""

    name: str
    causal: bool | None = None
    has_lm_head: bool | None = None
    n_ctx: int | None = None


def load_facts(name: str) -> KnownFacts | None:
    """A model's facts read without its weights, for the checks an experiment makes before
    the model loads: a bundled model's entry (whether it is causal, has a trained LM head,
    its context), or what a local folder's or a cached hub model's config says of its
    family (whether it is causal); ``None`` for the rest (a GGUF file, a checkpoint, an
    uncached hub id), checked once the model loads.

    Args:
        name: a model argument, as :func:`load_model` takes it.

    Raises:
        UnknownNameError / WorkbenchError: a name that names no model, or a config that
            cannot be read (one line).
    """
    match reference.parse_model(name):
        case Bundled(name=bundled):
            spec = zoo.MODELS.get(bundled)
            return KnownFacts(name, spec.causal, spec.has_lm_head, spec.n_ctx)
        case Folder(path=path):
            src: str | Path = path
        case Hub(id=hub_id, cached=True):
            src = hub_id
        case _:
            return None
    architecture, _ = config_facts(src)
    adapter = adapters.FAMILIES_BY_ARCHITECTURE.get(architecture or "")
    return KnownFacts(name, adapter.causal if adapter else None)


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


def _load_hub(ref: Hub, dtype: Dtype, device: str) -> Model:
    reference.require_hub(ref)
    try:  # a model in the Hugging Face cache loads without a network
        return boot_folder(ref.id, name=ref.id, source="Hugging Face hub", checksum="",
                           dtype=dtype, device=device, local_files_only=ref.cached)
    except (OSError, ValueError) as exc:
        raise reference.unknown(ref.id, "and the Hugging Face hub could not load it: "
                                        f"{str(exc).splitlines()[0]}") from None
