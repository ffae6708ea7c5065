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

Each field has one place: a field given by two keys (``[set]`` and ``[grid]``, a section and
``by_experiment``, ``seeds`` and a ``seed`` field) is refused, as are a value listed twice
and two cells that are one run (the same experiment, model and full config, whatever
spelling led there). The number of cells is counted before any is built, and a spec of
more than :data:`MAX_CELLS` is refused. Every model is checked as far as it can be without
loading it (:func:`resolve_model`), and a cell whose model its experiment refuses (known
from the model's facts, by the check the run makes once the model has loaded) carries the
reason as its ``skip``. Each cell that runs then passes its experiment's ``preflight``
(:attr:`workbench.harness.experiment.Experiment.preflight`, the refusals a run makes
before its model loads: a document beyond a bundled model's context, a tokenizer without
the tokens a task needs, stored runs a config names that are missing) on its model's name
and the sweep's store: a refusal of the model itself skips the cell, any other refuses the
sweep in one line naming the cell.

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
import datetime
import fnmatch
import itertools
import json
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, Field, PrivateAttr

from workbench.core import paths
from workbench.core.errors import ConfigError, ModelCapabilityError, WorkbenchError, printable
from workbench.core.files import read_bounded
from workbench.core.records import INT_MAX, Count, Json, PositiveInt, Record, RecordError
from workbench.harness import matrix
from workbench.harness.config import apply_overrides, check_config, check_layers
from workbench.harness.experiment import Experiment, get
from workbench.models import adapters, cache, checkpoints, native, reference, zoo

MAX_SPEC = 1 << 20
"""A sweep spec larger than this is not one (a real one is a few hundred bytes)."""
MAX_CELLS = 10_000
"""The most cells one sweep runs. Each cell is a run folder in one store, a Ray task and a
row of the cells table, and its head scores are joined into one table (a 30-layer model
gives over a thousand rows a cell); planning checks every cell's config and earlier runs
(a few seconds for this many). A larger design is several sweeps, which also resume
independently."""
COUNT_CAP = 10**15
"""Cell counts are computed exactly up to this (beyond it: "more than")."""


class SpecError(WorkbenchError):
    """A sweep spec that cannot be expanded into cells (one line, naming the problem)."""


T = TypeVar("T")


def _distinct(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Refuse a value listed twice: each would be a cell of its own, and the same run."""
    seen = set()
    for value in values:
        key = json.dumps(value, sort_keys=True)
        if key in seen:
            raise ValueError(f"expected distinct values; {key[:60]} is listed twice")
        seen.add(key)
    return values


Distinct = Annotated[tuple[T, ...], AfterValidator(_distinct)]
"""A list of the spec in which no value appears twice."""
Name = Annotated[str, Field(min_length=1, max_length=4096)]
Values = Annotated[tuple[Json, ...], Field(min_length=1), AfterValidator(_distinct)]
"""A grid's values: at least one, none twice."""
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
    experiments: Distinct[Name] = ()
    models: Distinct[Name] = ()
    seeds: Distinct[Count] = ()
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
class ModelFacts:
    """What a model can be used for, known before it loads (``None``: known only once it
    has loaded, and then checked by the run)."""

    name: str
    architecture: str | None = None
    causal: bool | None = None
    has_lm_head: bool | None = None
    n_layers: int | None = None


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
    facts: ModelFacts | None = None
    """What the model is, when it is known without loading it (for the cells it skips)."""


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
    skip: str = ""
    """Why the experiment refuses this cell's model, known before it loads (the reason a
    run gives once it has loaded it); ``""``: the cell runs."""

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
        SpecError: the file cannot be read, is not a regular file or not TOML, or has an
            unknown key, a value of the wrong type, a repeated value or a field set twice.
    """
    path, shown = Path(path), printable(str(path))
    try:
        data = read_bounded(path, MAX_SPEC, what="the sweep spec")
        text = data.decode("utf-8")
    except WorkbenchError as exc:
        raise SpecError(printable(str(exc))) from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"cannot read the sweep spec {shown}: {exc}") from None
    return parse_text(text, name=path.stem, where=str(path))


def parse_text(text: str, *, name: str = "sweep", where: str = "") -> Spec:
    """A spec from TOML text (see :func:`load_spec`); ``where`` names it in errors."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"the sweep spec {printable(where or name)} is not valid TOML: "
                        f"{exc}") from None
    except RecursionError:  # tomllib recurses into nested arrays and tables
        raise SpecError(f"the sweep spec {printable(where or name)} is nested too deeply"
                        ) from None
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
        SpecError: an unknown key, a value of the wrong type, an empty grid, a value
            listed twice, or a field given by two keys (``seeds`` and ``[grid] seed``).
    """
    what = f"the sweep spec {printable(where)}".rstrip()
    if not isinstance(raw, Mapping):
        raise SpecError(f"{what} is not a table of keys, got {type(raw).__name__}")
    _check_values(raw, what)
    try:
        spec = Spec.from_data({"name": name, **raw}, what=what)
    except RecordError as exc:
        raise SpecError(str(exc)) from None
    _check_each_field_once(spec, what)
    spec._text = text
    return spec


def _check_values(raw: Mapping[str, Any], what: str) -> None:
    """Refuse what TOML can hold but no config field takes, naming the key: a date or time,
    an integer beyond 64 bits (TOML's own limit, and the store's)."""
    stack: list[tuple[str, Any]] = [("", raw)]
    while stack:  # by hand, not recursion: a hostile spec nests deeply
        where, value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend((f"{where}.{printable(str(k))}".lstrip("."), v)
                         for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((f"{where}.{i}", v) for i, v in enumerate(value))
        elif isinstance(value, datetime.date | datetime.time):
            raise SpecError(f"{what} '{where}': expected a number, text, true/false or a "
                            f"list or table of them, got the TOML date/time {value}")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_MAX:
            raise SpecError(f"{what} '{where}': expected an integer of at most 64 bits, got "
                            f"{str(value)[:40]}")


def _check_each_field_once(spec: Spec, what: str) -> None:
    """Refuse a config field that two keys of the spec give (``seeds`` and ``[grid] seed``,
    ``[set]`` and ``[grid]``, a section and ``by_experiment``): which one wins would be a
    rule to remember, and the cells would not be what the spec seems to say."""
    common: dict[str, Iterable[str]] = {"[set]": spec.set, "[grid]": spec.grid}
    if spec.seeds:
        common["seeds"] = ("seed",)
    sections = [{**common, f"[by_experiment.{printable(name)}] set": section.set,
                 f"[by_experiment.{printable(name)}] grid": section.grid}
                for name, section in spec.by_experiment.items()]
    for sources in sections or [common]:
        seen: dict[str, str] = {}
        for where, keys in sources.items():
            for key in keys:
                if key in seen:
                    raise SpecError(f"{what} sets the field '{printable(key)}' twice, in "
                                    f"{seen[key]} and in {where}; give it in one place")
                seen[key] = where
    for i, entry in enumerate(spec.cells):
        if entry.seed is not None and "seed" in entry.set:
            raise SpecError(f"{what} [[cells]] entry {i} sets the field 'seed' twice, by "
                            "seed and in set; give it in one place")


# ---- expansion ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Draft:
    """A cell before its config is built: where each of its values comes from."""

    exp: Experiment
    ref: ModelRef | None
    fixed: Mapping[str, Any]
    values: Mapping[str, Any]
    seed: int | None
    source: str
    """Where the spec asks for this cell, for messages."""


def expand(spec: Spec, runs_dir: str | Path | None = None) -> list[Cell]:
    """The cells of ``spec``, every config built and checked and every model resolved.

    Args:
        spec: a parsed spec.
        runs_dir: the run store checkpoint names and globs are looked up in.

    Returns:
        The cells, grouped by model (so a worker keeps using the model it loaded); a cell
        whose model the experiment refuses (known without loading it) has its ``skip``.

    Raises:
        SpecError / UnknownNameError / WorkbenchError: an unknown experiment, model or
            config field, a model that is not one, an empty sweep or grid, more than
            :data:`MAX_CELLS` cells, two cells that are the same run, a seed for an
            experiment without a ``seed`` field, or a glob that matches no checkpoint.
    """
    _check_sections(spec)
    globs = any(_is_glob(m) for m in [*spec.models, *(c.model or "" for c in spec.cells)])
    _check_size(count_cells(spec, lambda model: 1), at_least=globs)  # before any lookup
    models = _Models(runs_dir, spec.steps_every)
    _check_size(count_cells(spec, lambda model: len(models.get(model))))
    drafts = [*_product_drafts(spec, models), *_explicit_drafts(spec, models)]
    drafts.sort(key=lambda d: ("" if d.ref is None else d.ref.series, _step(d.ref)))
    cells = [_cell(i, d, spec.config, runs_dir) for i, d in enumerate(drafts)]
    _check_distinct(cells, drafts)
    return cells


def _check_sections(spec: Spec) -> None:
    if not spec.experiments and not spec.cells:
        raise SpecError("the sweep has no cells: name experiments = [...] or add [[cells]]")
    for exp in spec.by_experiment:
        if exp not in spec.experiments:
            raise SpecError(f"by_experiment.{printable(exp)} names an experiment the sweep "
                            "does not run; "
                            f"experiments: {printable(', '.join(spec.experiments)) or 'none'}")


def count_cells(spec: Spec, n_models: Callable[[str], int]) -> int:
    """The number of cells ``spec`` expands into, without expanding it.

    Args:
        spec: a parsed spec.
        n_models: how many models a ``models`` entry names (``1``, or a glob's matches).

    Returns:
        The count, or :data:`COUNT_CAP` plus one for a count beyond it (a grid of many
        keys would otherwise make a number of thousands of digits).
    """
    total = 0
    for name in spec.experiments:
        exp = get(name)
        grid = {**spec.grid, **spec.by_experiment.get(name, ExperimentSection()).grid}
        sizes = [len(spec.seeds) or 1, *(len(v) for v in grid.values())]
        if exp.needs_model:
            sizes.append(sum(n_models(m) for m in spec.models))
        total = min(total + _capped_product(sizes), COUNT_CAP + 1)
    for entry in spec.cells:
        exp = get(entry.experiment)
        total += n_models(entry.model) if exp.needs_model and entry.model else 1
    return min(total, COUNT_CAP + 1)


def _capped_product(sizes: Iterable[int]) -> int:
    """The product of ``sizes``, or :data:`COUNT_CAP` plus one once it passes that."""
    product = 1
    for size in sorted(sizes):  # a zero first ends it at zero
        product *= size
        if product > COUNT_CAP:
            return COUNT_CAP + 1
    return product


def _is_glob(entry: str) -> bool:
    return ":" in entry and any(c in entry for c in reference.GLOB_CHARS)


def _check_size(count: int, *, at_least: bool = False) -> None:
    if count > MAX_CELLS:
        size = (f"more than {COUNT_CAP:,}" if count > COUNT_CAP
                else f"{'at least ' if at_least else ''}{count:,}")
        raise SpecError(f"the sweep has {size} cells; one sweep runs at most {MAX_CELLS:,}: "
                        "split it into several specs or narrow its grid")


class _Models:
    """Each ``models`` entry resolved once (a glob lists the store once)."""

    def __init__(self, runs_dir: str | Path | None, steps_every: int | None) -> None:
        self.runs_dir, self.steps_every = runs_dir, steps_every
        self._refs: dict[str, list[ModelRef]] = {}

    def get(self, entry: str) -> list[ModelRef]:
        if entry not in self._refs:
            self._refs[entry] = resolve_model(entry, self.runs_dir, self.steps_every)
        return self._refs[entry]


def _product_drafts(spec: Spec, models: _Models) -> Iterator[_Draft]:
    """The cross product experiments x models x seeds x grid."""
    for name in spec.experiments:
        exp = get(name)
        section = spec.by_experiment.get(name, ExperimentSection())
        grid = {**spec.grid, **section.grid}
        fixed = {**spec.set, **section.set}
        refs = [(m, r) for m in spec.models for r in models.get(m)] if exp.needs_model else [
            (None, None)]
        if exp.needs_model and not refs:
            raise SpecError(f"experiment '{name}' needs a model: name models = [...]")
        for (entry, ref), seed, values in itertools.product(refs, spec.seeds or [None],
                                                            _product(grid)):
            varying = [f"seed {seed}"] if seed is not None else []
            varying += [f"{k}={_shown(v)}" for k, v in values.items()]
            source = name + (f" on {entry!r}" if entry else "") + (
                f" ({', '.join(varying)})" if varying else "")
            yield _Draft(exp, ref, fixed, values, seed, source)


def _explicit_drafts(spec: Spec, models: _Models) -> Iterator[_Draft]:
    """The ``[[cells]]`` entries (a glob in one gives a cell per checkpoint)."""
    for i, entry in enumerate(spec.cells):
        exp = get(entry.experiment)
        if exp.needs_model and not entry.model:
            raise SpecError(f"[[cells]] entry {i} ('{exp.name}') needs model = \"NAME\"")
        if not exp.needs_model and entry.model:
            raise SpecError(f"[[cells]] entry {i} names a model, but '{exp.name}' builds its "
                            "own models; drop model")
        for ref in models.get(entry.model) if entry.model else [None]:
            on = f" on {entry.model!r}" if entry.model else ""
            yield _Draft(exp, ref, dict(entry.set), {}, entry.seed,
                         f"[[cells]] entry {i} ({exp.name}{on})")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _step(ref: ModelRef | None) -> int:
    return -1 if ref is None or ref.step is None else ref.step


def _product(grid: Mapping[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(grid[k] for k in keys))]


def _cell(index: int, draft: _Draft, base: str, runs_dir: str | Path | None) -> Cell:
    exp, ref, seed = draft.exp, draft.ref, draft.seed
    field_names = {f.name for f in dataclasses.fields(exp.config)}
    if seed is not None and "seed" not in field_names:
        raise SpecError(f"experiment '{exp.name}' has no seed field, so the sweep cannot set "
                        "seeds for it; drop seeds or give it its own [[cells]]")
    own = ref.name if ref is not None else None  # a bundled model's own defaults, if any
    overrides = {**exp.named_config(base, own), **draft.fixed, **draft.values}
    if seed is not None:
        overrides["seed"] = seed
    skip = _refusal(exp, ref)
    try:
        cfg = check_config(apply_overrides(exp.config, overrides))
        if ref is not None and ref.facts is not None and ref.facts.n_layers and not skip:
            check_layers(cfg, ref.facts.n_layers, ref.name)  # as the run will, once loaded
    except ConfigError as exc:
        raise SpecError(f"the sweep's cell {draft.source}: {exc}") from None
    skip = skip or _preflight(draft, cfg, runs_dir)
    # the overrides as the run will record them (tuples as lists), for matching earlier runs
    full = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    varying = {**draft.values, **({"seed": seed} if seed is not None else {})}
    return Cell(index=index, experiment=exp.name, model=ref, overrides=full, grid=varying,
                seed=full.get("seed") if isinstance(full.get("seed"), int) else None,
                skip=skip)


def bundled_refusal(exp: Experiment, name: str) -> str:
    """Why ``exp`` refuses the bundled model ``name``, from the zoo's facts about it and
    the same checks a sweep's plan makes (``""``: nothing refuses it), for the help and
    the demo's plan.

    Raises:
        UnknownNameError: ``name`` is not a bundled model.
    """
    spec = zoo.MODELS.get(name)
    facts = ModelFacts(name, spec.architecture, spec.causal, spec.has_lm_head, spec.n_layers)
    return _refusal(exp, ModelRef(name, name, facts=facts))


def _refusal(exp: Experiment, ref: ModelRef | None) -> str:
    """Why ``exp`` refuses ``ref``, from what is known without loading it: the check a run
    makes once the model has loaded (:meth:`Experiment.check_fit`), then the family's own
    refusal and the family x experiment matrix (:mod:`workbench.harness.matrix`, derived
    from the adapters); ``""`` when nothing known refuses it."""
    if ref is None or ref.facts is None:
        return ""
    try:
        exp.check_fit(ref.facts)
        adapter = adapters.FAMILIES_BY_ARCHITECTURE.get(ref.facts.architecture or "")
        if adapter is not None:
            adapter.refusal()  # what loading the model raises
            verdict = matrix.cell(adapter, exp)
            if not verdict.works:
                raise ModelCapabilityError(f"experiment '{exp.name}' cannot run on "
                                           f"{ref.name}: {verdict.reason}")
    except ModelCapabilityError as exc:
        return str(exc)
    return ""


def _preflight(draft: _Draft, cfg: Any, runs_dir: str | Path | None) -> str:
    """The experiment's refusals that need no weights (:attr:`Experiment.preflight`: a
    tokenizer read alone, a model's context, the stored runs a config names), made as the
    run makes them before its model loads, on the cell's model name and the sweep's store.

    Returns:
        A refusal of the model itself (:class:`ModelCapabilityError`, an encoder), as the
        cell's ``skip``, as :func:`_refusal`'s are; ``""`` when nothing refuses the cell.

    Raises:
        SpecError: any other refusal, naming the cell (the sweep would fail at it).
    """
    if draft.exp.preflight is None:
        return ""
    # every model a cell names exists by now (checkpoints and globs are resolved in the
    # store), so its name is what the run's preflight will be given
    try:
        draft.exp.preflight(cfg, draft.ref.name if draft.ref else None,
                            paths.runs_dir(runs_dir))
    except ModelCapabilityError as exc:
        return str(exc)
    except WorkbenchError as exc:
        raise SpecError(f"the sweep's cell {draft.source}: {exc}") from None
    return ""


def _check_distinct(cells: Sequence[Cell], drafts: Sequence[_Draft]) -> None:
    """Refuse two cells that are one run (same experiment, model and full config): the
    second would only be reused, and the joined table would count it twice."""
    seen: dict[tuple[str, str, str], int] = {}
    for cell in cells:
        key = (cell.experiment, cell.model.name if cell.model else "",
               json.dumps(dict(cell.overrides), sort_keys=True))
        if key in seen:
            first = seen[key]
            model = f" on {cell.model.name}" if cell.model else ""
            raise SpecError(f"two cells of the sweep are one run ({cell.experiment}{model}, "
                            f"the same config): {drafts[first].source} and "
                            f"{drafts[cell.index].source}; drop one")
        seen[key] = cell.index
# ---- models -------------------------------------------------------------------------------

def resolve_model(name: str, runs_dir: str | Path | None = None,
                  steps_every: int | None = None) -> list[ModelRef]:
    """The models a spec's model entry names: one, or every checkpoint a glob matches.

    The entry is read by :func:`workbench.models.reference.parse_model`, as ``workbench
    run`` reads it, and checked as far as it can be without loading any weights, so that
    a sweep never starts around a model no cell could load: a bundled name; a model
    folder whose config ``transformers`` reads and whose weight files have the headers of
    weights; a ``.gguf`` file that starts like one; a checkpoint in the store; a hub id in
    the Hugging Face cache or downloadable (a worker downloads it).

    Args:
        name: the model entry.
        runs_dir: the run store checkpoints are looked up in.
        steps_every: keep only checkpoint steps that are multiples of it (globs only).

    Returns:
        The models, a glob's in order of model then step, with what is known of each
        without loading it (:class:`ModelFacts`).

    Raises:
        UnknownNameError: a name that is none of these (with the closest bundled name),
            or a hub id neither cached nor downloadable.
        WorkbenchError: a checkpoint or glob naming no run, model or step of the store, or
            a path that is not a model.
    """
    match reference.parse_model(name):
        case reference.Bundled():
            spec = zoo.MODELS.get(name)
            facts = ModelFacts(name, spec.architecture, spec.causal, spec.has_lm_head,
                               spec.n_layers)
            return [ModelRef(name, name, checksum=_bundled_checksum(name), facts=facts)]
        case reference.CheckpointGlob() as glob:
            return _glob(name, glob, runs_dir, steps_every)
        case reference.Checkpoint(run=run, model=model, step=step):
            run_id, ref = checkpoints.resolve(run, model, step, runs_dir=runs_dir)
            return [_checkpoint_ref(run_id, ref)]
        case reference.Folder(path=path):
            return [_folder_ref(path)]
        case reference.Gguf(path=path):
            from workbench.models.gguf import check_gguf

            check_gguf(path)  # converted (and hashed) by the worker that loads it
            return [ModelRef(str(path.resolve()), str(path.resolve()))]
        case reference.Hub() as hub:
            reference.require_hub(hub)
            return [ModelRef(name, name, checksum="",  # a hub model records no checksum
                             facts=_config_facts(name, name) if hub.cached else None)]


def _folder_ref(path: Path) -> ModelRef:
    from workbench.models.hf import check_folder, check_weights, folder_checksum

    check_folder(path)
    check_weights(path)
    folder = str(path.resolve())  # absolute, so that a worker in another folder finds it
    return ModelRef(folder, folder, checksum=folder_checksum(path),
                    facts=_config_facts(folder, path))


def _config_facts(name: str, src: str | Path) -> ModelFacts:
    """A Hugging Face model's facts from its config: the family's adapter says whether it
    is causal; whether its LM head is trained is known only once it loads."""
    from workbench.models.hf import config_facts

    architecture, n_layers = config_facts(src)
    adapter = adapters.FAMILIES_BY_ARCHITECTURE.get(architecture or "")
    return ModelFacts(name, architecture, adapter.causal if adapter else None, None, n_layers)


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
    name = checkpoints.checkpoint_name(run_id, ref.n_layers, ref.step)
    facts = ModelFacts(name, native.ARCHITECTURE, True, True, ref.n_layers)  # native: causal LMs
    return ModelRef(name, f"{run_id}/L{ref.n_layers}", step=ref.step, tokens=meta.tokens,
                    checksum=meta.sha256[checkpoints.WEIGHTS], facts=facts)
