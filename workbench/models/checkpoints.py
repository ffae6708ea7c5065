"""Checkpoints of models the workbench trained: save, verify, list and load as a ``Model``.

A run that trains models (``induction-formation``) keeps them inside its run folder::

    tokenizer/                                   one tokenizer shared by the run's models
    checkpoints/L{n_layers}/step_{step:06d}/
        model.safetensors                        the bridge's state_dict, float32
        checkpoint.json                          the model spec, step, tokens seen, and
                                                 the SHA-256 of every file it needs

A checkpoint is named ``<run-id>/L<n>:<step>``: the run, the model by its number of
layers, and the training step. ``<run-id>:<step>`` is accepted when the run trained a
single model; with several it is an error that names the choices. ``<run-id>`` may be a
unique prefix of the id. Any ``MODEL`` argument accepts these names::

    workbench record 20250101-120000-induction-formation-none-ab12/L2:1500 --prompt-set natural
    workbench run head-overview --model 20250101-120000-induction-formation-none-ab12/L2:1500

``checkpoint.json`` is one :class:`CheckpointMeta`, which writes and validates it. Every
load re-hashes the weights and tokenizer files against it; a changed or truncated file is
a :class:`~workbench.core.errors.ChecksumError` that names it.

Examples:
    >>> model = load("20250101-120000-induction-formation-none-ab12", "L2", 1500)  # doctest: +SKIP
    >>> model.info.n_layers, model.info.name                                       # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import AfterValidator, Field, field_validator

from workbench.core import checksums, paths
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.files import read_bounded
from workbench.core.options import Dtype
from workbench.core.records import Count, Hex64, Json, Record
from workbench.models.base import Model
from workbench.models.native import ModelSpec, as_model, build_bridge
from workbench.store.runs import Run, RunStore
from workbench.store.validate import confined_file, real

log = logging.getLogger(__name__)

FORMAT = "workbench-checkpoint"
VERSION = 1
WEIGHTS = "model.safetensors"
META = "checkpoint.json"
CHECKPOINTS = "checkpoints"
TOKENIZER = "tokenizer"
_MODEL_DIR = re.compile(r"^L(?P<layers>\d+)$")
_STEP_DIR = re.compile(r"^step_(?P<step>\d+)$")
_MAX_META = 16 << 20


def _model_spec(data: dict[str, Any]) -> dict[str, Any]:
    try:
        ModelSpec.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a model spec ({exc})") from None
    return data


CheckpointPath = Annotated[str, Field(min_length=1, max_length=4096)]
"""A path relative to the checkpoint folder; where it leads is checked when it is read
(it may climb to the run folder's ``tokenizer/``)."""


class CheckpointMeta(Record):
    """A checkpoint's ``checkpoint.json``: what the model is, when it was saved, and the
    SHA-256 of every file it needs (its weights and the run's tokenizer files)."""

    format: Literal["workbench-checkpoint"]
    version: Literal[1]
    model: Annotated[dict[str, Json], AfterValidator(_model_spec)]
    """The :class:`~workbench.models.native.ModelSpec`, as ``ModelSpec.to_dict`` writes it."""
    step: Count
    tokens: Count
    """Training tokens seen when it was saved."""
    tokenizer: CheckpointPath
    """The tokenizer folder, relative to the checkpoint folder."""
    sha256: dict[CheckpointPath, Hex64]
    """``{path relative to the checkpoint folder: sha256}``."""
    extra: dict[str, Json] | None = None
    """Facts the trainer stores with it (run id, corpus fingerprint)."""

    @field_validator("sha256")
    @classmethod
    def _lists_the_weights(cls, files: dict[str, str]) -> dict[str, str]:
        if WEIGHTS not in files:
            raise ValueError(f"does not list {WEIGHTS}")
        return files

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec.from_dict(self.model)


RECORDS: dict[str, type[Record]] = {"checkpoint": CheckpointMeta}
"""The checkpoint's record type by schema name (``data/schemas/<name>.schema.json``)."""


@dataclass(frozen=True)
class CheckpointRef:
    """Where one checkpoint lives in a run folder."""

    n_layers: int
    step: int
    path: Path


def model_dir(run_dir: str | Path, n_layers: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"L{n_layers}"


def step_dir(run_dir: str | Path, n_layers: int, step: int) -> Path:
    return model_dir(run_dir, n_layers) / f"step_{step:06d}"


def checkpoint_name(run_id: str, n_layers: int, step: int) -> str:
    """The ``MODEL`` name of a checkpoint: ``<run-id>/L<n>:<step>``."""
    return f"{run_id}/L{n_layers}:{step}"


def _hash_files(folder: Path, files: list[Path]) -> dict[str, str]:
    """``{path relative to folder: sha256}``."""
    return {os.path.relpath(f, folder): checksums.sha256_file(f) for f in files}


def save(run_dir: str | Path, bridge: Any, spec: ModelSpec, *, step: int, tokens: int,
         extra: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint of ``bridge`` into ``run_dir`` (whose ``tokenizer/`` it uses).

    Returns:
        The checkpoint folder.
    """
    from safetensors.torch import save_file

    run_dir = Path(run_dir)
    tokenizer_dir = run_dir / TOKENIZER
    if not tokenizer_dir.is_dir():
        raise WorkbenchError(f"{run_dir} has no {TOKENIZER}/ folder to pair the weights with")
    folder = step_dir(run_dir, spec.n_layers, step)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous()
             for k, v in bridge.state_dict().items()}
    save_file(state, str(folder / WEIGHTS), metadata={"format": FORMAT, "step": str(step)})
    needed = [folder / WEIGHTS, *sorted(p for p in tokenizer_dir.iterdir() if p.is_file())]
    meta = CheckpointMeta.from_data(
        {"format": FORMAT, "version": VERSION, "model": spec.to_dict(), "step": step,
         "tokens": tokens, "tokenizer": os.path.relpath(tokenizer_dir, folder),
         "sha256": _hash_files(folder, needed), "extra": extra or None},
        what=str(folder / META))
    checksums.write_record_atomic(folder / META, meta)
    return folder


def verify(folder: str | Path) -> CheckpointMeta:
    """Read ``checkpoint.json``, check its shape, and re-hash every file it lists.

    Every path it names (the files hashed, the tokenizer folder) must stay inside the run
    folder that holds the checkpoint (``<run>/checkpoints/L<n>/step_<s>/``), or inside the
    checkpoint folder itself when it is not in a run.

    Returns:
        The checkpoint's metadata.

    Raises:
        WorkbenchError: not a checkpoint folder, or a ``checkpoint.json`` that is not a
            :class:`CheckpointMeta` or names paths leading outside (the message names the
            file and the field).
        ChecksumError: a file is missing, or changed since the checkpoint was written.
    """
    folder = Path(folder)
    meta = read_meta(folder)
    root = _checkpoint_root(folder)
    where = f"checkpoint {folder}"
    if (problem := _paths_problem(meta, folder, root)) is not None:
        raise WorkbenchError(f"{folder / META}: {problem}")
    for rel, expected in meta.sha256.items():
        path = confined_file(root, os.path.relpath(folder / rel, root), what=where)
        try:
            actual = checksums.sha256_file(path)
        except OSError as exc:
            raise ChecksumError(f"{where}: cannot read {rel} ({exc.strerror})") from None
        if actual != expected:
            raise ChecksumError(
                f"{where}: {rel} does not match the SHA-256 recorded when it was "
                "saved (the file is damaged or was changed); restore it or train again")
    return meta


def read_meta(folder: str | Path) -> CheckpointMeta:
    """A checkpoint's ``checkpoint.json``, checked against :class:`CheckpointMeta` (no file
    it lists is read: :func:`verify` does that).

    Raises:
        WorkbenchError: unreadable, not a workbench checkpoint, or not of its shape.
    """
    folder = Path(folder)
    try:
        file = confined_file(folder, META, what=f"checkpoint {folder}")
        meta = json.loads(read_bounded(file, _MAX_META, what=META))
    except (OSError, ValueError, RecursionError, WorkbenchError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise WorkbenchError(f"{folder} is not a readable checkpoint ({reason})") from None
    # a JSON file of another kind says so, rather than naming a field it lacks
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise WorkbenchError(f"{folder / META} is not a workbench checkpoint")
    return CheckpointMeta.from_data(meta, what=str(folder / META))


def _checkpoint_root(folder: Path) -> Path:
    """The folder a checkpoint's paths must stay in: its run folder, when it is one of
    ``<run>/checkpoints/L<n>/step_<s>``, else the checkpoint folder itself."""
    if (_STEP_DIR.match(folder.name) and _MODEL_DIR.match(folder.parent.name)
            and folder.parent.parent.name == CHECKPOINTS):
        return folder.parent.parent.parent
    return folder


def _paths_problem(meta: CheckpointMeta, folder: Path, root: Path) -> str | None:
    """What is wrong with where a checkpoint's paths lead (``None`` if nothing)."""
    for rel in meta.sha256:
        if (problem := _leads_out(folder, rel, root)) is not None:
            return problem
    if (problem := _leads_out(folder, meta.tokenizer, root)) is not None:
        return f"tokenizer: {problem}"
    if not real(folder / meta.tokenizer).is_dir():
        return f"tokenizer folder {meta.tokenizer!r} is missing"
    return None


def _leads_out(folder: Path, rel: str, root: Path) -> str | None:
    """Whether ``rel`` (relative to ``folder``) is a path that stays inside ``root``."""
    if os.path.isabs(rel) or "\0" in rel:
        return f"{rel!r} is not a relative path"
    target, base = real(folder / rel), real(root)
    if target != base and not target.is_relative_to(base):
        return f"{rel!r} leads outside {root}"
    return None


def load_folder(folder: str | Path, *, name: str | None = None, dtype: Dtype = "float32",
                device: str = "cpu") -> Model:
    """Load a checkpoint folder as a workbench :class:`Model`, after verifying it.

    Raises:
        WorkbenchError / ChecksumError: see :func:`verify`.
    """
    from safetensors.torch import load_file

    from workbench.models.native import load_tokenizer

    folder = Path(folder)
    meta = verify(folder)
    spec = meta.spec
    tokenizer = load_tokenizer((folder / meta.tokenizer).resolve())
    bridge = build_bridge(spec, tokenizer, device=device)
    bridge.load_state_dict(load_file(str(folder / WEIGHTS)), strict=True)
    if dtype != "float32":
        from workbench.models.base import DTYPES

        bridge.to(DTYPES[dtype])
    bridge.eval()
    source = f"workbench checkpoint, step {meta.step} ({meta.tokens:,} tokens)"
    return as_model(bridge, tokenizer, spec, name=name or str(folder), source=source,
                    checksum=meta.sha256[WEIGHTS], dtype=dtype)


def list_checkpoints(run_dir: str | Path) -> list[CheckpointRef]:
    """Every checkpoint in a run folder, by number of layers then step."""
    found = []
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    for mdir in root.iterdir():
        if not (m := _MODEL_DIR.match(mdir.name)):
            continue
        for sdir in mdir.iterdir():
            if (s := _STEP_DIR.match(sdir.name)) and (sdir / META).is_file():
                found.append(CheckpointRef(int(m["layers"]), int(s["step"]), sdir))
    return sorted(found, key=lambda r: (r.n_layers, r.step))


def resolve(run: str, model: str, step: int, *, runs_dir: str | Path | None = None
            ) -> tuple[str, CheckpointRef]:
    """The run id and checkpoint that ``<run>/<model>:<step>`` names.

    Args:
        run: a run id, or a unique prefix of one.
        model: ``L<n>``, or ``""`` when the run trained a single model.
        step: the training step.

    Raises:
        WorkbenchError: no such run, model or step (the message lists what exists).
    """
    found = finished_run(run, runs_dir)
    available = list_checkpoints(found.path)
    layers = sorted({c.n_layers for c in available})
    if not layers:
        raise WorkbenchError(f"run {found.id} has no checkpoints")
    if model:
        if not (m := _MODEL_DIR.match(model)) or int(m["layers"]) not in layers:
            raise WorkbenchError(f"run {found.id} has no model '{model}'; it has "
                                 f"{', '.join(f'L{n}' for n in layers)}")
        n_layers = int(m["layers"])
    elif len(layers) == 1:
        n_layers = layers[0]
    else:
        raise WorkbenchError(
            f"run {found.id} trained {len(layers)} models; name one: "
            + ", ".join(checkpoint_name(found.id, n, step) for n in layers))
    steps = [c for c in available if c.n_layers == n_layers]
    match = [c for c in steps if c.step == step]
    if not match:
        shown = ", ".join(str(c.step) for c in steps)
        raise WorkbenchError(f"run {found.id} has no checkpoint at step {step} for "
                             f"L{n_layers}; steps: {shown}")
    return found.id, match[0]


def finished_run(run: str, runs_dir: str | Path | None = None) -> Run:
    """The complete run ``run`` (an id or unique prefix) whose checkpoints are asked for.

    A run that was interrupted, failed or is still training did not finish what its
    checkpoints belong to, so they are not results: they are refused, not loaded with a
    warning.

    Raises:
        WorkbenchError: no such run, or it is not complete (the message says what to do).
    """
    found = RunStore(paths.runs_dir(runs_dir)).get(run)
    if found.status != "complete":
        fix = ("`workbench clean` removes the runs of processes that died" if found.status
               == "interrupted" else "wait for it to finish, or train again")
        raise WorkbenchError(f"run {found.id} is {found.status}: its checkpoints are not "
                             f"results of a finished run; {fix}")
    return found


def load(run: str, model: str, step: int, *, dtype: Dtype = "float32", device: str = "cpu",
         runs_dir: str | Path | None = None) -> Model:
    """Load checkpoint ``<run>/<model>:<step>`` (see the module docstring) as a ``Model``.

    Args:
        run: a run id, or a unique prefix of one.
        model: ``L<n>``, or ``""`` when the run trained a single model.
        step: the training step.
    """
    run_id, ref = resolve(run, model, step, runs_dir=runs_dir)
    return load_folder(ref.path, name=checkpoint_name(run_id, ref.n_layers, ref.step),
                       dtype=dtype, device=device)
