"""The typed ``run.json``: what a run is, what produced it and how it ended.

:class:`RunMeta` is the one declaration of a run's ``run.json``; the store writes it
(:class:`workbench.store.runs.ActiveRun`) and reads it back (:meth:`RunMeta.from_json`)
through this model only, and every reader uses its attributes (``run.meta.model.name``,
``run.meta.summary``). :class:`ModelInfo` is what a loaded model is, the same record a
run keeps of the model it ran on.

A ``run.json`` that does not match is not read at all: its run is listed as ``damaged``
with the field named (``run.json 'pid': expected at most 2147483647, got 4294967296``),
and no other run is affected.

Examples:
    >>> meta = RunMeta.from_json(open("data/runs/<id>/run.json", "rb").read(),
    ...                          what="run.json")                       # doctest: +SKIP
    >>> meta.model.name, meta.status, meta.tables["head_scores"].rows   # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from workbench.core.errors import WorkbenchError
from workbench.core.options import Ablation, Status, TakenPath
from workbench.core.records import Count, Hex64, Json, Matching, Record, RelPath

RUN_ID_PATTERN = r"[0-9]{8}-[0-9]{6}-[\w.-]{1,81}-[0-9a-f]{4}"
"""A run id: ``<date>-<time>-<experiment>-<model>-<4 hex digits>``, the experiment and
model slugged to letters, digits, dots and hyphens; nothing else names a run folder (no
newline, no path separator, no leading dot)."""
RunId = Annotated[str, Matching(RUN_ID_PATTERN,
                                "a run id (<date>-<time>-<experiment>-<model>-<4 hex>)",
                                max_length=120)]
PID_MAX = 2**31 - 1
"""The largest process id a ``pid_t`` holds."""
Timestamp = Annotated[str, Matching(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?([+-]\d{2}:\d{2}|Z)?",
    "an ISO 8601 time (2026-12-01T10:00:00+00:00)", max_length=40)]
"""An ISO 8601 time, as ``datetime.isoformat`` writes it."""
Text = Annotated[str, Field(max_length=1 << 20)]
Load = Annotated[float, Field(ge=0)]
LoadAverage = tuple[Load, Load, Load]
"""``os.getloadavg()``: the machine's mean number of runnable processes over the last 1, 5
and 15 minutes."""
MAX_LAYERS = 1 << 16
LayerType = Literal["global", "sliding"]
"""How far back a layer's queries see: ``global``, every key the model's mask allows (every
earlier one in a causal model, every one in an encoder); ``sliding``, only the last
:attr:`ModelInfo.sliding_window` keys, the query's own included."""


class ModelInfo(Record):
    """What a loaded model is, where it came from, and what it can be used for.

    Kept in ``run.json`` of every run on a model, and in a recording's ``index.json``.
    """

    name: str
    source: str
    checksum: str
    """SHA-256 of the weights ('' when unknown, e.g. a hub model)."""
    architecture: str
    n_layers: Annotated[int, Field(ge=1, le=MAX_LAYERS)]
    n_heads: Annotated[int, Field(ge=1, le=1 << 16)]
    n_kv_heads: Annotated[int, Field(ge=1, le=1 << 16)]
    d_model: Annotated[int, Field(ge=1, le=1 << 20)]
    d_head: Annotated[int, Field(ge=1, le=1 << 20)]
    n_ctx: Annotated[int, Field(ge=1, le=1 << 30)]
    d_vocab: Annotated[int, Field(ge=1, le=1 << 30)]
    positions: str
    """The position scheme: ``rotary``, ``learned``, ``alibi``, ..."""
    causal: bool
    has_lm_head: bool
    bos_token_id: Annotated[int, Field(ge=0, le=1 << 30)] | None
    dtype: Literal["float32", "bfloat16", "float16"]
    load_seconds: Annotated[float, Field(ge=0)] = 0.0
    # not strict: a model validator that runs before the fields hands them over parsed, a
    # JSON array as a list
    layer_types: Annotated[tuple[LayerType, ...], Field(strict=False)]
    """Each layer's attention span, in order (see :data:`LayerType`)."""
    sliding_window: Annotated[int, Field(ge=1, le=1 << 30)] | None
    """The keys a sliding layer's query sees at most, its own included (``None``: the model
    has no sliding layer)."""

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON values."""
        return self.to_data()

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends to a sliding window (see :meth:`window`).

        Raises:
            WorkbenchError: ``layer`` is not a layer of the model.
        """
        return self.window(layer) is not None

    def window(self, layer: int) -> int | None:
        """The keys a query of ``layer`` sees at most, its own included, or ``None`` for a
        global layer (every key the mask allows).

        Raises:
            WorkbenchError: ``layer`` is not a layer of the model.
        """
        if not 0 <= layer < self.n_layers:
            raise WorkbenchError(f"layer {layer} is not a layer of {self.name}, which has "
                                 f"layers 0..{self.n_layers - 1}")
        return self.sliding_window if self.layer_types[layer] == "sliding" else None

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """The layers that attend to a sliding window, in order."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "sliding")

    @property
    def global_layers(self) -> tuple[int, ...]:
        """The layers that attend to every key the mask allows, in order."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "global")

    @model_validator(mode="before")
    @classmethod
    def _written_before(cls, data: Any) -> Any:
        # Runs written before these fields existed: an untrained head was not yet told
        # apart, no BOS was recorded, every model was loaded in float32, and no layer type
        # was recorded (every model then read was taken as global in every layer).
        if isinstance(data, dict):
            for key, value in (("has_lm_head", True), ("bos_token_id", None),
                               ("dtype", "float32")):
                data.setdefault(key, value)
            n_layers = data.get("n_layers")
            if "layer_types" not in data and type(n_layers) is int and \
                    1 <= n_layers <= MAX_LAYERS:
                data["layer_types"] = ("global",) * n_layers
                data.setdefault("sliding_window", None)
        return data

    @model_validator(mode="after")
    def _layers(self) -> ModelInfo:
        if len(self.layer_types) != self.n_layers:
            raise ValueError(f"'layer_types' must hold n_layers = {self.n_layers} values, got "
                             f"{len(self.layer_types)}")
        if ("sliding" in self.layer_types) != (self.sliding_window is not None):
            raise ValueError("'sliding_window' must be set exactly when a layer is 'sliding'")
        return self


class TableEntry(Record):
    """A stored table: its file inside the run folder, its row count and SHA-256."""

    file: RelPath
    rows: Count
    sha256: Hex64


class GitRevision(Record):
    commit: str | None
    dirty: bool


class Machine(Record):
    """Where the run ran."""

    platform: str
    cpu_count: Count | None
    torch_threads: Count
    argv: tuple[Text, ...]


MASK_FORMAT = "workbench-heads-mask"
Weight = Annotated[float, Field(ge=0, le=1)]
"""A head's mask value: 1 keeps it, 0 removes it."""


class HeadMaskFile(Record):
    """A head mask as JSON: a ``--heads-mask FILE``, and a run's ``interventions``.

    The mask itself is :class:`workbench.interventions.masks.HeadMask`; this is its file.
    """

    format: Literal["workbench-heads-mask"]
    version: Literal[1] = 1
    model: str | None = None
    """The model the mask was made for (checked when it is applied)."""
    n_layers: Annotated[int, Field(ge=1, le=1 << 16)]
    n_heads: Annotated[int, Field(ge=1, le=1 << 16)]
    ablation: Ablation = "zero"
    reference: str = "natural"
    """For ``mean``: the prompt set whose mean head outputs replace a removed head."""
    seed: Annotated[int, Field(ge=0, le=(1 << 63) - 1)] = 0
    """For ``resample``: the seed of the donor draw (a file written before it reads as 0)."""
    note: str = ""
    mask: tuple[tuple[Weight, ...], ...]
    """``n_layers`` rows of ``n_heads`` values in [0, 1]."""
    extra: dict[str, Json] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _shape(self) -> HeadMaskFile:
        if len(self.mask) != self.n_layers:
            raise ValueError(f"'mask' must be a list of n_layers = {self.n_layers} rows, got "
                             f"{len(self.mask)} rows")
        for layer, row in enumerate(self.mask):
            if len(row) != self.n_heads:
                raise ValueError(f"'mask' row {layer} must hold n_heads = {self.n_heads} "
                                 f"values, got {len(row)} values")
        return self


    def removed(self) -> tuple[tuple[int, int], ...]:
        """The (layer, head) pairs whose value is 0, in order."""
        return tuple((layer, head) for layer, row in enumerate(self.mask)
                     for head, value in enumerate(row) if value == 0)

    def scaled(self) -> tuple[tuple[int, int], ...]:
        """The (layer, head) pairs whose value is strictly between 0 and 1, in order."""
        return tuple((layer, head) for layer, row in enumerate(self.mask)
                     for head, value in enumerate(row) if 0 < value < 1)


class Interventions(Record):
    """What was changed in the model for a whole run."""

    heads_mask: HeadMaskFile | None = None


SHOWN_HEADS = 3
"""The heads a short form names before ``...``."""


def head_name(layer: int, head: int) -> str:
    """A head as every summary and label names it: ``L17H3``."""
    return f"L{layer}H{head}"


def _heads_text(heads: tuple[tuple[int, int], ...]) -> str:
    names = [head_name(layer, head) for layer, head in heads[:SHOWN_HEADS]]
    return ", ".join(names + (["..."] if len(heads) > SHOWN_HEADS else []))


def interventions_text(interventions: Interventions | None) -> str:
    """A run's interventions in a few words, as every listing, label, card and title shows
    them: ``9 heads mean-ablated (L17H3, L17H4, L17H5, ...)``; ``""`` for a run without any.

    A mask's heads scaled between 0 and 1 are named apart (``2 heads scaled (L0H1,
    L1H0)``); a resample's seed is named where it is not 0 (``1 head resample-ablated,
    seed 3 (L0H1)``); a mask that changes nothing says so (``head mask of all ones``).

    Examples:
        >>> mask = HeadMaskFile(format="workbench-heads-mask", n_layers=2, n_heads=2,
        ...                     ablation="mean", mask=((1, 0), (0, 1)))
        >>> interventions_text(Interventions(heads_mask=mask))
        '2 heads mean-ablated (L0H1, L1H0)'
    """
    mask = interventions.heads_mask if interventions is not None else None
    if mask is None:
        return ""
    removed, scaled = mask.removed(), mask.scaled()
    seeded = f", seed {mask.seed}" if mask.ablation == "resample" and mask.seed else ""
    parts = [f"{len(heads)} head{'' if len(heads) == 1 else 's'} {what} ({_heads_text(heads)})"
             for heads, what in ((removed, f"{mask.ablation}-ablated{seeded}"),
                                 (scaled, "scaled")) if heads]
    return "; ".join(parts) or "head mask of all ones"


_HEAD_MENTION = re.compile(r"\bL(?P<layer>\d+)H(?P<head>\d+)\b(?P<tail> \([^()]*\)"
                           r"| [+-]?\d[\w.+-]*(?: \[[^\]]*\])?)?")
"""A head named in a summary line (``L18H6``), with the score and interval or the
parenthesis that follow it (``L18H6 0.94 [0.91, 0.96]``, ``L18H6 (0.94)``)."""


def marked_summary(lines: Iterable[str], interventions: Interventions | None) -> list[str]:
    """Summary lines in which every head the run's own mask removed or scaled says so:
    ``top induction heads: L18H6 0.94 (ablated in this run), L17H3 0.91``.

    A mask acting on a head's output leaves what is measured of its pattern unchanged,
    so a line ranking heads by their patterns would otherwise read as if none was ablated.
    """
    mask = interventions.heads_mask if interventions is not None else None
    if mask is None:
        return list(lines)
    said = {head: "ablated in this run" for head in mask.removed()}
    said |= {head: "scaled in this run" for head in mask.scaled()}

    def mark(found: re.Match[str]) -> str:
        note = said.get((int(found["layer"]), int(found["head"])))
        return f"{found[0]} ({note})" if note else found[0]

    return [_HEAD_MENTION.sub(mark, line) for line in lines]


def busy_load(loads: list[Any], cores: int | None) -> bool | None:
    """Whether a machine of ``cores`` cores was busy: any of ``loads`` (load averages, or
    ``None`` where not read) with a 1-minute load above its cores; ``None`` when no load or
    the cores are unknown."""
    ones = [load[0] for load in loads if load]
    if not cores or not ones:
        return None
    return max(ones) > cores


class RunMeta(Record):
    """A run's ``run.json``.

    ``status`` as stored is what the writing process last said; :class:`workbench.store.runs.Run`
    turns a staged ``running`` or ``complete`` into ``running`` or ``interrupted`` by whether
    the process still lives, and a file that fails this model into ``damaged``.
    """

    run_id: RunId
    experiment: Annotated[str, Field(min_length=1, max_length=200)]
    """The experiment's registered name, or another run kind (``record``, ``reproduce``,
    ``sweep``)."""
    model: ModelInfo | None
    config: dict[str, Json]
    """The full config the run used (tuples as lists)."""
    started_at: Timestamp
    status: Status
    seed: int | None = None
    workbench_version: str | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    """Versions of the packages a result depends on (``None``: not installed)."""
    git: GitRevision | None = None
    machine: Machine | None = None
    pid: Annotated[int, Field(ge=1, le=PID_MAX)] | None = None
    """The process that wrote the run."""
    pid_started: Annotated[float, Field(ge=0)] | None = None
    """When that process started (seconds since the epoch): a live process with the same
    pid but another start time is not the writer (the pid was reused)."""
    tables: dict[Annotated[str, Field(max_length=200)], TableEntry] = Field(default_factory=dict)
    recordings: dict[RelPath, Hex64] = Field(default_factory=dict)
    """The SHA-256 of each recording's ``index.json`` (by its folder in the run), kept when
    the run completes: an index edited afterwards, its manifest re-hashed, is refused."""
    interventions: Interventions | None = None
    """What was changed in the model for the whole run (``None``: nothing)."""
    summary: tuple[Text, ...] = ()
    """A few lines for the terminal, written by the experiment."""
    ended_at: Timestamp | None = None
    error: Text | None = None
    """Why the run failed, was interrupted or is damaged."""
    traceback: Text | None = None
    cpus: Annotated[float, Field(ge=0)] | None = None
    """Sweeps: CPUs given to each cell."""
    gpus: Annotated[float, Field(ge=0)] | None = None
    address: str | None = None
    """Sweeps: the Ray cluster the cells ran on (``None``: a local one)."""
    cells: tuple[RunId | Literal[""], ...] | None = None
    """Sweeps: the run id of every cell, in order (empty for a cell that did not run)."""
    load_at_start: LoadAverage | None = None
    """The machine's load average as the run started (``None``: not recorded; runs
    written before this field, or a platform without ``os.getloadavg``)."""
    load_at_end: LoadAverage | None = None
    """The machine's load average as the run ended (complete or failed)."""
    attention: TakenPath | None = None
    """The path the run's attention took: the fused kernel, the blocked torch pass, or the
    bridge's eager attention (``None``: no scan noted one, or a run written before this
    field)."""
    peak_rss_mib: Annotated[float, Field(ge=0)] | None = None
    """The process's peak resident memory (MiB) when the run ended: the process's whole
    life, so a second run in one process reports at least the first's (``None``: not
    recorded)."""
    peak_gpu_mib: Annotated[float, Field(ge=0)] | None = None
    """``torch.cuda.max_memory_allocated`` (MiB) over the run, on the current CUDA device
    (``None``: CUDA was not used, or not recorded)."""

    @model_validator(mode="after")
    def _facts_agree(self) -> RunMeta:
        """The facts a run states agree with each other: it ends after it starts, and
        its seed is its config's (the store writes both from one value)."""
        from datetime import UTC, datetime

        def utc(stamp: str) -> datetime:  # a stamp without a zone is the store's UTC
            moment = datetime.fromisoformat(stamp)
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)

        if self.ended_at is not None and utc(self.ended_at) < utc(self.started_at):
            raise ValueError(f"'ended_at' {self.ended_at} is before 'started_at' "
                             f"{self.started_at}")
        stated = self.config.get("seed")
        if isinstance(stated, int) and not isinstance(stated, bool) and self.seed != stated:
            raise ValueError(f"'seed' {self.seed} is not the config's seed {stated}")
        return self

    @property
    def busy(self) -> bool | None:
        """Whether the machine was busy during the run: a 1-minute load above its cores at
        the start or at the end, so its wall time is not the run's own (``None``: the load
        or the cores were not recorded)."""
        cores = self.machine.cpu_count if self.machine else None
        return busy_load([self.load_at_start, self.load_at_end], cores)

    @property
    def load_note(self) -> str:
        """The load in a few words, for beside a wall time: ``busy (load 3.1 at start, 2.4
        at end, 2 cores)``, ``idle (...)`` or ``load not recorded``."""
        busy = self.busy
        if busy is None:
            return "load not recorded"
        parts = [f"{load[0]:.1f} at {when}" for when, load in
                 (("start", self.load_at_start), ("end", self.load_at_end)) if load]
        cores = self.machine.cpu_count if self.machine else None
        return f"{'busy' if busy else 'idle'} (load {', '.join(parts)}, {cores} cores)"

    @property
    def seconds(self) -> float | None:
        """How long the run took, or ``None`` if it has not ended."""
        from datetime import datetime

        if self.ended_at is None:
            return None
        try:
            start = datetime.fromisoformat(self.started_at)
            end = datetime.fromisoformat(self.ended_at)
        except ValueError:
            return None
        return max((end - start).total_seconds(), 0.0)


RECORDS: dict[str, type[Record]] = {"run": RunMeta, "heads-mask": HeadMaskFile}
"""The store's record types by schema name (``data/schemas/<name>.schema.json``)."""
