"""Head masks named on the command line: ``--ablate``, resolved to the same
:class:`~workbench.interventions.masks.HeadMask` a ``--heads-mask`` file holds.

Four forms name the heads a run ablates (``--ablation zero|mean|resample`` says what
replaces them, ``--ablation-seed`` the seed of a resample's donor draw):

- ``L17H3,L18H6``: these heads;
- ``top:METRIC:N`` with ``--from RUN``: the ``N`` heads of highest score of ``METRIC`` in
  RUN's ``head_scores`` table (ties broken by layer, then head);
- ``control:METRIC:N`` with ``--from RUN``: the same-layer control of ``top:METRIC:N``:
  in each layer that holds ``k`` of the top ``N`` heads, the ``k`` other heads of that
  layer with the lowest ``METRIC`` score (ties: the lower head), so the control removes
  as many heads from the same layers, the ones that do least of what is tested;
- ``class:NAME`` with ``--from RUN``: the heads in RUN's head class ``NAME`` at the
  false-discovery rate the class was declared at (its ``head_classes`` table).

Everything is checked before a model loads: the syntax, the heads against the model's
layers and query heads (read from the bundled model's entry or its ``config.json``), the
run, the metric or class (an unknown one lists the run's own), and the run's model against
the one the mask is for. Each refusal is one line.

Examples:
    >>> spec = parse_ablate("top:induction:9")
    >>> spec
    Top(metric='induction', n=9)
    >>> ablation_mask(spec, "mean", model="smollm2", from_run="20261206")  # doctest: +SKIP
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.core import paths
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.core.options import Ablation
from workbench.core.registry import did_you_mean
from workbench.core.values import shown
from workbench.harness import tables
from workbench.interventions.masks import HeadMask
from workbench.models import reference, zoo
from workbench.scores import classes
from workbench.store.records import head_name
from workbench.store.runs import Run, RunStore

FORMS = "L<layer>H<head>[,...], top:METRIC:N, control:METRIC:N or class:NAME"
"""What ``--ablate`` takes, as its messages say it."""
_HEAD = re.compile(r"L(\d{1,6})H(\d{1,6})", re.ASCII | re.IGNORECASE)
_COUNT = re.compile(r"[1-9][0-9]{0,5}", re.ASCII)


@dataclass(frozen=True)
class Listed:
    """``L17H3,L18H6``: these heads, as (layer, head)."""

    heads: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Top:
    """``top:METRIC:N``: the ``n`` best heads of a stored run's ``metric``."""

    metric: str
    n: int


@dataclass(frozen=True)
class Control:
    """``control:METRIC:N``: as many other heads of the layers of ``top:METRIC:N``, the
    lowest-scoring ones."""

    metric: str
    n: int


@dataclass(frozen=True)
class InClass:
    """``class:NAME``: a stored run's head class at its declared rate."""

    name: str


AblateSpec = Listed | Top | Control | InClass


def parse_ablate(text: str) -> AblateSpec:
    """What an ``--ablate`` value names (its syntax only; the model and runs are not read).

    Raises:
        WorkbenchError: text of none of the forms, saying which part is wrong.
    """
    kind, _, rest = text.partition(":")
    if kind in ("top", "control"):
        metric, _, count = rest.partition(":")
        if not metric or not _COUNT.fullmatch(count):
            raise WorkbenchError(f"--ablate {shown(text)}: expected {kind}:METRIC:N, N a "
                                 f"whole number from 1 ({kind}:induction:9)")
        return (Top if kind == "top" else Control)(metric, int(count))
    if kind == "class":
        if not rest:
            raise WorkbenchError(f"--ablate {shown(text)}: expected class:NAME (class:induction)")
        return InClass(rest)
    heads = []
    for item in text.split(","):
        if (found := _HEAD.fullmatch(item.strip())) is None:
            raise WorkbenchError(f"--ablate {shown(text)}: {shown(item)} is not a head; "
                                 f"expected {FORMS}")
        heads.append((int(found[1]), int(found[2])))
    return Listed(tuple(dict.fromkeys(heads)))


def model_heads(model: str) -> tuple[int, int] | None:
    """A model's layers and query heads from what is known before it loads: a bundled
    model's entry, a model folder's or a cached hub model's ``config.json``; ``None`` for
    a checkpoint, a GGUF file or an uncached hub id (checked once it loads).

    Raises:
        WorkbenchError: a model argument that names no model, or an unreadable config.
    """
    from workbench.models.hf import config_heads

    match reference.parse_model(model):
        case reference.Bundled(name=name):
            spec = zoo.MODELS.get(name)
            return spec.n_layers, spec.n_heads
        case reference.Folder(path=path):
            return config_heads(path)
        case reference.Hub(id=hub_id, cached=True):
            return config_heads(hub_id)
        case _:
            return None


def ablation_mask(spec: AblateSpec, ablation: Ablation, *, model: str | None,
                  from_run: str | None, runs_dir: str | Path | None = None,
                  seed: int | None = None) -> HeadMask:
    """The head mask ``spec`` names for ``model``, every part checked before it loads.

    Args:
        spec: what ``--ablate`` named (:func:`parse_ablate`).
        ablation: what replaces a removed head.
        model: the model argument of the run (``None``: the experiment takes none).
        from_run: ``--from``: a run id, unique prefix or folder (``top`` and ``class``).
        runs_dir: the run store ``from_run`` is looked up in.
        seed: ``--ablation-seed``: the seed of a ``resample`` mask's donor draw (``None``:
            0); refused with any other ablation.

    Raises:
        WorkbenchError: one line: a seed for an ablation other than ``resample``, no model,
            ``--from`` missing or given to a list of heads,
            no such run, an unknown metric or class (listing the run's), an empty class, a
            run on another model, or a head the model does not have.
    """
    if seed is not None and ablation != "resample":
        raise WorkbenchError(f"--ablation-seed goes with --ablation resample (the seed of its "
                             f"donor draw); --ablation {ablation} draws nothing")
    if model is None:
        raise WorkbenchError("--ablate needs --model: the mask is made for a model's heads")
    if isinstance(spec, Listed) == (from_run is not None):
        raise WorkbenchError("--from RUN goes with --ablate top:METRIC:N, control:METRIC:N "
                             "or class:NAME" if from_run is not None else
                             "--ablate top:, control: and class: read a stored run: give "
                             "--from RUN")
    shape = model_heads(model)
    if isinstance(spec, Listed):
        if shape is None:
            raise WorkbenchError(f"--ablate L<layer>H<head>: the heads of {shown(model)} are "
                                 "not known before it loads; use a --heads-mask file")
        heads, note = spec.heads, ""
    else:
        assert from_run is not None
        run = RunStore(paths.runs_dir(runs_dir)).get(from_run)
        shape = shape or run_shape(run)
        check_same_model(run, model, shape)
        heads = (_top_heads(run, spec) if isinstance(spec, Top) else
                 _control_heads(run, spec) if isinstance(spec, Control) else
                 _class_heads(run, spec))
        note = f"{_spec_text(spec)} of run {run.id}"
    _check_heads(heads, shape, model)
    name = model if isinstance(reference.parse_model(model), reference.Bundled) else None
    mask = HeadMask.ones(*shape, ablation=ablation, model=name, note=note,
                         seed=seed or 0).without(heads)
    mask.check_reference("--ablation mean")
    return mask


def _spec_text(spec: Top | Control | InClass) -> str:
    if isinstance(spec, InClass):
        return f"class:{spec.name}"
    return f"{'top' if isinstance(spec, Top) else 'control'}:{spec.metric}:{spec.n}"


def run_shape(run: Run) -> tuple[int, int]:
    if run.meta.model is None:
        raise WorkbenchError(f"run {run.id} ran on no model: it has no heads to ablate")
    return run.meta.model.n_layers, run.meta.model.n_heads


def check_same_model(run: Run, model: str, shape: tuple[int, int]) -> None:
    """Refuse a run of another model: a head at the same place is not the same head."""
    if run.status != "complete":
        raise WorkbenchError(f"run {run.id} is {run.status}, not complete: its tables are "
                             "not read")
    ran_on = run.meta.model
    bundled = isinstance(reference.parse_model(model), reference.Bundled)
    if ran_on is None or (bundled and ran_on.name != model) or \
            (ran_on.n_layers, ran_on.n_heads) != shape:
        on = f"{ran_on.name} ({ran_on.n_layers} x {ran_on.n_heads} heads)" if ran_on \
            else "no model"
        raise WorkbenchError(f"run {run.id} ran on {on}, not {model} ({shape[0]} x "
                             f"{shape[1]} heads): its heads are not this model's")


def _check_heads(heads: tuple[tuple[int, int], ...], shape: tuple[int, int],
                 model: str) -> None:
    n_layers, n_heads = shape
    for layer, head in heads:
        if layer >= n_layers or head >= n_heads:
            raise WorkbenchError(f"--ablate {head_name(layer, head)}: {model} has layers "
                                 f"0..{n_layers - 1} and heads 0..{n_heads - 1}")


def _table(run: Run, name: str, form: str) -> pd.DataFrame:
    if name not in run.table_names():
        raise WorkbenchError(f"--ablate {form}: run {run.id} ({run.experiment}) has no {name} "
                             f"table; its tables: {', '.join(run.table_names()) or 'none'}")
    return tables.read(run, name)


def _unknown(what: str, plural: str, name: str, known: list[str], run: Run
             ) -> UnknownNameError:
    return UnknownNameError(f"run {run.id} has no {what} {shown(name)}"
                            f"{did_you_mean(name, known)}; its {plural}: "
                            f"{', '.join(known) or 'none'}")


def _top_heads(run: Run, spec: Top) -> tuple[tuple[int, int], ...]:
    """The ``spec.n`` heads of highest ``spec.metric`` score (ties: lower layer, head)."""
    return _pairs(_ranked(run, spec).head(spec.n))


def _control_heads(run: Run, spec: Control) -> tuple[tuple[int, int], ...]:
    """In each layer with ``k`` of the top ``spec.n`` heads, its ``k`` other heads of
    lowest ``spec.metric`` score (ties: the lower head)."""
    ranked = _ranked(run, spec)
    top = ranked.head(spec.n)
    rest = ranked.iloc[spec.n:].sort_values(["layer", "score", "head"])
    heads: list[tuple[int, int]] = []
    for layer, count in top.layer.astype(int).value_counts().sort_index().items():
        others = rest[rest.layer == layer]
        if len(others) < count:
            raise WorkbenchError(f"--ablate {_spec_text(spec)}: layer {layer} holds {count} "
                                 f"of the top {spec.n} {spec.metric} heads of run {run.id} "
                                 f"and only {len(others)} other scored "
                                 f"head{'s' if len(others) != 1 else ''}: no control of as "
                                 "many heads")
        heads.extend(_pairs(others.head(count)))
    return tuple(sorted(heads))


def _ranked(run: Run, spec: Top | Control) -> pd.DataFrame:
    """RUN's scored heads of ``spec.metric``, best first (ties: lower layer, head)."""
    scores = _table(run, "head_scores", _spec_text(spec))
    known = list(dict.fromkeys(scores.metric))
    if spec.metric not in known:
        raise _unknown("metric", "metrics", spec.metric, known, run)
    rows = scores[(scores.metric == spec.metric) & scores.score.notna()]
    if "inputs" in rows.columns and rows.inputs.nunique() > 1:
        raise WorkbenchError(f"run {run.id} scores {spec.metric} on several inputs "
                             f"({', '.join(map(str, rows.inputs.unique()))}): "
                             f"{_spec_text(spec)} needs one")
    if spec.n > len(rows):
        raise WorkbenchError(f"--ablate {_spec_text(spec)}: run {run.id} has "
                             f"{spec.metric} scores for only {len(rows)} heads")
    return rows.sort_values(["score", "layer", "head"], ascending=[False, True, True])


def _class_heads(run: Run, spec: InClass) -> tuple[tuple[int, int], ...]:
    """The heads in class ``spec.name`` at the rate it was declared at."""
    table = classes.at_rate(_table(run, "head_classes", _spec_text(spec)))
    known = list(dict.fromkeys(table.head_class))
    if spec.name not in known:
        raise _unknown("head class", "head classes", spec.name, known, run)
    rows = table[(table.head_class == spec.name) & table.in_class]
    if rows.empty:
        rate = float(table[table.head_class == spec.name].fdr.iloc[0])
        raise WorkbenchError(f"--ablate {_spec_text(spec)}: run {run.id} has no head in "
                             f"{spec.name} at its FDR {rate:g}: nothing to ablate")
    return tuple(sorted(set(_pairs(rows))))


def _pairs(rows: pd.DataFrame) -> tuple[tuple[int, int], ...]:
    """The ``(layer, head)`` of each row, in order."""
    return tuple(zip(rows["layer"].astype(int).tolist(), rows["head"].astype(int).tolist(),
                     strict=True))
