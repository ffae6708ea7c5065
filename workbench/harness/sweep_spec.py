"""Sweep specs: a TOML file naming experiments, models, config grids and seeds, expanded into
cells, each an ordinary run of one experiment on one model with one config.

A spec (``data/sweeps/*.toml`` holds examples)::

    name = "head finding over seeds"          # a label (default: the file's name)
    experiments = ["previous-token-heads", "induction-heads"]
    models = ["smollm2", "20250101-120000-induction-formation-none-ab12/L*:*"]
    seeds = [0, 1]                            # sets each cell's `seed` field
    config = "demo"                           # start from the experiments' demo configs
    steps_every = 100                         # keep checkpoint steps that are multiples

    [set]                                     # fixed fields of every cell
    n_boot = 200

    [grid]                                    # the cross product of these values
    n_prompts = [16, 64]

    [by_experiment.induction-heads]           # fields only one experiment has
    set = { n_random = 3 }
    grid = { seq_len = [20, 40] }

    [[cells]]                                 # explicit cells, added to the product
    experiment = "previous-token-heads"
    model = "minilm"
    set = { n_prompts = 8 }

The cells are the cross product experiments x models x seeds x grid (``by_experiment``
grids multiply only their experiment's cells), then the explicit ``cells``. A cell's config
is the experiment's defaults (or its demo config), then ``set``, then the grid values and
the seed; it is built and checked by :func:`workbench.harness.config.apply_overrides`, so a
bad field fails here, before anything runs. Experiments that build their own models
(``induction-formation``) get one cell per config, whatever ``models`` says.

Models: bundled names, hub ids, local model folders, checkpoints ``<run-id>/L<n>:<step>``,
and checkpoint globs such as ``<run-id>/L2:*`` or ``<run-id>/L*:*`` (shell patterns over
the model ``L<n>`` and the step, in the run store the sweep writes to), which expand to
every checkpoint they match (keeping multiples of ``steps_every``). A glob that matches
nothing is an error.

Examples:
    >>> spec = load_spec("data/sweeps/seeds.toml")           # doctest: +SKIP
    >>> cells = expand(spec, runs_dir="data/runs")            # doctest: +SKIP
    >>> cells[0].experiment, cells[0].model, cells[0].grid    # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import json
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr

from workbench.core.errors import ConfigError, WorkbenchError
from workbench.core.files import read_bounded
from workbench.core.records import Count, Json, PositiveInt, Record, RecordError
from workbench.harness.config import apply_overrides, check_config
from workbench.harness.experiment import Experiment, get
from workbench.models import cache, checkpoints, reference

MAX_SPEC = 1 << 20
"""A sweep spec larger than this is not one (a real one is a few hundred bytes)."""


class SpecError(WorkbenchError):
    """A sweep spec that cannot be expanded into cells (one line, naming the problem)."""


Name = Annotated[str, Field(min_length=1, max_length=4096)]
Values = Annotated[tuple[Json, ...], Field(min_length=1)]
"""A grid's values: at least one."""
Fields = dict[Annotated[str, Field(min_length=1, max_length=200)], Json]
Grid = dict[Annotated[str, Field(min_length=1, max_length=200)], Values]


class ExperimentSection(Record):
    """``[by_experiment.NAME]``: fields only one experiment has."""

    set: Fields = Field(default_factory=dict)
    grid: Grid = Field(default_factory=dict)


class CellSpec(Record):
    """A ``[[cells]]`` entry: one explicit cell, added to the product."""

    experiment: Name
    model: Name | None = None
    seed: Count | None = None
    set: Fields = Field(default_factory=dict)


class Spec(Record):
    """A sweep spec (see the module docstring for each key), as its TOML says it."""

    name: Annotated[str, Field(max_length=200)]
    """A label (default: the file's name)."""
    experiments: tuple[Name, ...] = ()
    models: tuple[Name, ...] = ()
    seeds: tuple[Count, ...] = ()
    config: Literal["default", "demo"] = "default"
    steps_every: PositiveInt | None = None
    set: Fields = Field(default_factory=dict)
    grid: Grid = Field(default_factory=dict)
    by_experiment: dict[Name, ExperimentSection] = Field(default_factory=dict)
    cells: tuple[CellSpec, ...] = ()
    _text: str = PrivateAttr(default="")

    @property
    def text(self) -> str:
        """The spec file's text, kept with the sweep run."""
        return self._text

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-able values (the sweep run's config)."""
        return self.to_data()


@dataclass(frozen=True)
class ModelRef:
    """A model a cell runs on, as resolved before anything runs."""

    name: str
    """The MODEL argument, as ``load_model`` takes it and the run records it."""
    series: str
    """The model without its step (``<run-id>/L2`` for a checkpoint; else ``name``)."""
    step: int | None = None
    tokens: int | None = None
    checksum: str | None = None
    """The weights' checksum when it is known without loading (for reuse), else ``None``."""


@dataclass(frozen=True)
class Cell:
    """One run of a sweep: an experiment, a model and the config overrides."""

    index: int
    experiment: str
    model: ModelRef | None
    overrides: Mapping[str, Any]
    """The full overrides: base config, ``set``, grid values and seed."""
    grid: Mapping[str, Any]
    """The values that vary across the sweep (grid fields and seed), for tables."""
    seed: int | None

    def label(self) -> str:
        varying = " ".join(f"{k}={v}" for k, v in self.grid.items())
        return f"{self.experiment} on {self.model.name if self.model else '-'} {varying}".rstrip()


def load_spec(path: str | Path) -> Spec:
    """Read and check a spec file.

    Args:
        path: the TOML file; its name (without ``.toml``) is the default ``name``.

    Returns:
        The parsed spec (its cells come from :func:`expand`).

    Raises:
        SpecError: the file cannot be read, is not TOML, or has an unknown key or a value
            of the wrong type.
    """
    path = Path(path)
    try:
        text = read_bounded(path, MAX_SPEC, what="the sweep spec").decode("utf-8")
    except WorkbenchError as exc:
        raise SpecError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"cannot read the sweep spec {path}: {exc}") from None
    return parse_text(text, name=path.stem, where=str(path))


def parse_text(text: str, *, name: str = "sweep", where: str = "") -> Spec:
    """A spec from TOML text (see :func:`load_spec`); ``where`` names it in errors."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"the sweep spec {where or name} is not valid TOML: {exc}") from None
    return parse_spec(raw, name=name, text=text, where=where)


def parse_spec(raw: Mapping[str, Any], *, name: str = "sweep", text: str = "",
               where: str = "") -> Spec:
    """Check a spec's keys and value types (see :func:`load_spec`).

    Args:
        raw: the spec as parsed TOML (or any mapping of the same shape).
        name: the default ``name``.
        text: the spec's text, kept with the sweep run.
        where: the file, for messages.

    Returns:
        The spec.

    Raises:
        SpecError: an unknown key, or a value of the wrong type or an empty grid.
    """
    try:
        spec = Spec.from_data({"name": name, **raw}, what=f"the sweep spec {where}".rstrip())
    except RecordError as exc:
        raise SpecError(str(exc)) from None
    spec._text = text
    return spec


# ---- expansion ----------------------------------------------------------------------------

def expand(spec: Spec, runs_dir: str | Path | None = None) -> list[Cell]:
    """The cells of ``spec``, every config built and checked and every model resolved.

    Args:
        spec: a parsed spec.
        runs_dir: the run store checkpoint names and globs are looked up in.

    Returns:
        The cells, grouped by model (so a worker keeps using the model it loaded).

    Raises:
        SpecError / UnknownNameError / ConfigError: an unknown experiment, model or config
            field, an empty sweep or grid, a seed for an experiment without a ``seed``
            field, or a glob that matches no checkpoint.
    """
    if not spec.experiments and not spec.cells:
        raise SpecError("the sweep has no cells: name experiments = [...] or add [[cells]]")
    for exp in spec.by_experiment:
        if exp not in spec.experiments:
            raise SpecError(f"by_experiment.{exp} names an experiment the sweep does not run; "
                            f"experiments: {', '.join(spec.experiments) or 'none'}")
    models: dict[str, list[ModelRef]] = {}

    def resolved(name: str) -> list[ModelRef]:
        if name not in models:
            models[name] = resolve_model(name, runs_dir, spec.steps_every)
        return models[name]

    drafts = []
    for name in spec.experiments:
        exp = get(name)
        section = spec.by_experiment.get(name, ExperimentSection())
        grid = {**spec.grid, **section.grid}
        fixed = {**spec.set, **section.set}
        refs = [r for m in spec.models for r in resolved(m)] if exp.needs_model else [None]
        if exp.needs_model and not refs:
            raise SpecError(f"experiment '{name}' needs a model: name models = [...]")
        for ref, seed, values in itertools.product(refs, spec.seeds or [None], _product(grid)):
            drafts.append((exp, ref, fixed, values, seed, spec.config))
    for entry in spec.cells:
        exp = get(entry.experiment)
        refs = resolved(entry.model) if exp.needs_model and entry.model else [None]
        if exp.needs_model and not entry.model:
            raise SpecError(f"a [[cells]] entry of '{exp.name}' needs model = \"NAME\"")
        for ref in refs:
            drafts.append((exp, ref, dict(entry.set), {}, entry.seed, spec.config))
    drafts.sort(key=lambda d: ("" if d[1] is None else d[1].series, _step(d[1])))
    return [_cell(i, *d) for i, d in enumerate(drafts)]


def _step(ref: ModelRef | None) -> int:
    return -1 if ref is None or ref.step is None else ref.step


def _product(grid: Mapping[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(grid[k] for k in keys))]


def _cell(index: int, exp: Experiment, ref: ModelRef | None, fixed: Mapping[str, Any],
          values: Mapping[str, Any], seed: int | None, base: str) -> Cell:
    field_names = {f.name for f in dataclasses.fields(exp.config)}
    if seed is not None and "seed" not in field_names:
        raise SpecError(f"experiment '{exp.name}' has no seed field, so the sweep cannot set "
                        "seeds for it; drop seeds or give it its own [[cells]]")
    overrides = {**exp.named_config(base), **fixed, **values}
    if seed is not None:
        overrides["seed"] = seed
    try:
        cfg = check_config(apply_overrides(exp.config, overrides))
    except ConfigError as exc:
        raise ConfigError(f"{exp.name}: {exc}") from None
    # the overrides as the run will record them (tuples as lists), for matching earlier runs
    full = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    varying = {**values, **({"seed": seed} if seed is not None else {})}
    return Cell(index=index, experiment=exp.name, model=ref, overrides=full, grid=varying,
                seed=full.get("seed") if isinstance(full.get("seed"), int) else None)


# ---- models -------------------------------------------------------------------------------

def resolve_model(name: str, runs_dir: str | Path | None = None,
                  steps_every: int | None = None) -> list[ModelRef]:
    """The models a spec's model entry names: one, or every checkpoint a glob matches.

    The entry is read by :func:`workbench.models.reference.parse_model`, as ``workbench
    run`` reads it, and checked as far as it can be without loading anything: a bundled
    name, a model folder or ``.gguf`` file, a checkpoint in the store, a hub id in the
    Hugging Face cache or downloadable (a worker downloads it).

    Args:
        name: the model entry.
        runs_dir: the run store checkpoints are looked up in.
        steps_every: keep only checkpoint steps that are multiples of it (globs only).

    Returns:
        The models, a glob's in order of model then step.

    Raises:
        UnknownNameError: a name that is none of these (with the closest bundled name).
        WorkbenchError: a checkpoint or glob naming no run, model or step of the store, or
            a path that is not a model.
    """
    match reference.parse_model(name):
        case reference.Bundled():
            return [ModelRef(name, name, checksum=_bundled_checksum(name))]
        case reference.CheckpointGlob() as glob:
            return _glob(name, glob, runs_dir, steps_every)
        case reference.Checkpoint(run=run, model=model, step=step):
            run_id, ref = checkpoints.resolve(run, model, step, runs_dir=runs_dir)
            return [_checkpoint_ref(run_id, ref)]
        case reference.Folder(path=path):
            from workbench.models.hf import check_folder, folder_checksum

            check_folder(path)
            folder = str(path.resolve())  # absolute, so that a worker in another folder finds it
            return [ModelRef(folder, folder, checksum=folder_checksum(path))]
        case reference.Gguf(path=path):
            return [ModelRef(str(path.resolve()), str(path.resolve()))]
        case reference.Hub() as hub:
            reference.require_hub(hub)
            return [ModelRef(name, name, checksum="")]  # a hub model records no checksum


def _bundled_checksum(name: str) -> str | None:
    try:
        return cache.read_manifest(name).weights_sha256
    except (WorkbenchError, OSError):
        return None  # not fetched yet: the worker fetches it, and reuse is checked there


def _glob(name: str, glob: reference.CheckpointGlob, runs_dir: str | Path | None,
          every: int | None) -> list[ModelRef]:
    run = checkpoints.finished_run(glob.run, runs_dir)
    available = checkpoints.list_checkpoints(run.path)
    found = [c for c in available if fnmatch.fnmatchcase(f"L{c.n_layers}", glob.model)
             and fnmatch.fnmatchcase(str(c.step), glob.step)
             and (every is None or c.step % every == 0)]
    if not found:
        have = ", ".join(f"L{n} steps {_steps(available, n)}"
                         for n in sorted({c.n_layers for c in available})) or "no checkpoints"
        rule = f" every {every} steps" if every else ""
        raise WorkbenchError(f"model glob {name!r} matches no checkpoint{rule} of run "
                             f"{run.id}; it has {have}")
    return [_checkpoint_ref(run.id, c) for c in found]


def _steps(refs: Iterable[checkpoints.CheckpointRef], n_layers: int) -> str:
    steps = [c.step for c in refs if c.n_layers == n_layers]
    return f"{min(steps)}..{max(steps)}"


def _checkpoint_ref(run_id: str, ref: checkpoints.CheckpointRef) -> ModelRef:
    """A checkpoint's name, series, step, tokens seen and weights checksum, read from its
    ``checkpoint.json`` (the weights are re-hashed when a worker loads them)."""
    meta = checkpoints.read_meta(ref.path)
    return ModelRef(checkpoints.checkpoint_name(run_id, ref.n_layers, ref.step),
                    f"{run_id}/L{ref.n_layers}", step=ref.step, tokens=meta.tokens,
                    checksum=meta.sha256[checkpoints.WEIGHTS])
