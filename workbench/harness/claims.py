"""Published claims as data, checked against what the workbench measures.

``data/claims/*.json`` each hold a list of claims. A claim says what a paper reports, which
models it applies to, which experiment and config test it, and which *check* turns that
experiment's run into a verdict::

    {
      "id": "olsson2022-induction-stripe",
      "kind": "reproduction",            # or "invariant" (see KINDS)
      "paper": "Olsson et al. 2022, In-context Learning and Induction Heads",
      "where": "section 2, 'Induction heads'",
      "quote": "...",                    # the paper's words, exactly; omitted when unverified
      "statement": "a trained causal LM has at least one head with a clear induction stripe",
      "published": "induction heads in every model with two or more layers",
      "applies_to": "causal",            # "causal", "encoder", "any", "none", or names
      "models": ["smollm2"],             # what `workbench reproduce` runs by default
      "experiment": "induction-heads",
      "config": {"base": "demo", "n_prompts": 16},   # or "demo", or "default"
      "check": {"name": "max_score_at_least", "metric": "induction", "threshold": 0.4}
    }

A config field that takes the id of another experiment's run (the circuit experiment's
``classes_from``) is filled by ``run_inputs``, never pinned by hand::

      "experiment": "circuit",
      "config": "demo",
      "run_inputs": {"classes_from": {"experiment": "ioi", "config": "demo"}}

:func:`reproduce` runs (or reuses, matched on model and config as any run) that ``ioi``
run first, on the same model, and runs the claim's experiment with its id in
``classes_from``. A file naming an unknown experiment there, a field its experiment does
not have, or a field its config pins too, is refused when it is loaded.

A claim about models that its experiment trains itself (``induction-formation``) has
``"applies_to": "none"`` and ``"models": []``: :func:`reproduce` runs the experiment once
with no model (and skips the claim when a ``--model`` is given).

A claim's ``kind`` keeps two things apart: a *reproduction* is a paper's empirical finding,
checked with the paper's protocol (its ``where`` names the table or figure and its ``quote``
gives the paper's words); an *invariant* is a mathematical property that holds for any model
of the kind (a theorem, kept as a regression test), and is never counted as a reproduced
finding. ``workbench reproduce`` reports the two in separate groups.

Checks are functions registered with :func:`claim_check`: ``check(run, **params) ->
Measurement``. Generic ones live here; an experiment registers its own next to its code.
A parameter annotated :data:`HeadMetric` names a head metric, and a claim that gives it a
name :mod:`workbench.scores.metrics` does not register is refused when it is loaded (or,
for an experiment's check, before anything runs), with the registered names listed.
A numeric check compares an interval (bootstrap, or across seeds or orders) with the
claim's threshold (:meth:`Measurement.compare`), and a check whose run could not reach the
claimed quantity says ``undecided`` and why.

:func:`reproduce` runs what is needed (reusing matching complete runs), applies every
check and returns the table that ``workbench reproduce`` prints and stores.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

import pandas as pd
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from workbench.core import paths
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.core.files import read_bounded
from workbench.core.records import STRICT, Json, Matching, Record, RecordList
from workbench.core.registry import Registry, did_you_mean
from workbench.harness.tables import read as read_table
from workbench.scores import metrics
from workbench.store.runs import Run, RunStore
from workbench.store.schema import Table, columns, tables

if TYPE_CHECKING:
    from workbench.models.base import Model

log = logging.getLogger(__name__)

Kind = Literal["reproduction", "invariant"]
KINDS: tuple[str, ...] = get_args(Kind)
"""``reproduction``: a paper's empirical finding; ``invariant``: a mathematical property
that follows for any such model."""
CLAIMS_TABLE = Table("claims", "one verdict per (claim, model)", columns(
    ("claim", "str", "claim id (data/claims/*.json)"),
    ("kind", "str", "reproduction (a paper's finding) or invariant (a mathematical property)"),
    ("source", "str", "paper and place (table, figure, section)"),
    ("model", "str", "model the claim was checked on ('-' for models an experiment trains)"),
    ("statement", "str", "what the claim says"),
    ("published", "str", "the published figure"),
    ("measured", "str", "what the check measured, in words"),
    ("value", "float", "the measured value the verdict is about (NaN when not numeric)"),
    ("ci_low", "float", "low end of the interval compared with the threshold (NaN: none)"),
    ("ci_high", "float", "high end of that interval (NaN: none)"),
    ("threshold", "float", "the claim's threshold (NaN when the check has none)"),
    ("verdict", "str", "pass, fail, undecided, skipped or error"),
    ("reason", "str", "why a claim was skipped or could not be checked"),
    ("run", "str", "id of the run the check read ('' when none)"),
))
VERDICT_COLUMNS = CLAIMS_TABLE.names


Verdict = Literal["pass", "fail", "undecided", "skipped", "error"]
"""``undecided``: the run could not reach the claimed quantity, or the interval of the
measured value straddles the threshold; ``error``: the check could not read the run."""
Side = Literal["above", "below"]


def judge(low: float, high: float, threshold: float, side: Side) -> Verdict:
    """The verdict of an interval ``[low, high]`` against a threshold the claim says the
    quantity lies ``above`` (``>=``) or ``below`` (``<=``): pass when the whole interval is
    on the claimed side, fail when the whole interval is on the other side, undecided when
    it straddles the threshold (or is not finite)."""
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        return "undecided"
    if side == "above":
        return "pass" if low >= threshold else "fail" if high < threshold else "undecided"
    return "pass" if high <= threshold else "fail" if low > threshold else "undecided"


@dataclass(frozen=True)
class Measurement:
    """What a check measured, in words a reader can compare with the published figure,
    and its verdict.

    A numeric check gives the measured ``value`` with its interval ``ci_low``..``ci_high``
    and the ``threshold`` it was compared with (see :func:`judge` and :meth:`compare`);
    ``passed`` is the older yes/no form, read as pass/fail when ``verdict`` is not given.
    """

    measured: str
    passed: bool | None = None
    value: float | None = None
    verdict: Verdict | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.verdict is None and self.passed is None:
            raise ValueError("a Measurement needs a verdict or passed")

    @property
    def outcome(self) -> Verdict:
        if self.verdict is not None:
            return self.verdict
        return "pass" if self.passed else "fail"

    @classmethod
    def compare(cls, measured: str, value: float, low: float, high: float, threshold: float,
                side: Side) -> Measurement:
        """A numeric measurement judged by :func:`judge` on its interval."""
        verdict = judge(low, high, threshold, side)
        return cls(measured, value=value, verdict=verdict, ci_low=low, ci_high=high,
                   threshold=threshold)


Check = Callable[..., Measurement]
CHECKS: Registry[Check] = Registry("claim check")
HeadMetric = Annotated[str, "a registered head metric"]
"""The type of a check parameter that names a head metric (checked against the registry)."""


def claim_check(name: str) -> Callable[[Check], Check]:
    """Register a check: ``fn(run: Run, **params) -> Measurement``."""
    return CHECKS.decorator(name)


ClaimId = Annotated[str, Matching(r"[a-z0-9][a-z0-9.-]{0,99}", "a claim id (lower-case letters, "
                                  "digits, '.' and '-')", max_length=100)]
Target = Literal["causal", "encoder", "any", "none"]


class CheckSpec(Record):
    """Which registered check judges a claim, and its parameters (``threshold``,
    ``metric``, ...: whatever the check takes as keywords)."""

    model_config = ConfigDict({**STRICT, "extra": "allow"})
    name: Annotated[str, Field(min_length=1, max_length=100)]

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def __str__(self) -> str:
        return json.dumps(self.to_data(), sort_keys=True)


ConfigSpec = Literal["default", "demo"] | dict[str, Json]
"""A named config of an experiment, with pins (see ``Experiment.named_config``)."""


class RunInput(Record):
    """The run whose id a claim's config field takes: ``experiment`` run with ``config``
    on the claim's model."""

    experiment: Annotated[str, Field(min_length=1, max_length=100)]
    config: ConfigSpec = "default"

    def __str__(self) -> str:
        return f"the id of a run of {self.experiment} with the config {json.dumps(self.config)}"


class Claim(Record):
    """One entry of a ``data/claims/*.json`` file (see the module docstring)."""

    id: ClaimId
    kind: Kind
    paper: str
    statement: str
    published: str
    applies_to: Target | tuple[str, ...]
    """``causal``, ``encoder``, ``any``, ``none`` (the experiment trains its own models),
    or the names of the models it is about."""
    models: tuple[str, ...]
    """What ``workbench reproduce`` runs by default."""
    experiment: str
    check: CheckSpec
    where: str = ""
    quote: str = ""
    """The paper's words, exactly (empty when they could not be verified)."""
    config: ConfigSpec = "default"
    """A named config of the experiment, with pins (see ``Experiment.named_config``)."""
    run_inputs: dict[str, RunInput] = Field(default_factory=dict)
    """Config fields that take the id of another experiment's run, run (or reused) first
    on the same model by :func:`reproduce`."""
    _file: str = PrivateAttr(default="")

    @property
    def base_config(self) -> str:
        """The named config the claim's pins sit on: ``"default"`` or ``"demo"``."""
        return self.config if isinstance(self.config, str) else str(
            self.config.get("base", "default"))

    @property
    def file(self) -> str:
        """The claims file it was read from (``""`` for one made in Python)."""
        return self._file

    @model_validator(mode="after")
    def _models_fit(self) -> Claim:
        if self.applies_to == "none" and self.models:
            raise ValueError('"applies_to": "none" (the experiment trains its own models) '
                             'goes with "models": []')
        pinned = sorted(set(self.run_inputs) & set(self.config if isinstance(self.config, dict)
                                                   else ()))
        if pinned:
            raise ValueError(f"'{pinned[0]}' is both pinned in the config and filled by "
                             "run_inputs: give it one way")
        return self

    @property
    def source(self) -> str:
        return f"{self.paper}, {self.where}" if self.where else self.paper

    @property
    def model_free(self) -> bool:
        """The claim's experiment trains its own models (``"applies_to": "none"``)."""
        return self.applies_to == "none"

    def applies(self, model_name: str, causal: bool) -> str | None:
        """``None`` if the claim applies to the model, else the reason it does not."""
        target = self.applies_to
        if isinstance(target, tuple):
            return None if model_name in target else f"the claim is about {', '.join(target)}"
        if target == "causal" and not causal:
            return "the claim is about causal language models"
        if target == "encoder" and causal:
            return "the claim is about bidirectional encoders"
        return None


CLAIMS_FILE = RecordList(Claim)
"""A claims file: a JSON list of claims."""
MAX_CLAIMS_FILE = 16 << 20


def check_metric_names(claim: Claim) -> None:
    """Refuse a claim whose check gives a :data:`HeadMetric` parameter an unregistered
    name (a check not registered yet, an experiment's before discovery, is let through).

    Raises:
        UnknownNameError: naming the claim and listing the registered metrics.
    """
    if claim.check.name not in CHECKS:
        return
    params = claim.check.params
    hints = typing.get_type_hints(CHECKS.get(claim.check.name), include_extras=True)
    for param in (p for p, tp in hints.items() if tp == HeadMetric and p in params):
        try:
            metrics.get(params[param])
        except UnknownNameError as exc:
            raise UnknownNameError(f"{claim.file}: claim {claim.id}: {exc}") from None


def check_run_inputs(claim: Claim) -> None:
    """Refuse a claim whose ``run_inputs`` name an unknown experiment or config, or a field
    the claim's experiment does not have (experiments are discovered only for such a claim).

    Raises:
        WorkbenchError: one line naming the claim.
    """
    if not claim.run_inputs:
        return
    from workbench.harness.config import apply_overrides
    from workbench.harness.experiment import discover
    from workbench.harness.experiment import get as get_experiment

    discover()
    try:
        fields = {f.name for f in dataclasses.fields(get_experiment(claim.experiment).config)}
        for name, source in claim.run_inputs.items():
            if name not in fields:
                raise WorkbenchError(f"run_inputs: experiment '{claim.experiment}' has no "
                                     f"config field '{name}'{did_you_mean(name, fields)}")
            exp = get_experiment(source.experiment)
            apply_overrides(exp.config, exp.named_config(source.config))
    except WorkbenchError as exc:
        raise type(exc)(f"{claim.file}: claim {claim.id}: {exc}") from None


def read_claims_file(path: Path) -> tuple[Claim, ...]:
    """The claims of one file.

    Raises:
        WorkbenchError: unreadable, not a regular file, too large, not JSON (binary data
            included), or a claim that does not match :class:`Claim` (one line naming the
            file, the claim's place and the field).
    """
    data = read_bounded(path, MAX_CLAIMS_FILE, what="the claims file")
    claims = CLAIMS_FILE.from_json(data, what=path.name)
    for claim in claims:
        claim._file = path.name
        check_metric_names(claim)
        check_run_inputs(claim)
    return claims


def load_claims(folder: Path | None = None) -> list[Claim]:
    """Every claim in ``data/claims/*.json``.

    Raises:
        WorkbenchError: a malformed file, a missing field, an unknown kind, a duplicate id.
    """
    folder = folder or paths.data_dir() / "claims"
    claims: dict[str, Claim] = {}
    for path in sorted(folder.glob("*.json")):
        for claim in read_claims_file(path):
            if claim.id in claims:
                raise WorkbenchError(f"claim id '{claim.id}' appears twice ({path.name})")
            claims[claim.id] = claim
    return list(claims.values())


def select(claims: Sequence[Claim], ids: Sequence[str]) -> list[Claim]:
    """The claims named in ``ids`` (all when empty); an unknown id lists the known ones."""
    if not ids:
        return list(claims)
    by_id = {c.id: c for c in claims}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise UnknownNameError(
            f"unknown claim '{unknown[0]}'{did_you_mean(unknown[0], by_id)}; "
            f"known claims: {', '.join(sorted(by_id))}")
    return [by_id[i] for i in ids]


def claim_config(claim: Claim) -> dict[str, Any]:
    """The config overrides the claim's experiment runs with."""
    from workbench.harness.experiment import get as get_experiment

    return get_experiment(claim.experiment).named_config(claim.config)


def run_claim(claim: Claim, model: Model | None, *, runs_dir: str | Path | None,
              fresh: bool) -> Run:
    """The run a claim's check reads: its ``run_inputs`` run (or reused) first on the same
    model, their ids in its config, then its own experiment run (or reused)."""
    from workbench.harness.experiment import get as get_experiment
    from workbench.harness.experiment import run_experiment

    config = claim_config(claim)
    for name, source in claim.run_inputs.items():
        made = run_experiment(source.experiment, model,
                              get_experiment(source.experiment).named_config(source.config),
                              runs_dir=runs_dir, reuse=not fresh)
        log.info("claim %s: %s = run %s", claim.id, name, made.id)
        config[name] = made.id
    return run_experiment(claim.experiment, model, config, runs_dir=runs_dir, reuse=not fresh)


def evaluate(claim: Claim, run: Run) -> Measurement:
    """Apply the claim's check to a run of its experiment."""
    return CHECKS.get(claim.check.name)(run, **claim.check.params)


def reproduce(claims: Sequence[Claim], *, model: str | None = None,
              runs_dir: str | Path | None = None, fresh: bool = False,
              device: str = "cpu") -> pd.DataFrame:
    """Run (or reuse) what each claim needs and judge it.

    Args:
        claims: the claims to check.
        model: check every claim that applies to this model instead of its default models.
        runs_dir: the run store.
        fresh: run again even when a matching complete run exists.
        device: torch device the models load on.

    Returns:
        One row per (claim, model), the columns of :data:`CLAIMS_TABLE`: the claim, its kind
        and source, what was measured (value, interval, threshold) and the verdict (pass /
        fail / undecided / skipped / error) with the reason and the run it read.
    """
    from workbench.harness.experiment import discover
    from workbench.harness.experiment import get as get_experiment
    from workbench.models.load import load_model

    discover()  # experiments register their checks when imported
    ensure_checks_exist(claims)
    loaded: dict[str, Any] = {}
    rows = []
    for claim in claims:
        get_experiment(claim.experiment)  # an unknown experiment is a broken claim file
        if claim.model_free:
            rows.append(_reproduce_model_free(claim, model, runs_dir, fresh))
            continue
        for name in ([model] if model else claim.models):
            row = _row(claim, name)
            rows.append(row)
            try:
                if name not in loaded:
                    loaded[name] = load_model(name, runs_dir=runs_dir, device=device)
            except WorkbenchError as exc:
                loaded[name] = exc
            target = loaded[name]
            if isinstance(target, WorkbenchError):
                row["reason"] = f"model unavailable: {target}"
                continue
            if (why := claim.applies(name, target.info.causal)) is not None:
                row["reason"] = why
                continue
            try:
                run = run_claim(claim, target, runs_dir=runs_dir, fresh=fresh)
                result = evaluate(claim, run)
            except WorkbenchError as exc:
                row.update(verdict="error", reason=str(exc))
                continue
            row.update(_result(result), run=run.id)
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def _row(claim: Claim, model: str) -> dict[str, Any]:
    """A claims-table row not judged yet (skipped until a check says otherwise)."""
    nan = float("nan")
    return {"claim": claim.id, "kind": claim.kind, "source": claim.source, "model": model,
            "statement": claim.statement, "published": claim.published, "measured": "",
            "value": nan, "ci_low": nan, "ci_high": nan, "threshold": nan,
            "verdict": "skipped", "reason": "", "run": ""}


def _result(result: Measurement) -> dict[str, Any]:
    def number(x: float | None) -> float:
        return float("nan") if x is None else float(x)

    return {"measured": result.measured, "verdict": result.outcome,
            "value": number(result.value), "ci_low": number(result.ci_low),
            "ci_high": number(result.ci_high), "threshold": number(result.threshold)}


def _reproduce_model_free(claim: Claim, model: str | None, runs_dir: str | Path | None,
                          fresh: bool) -> dict[str, Any]:
    """Judge a claim whose experiment trains its own models: run it with no model."""
    row = _row(claim, "-")
    if model:
        row["reason"] = "the claim's experiment trains its own models"
        return row
    try:
        run = run_claim(claim, None, runs_dir=runs_dir, fresh=fresh)
        result = evaluate(claim, run)
    except WorkbenchError as exc:
        row.update(verdict="error", reason=str(exc))
        return row
    row.update(_result(result), run=run.id)
    return row


def reproduce_run(store: RunStore, claims: Sequence[Claim], *, model: str | None = None,
                  fresh: bool = False, device: str = "cpu") -> Run:
    """:func:`reproduce`, stored as a run of ``reproduce`` with its table ``claims``
    (the device is not part of its config: verdicts do not depend on it)."""
    config = {"claims": [c.id for c in claims], "model": model, "fresh": fresh}
    with store.start("reproduce", None, config, tables=tables(CLAIMS_TABLE)) as run:
        table = reproduce(claims, model=model, runs_dir=store.root, fresh=fresh,
                          device=device)
        run.save_table("claims", table)
        run.update(summary=[summary(table)])
    return store.get(run.final)


def counts(verdicts: pd.Series) -> str:
    """``"3 pass, 1 undecided"``: how many of each verdict, in sorted order."""
    tally = verdicts.value_counts().to_dict()
    return ", ".join(f"{v} {k}" for k, v in sorted(tally.items())) or "none"


def undecided_lines(table: pd.DataFrame, claims: Sequence[Claim]) -> list[str]:
    """What a verdict count leaves unsaid: which claims are undecided, and whether each
    was checked on its experiment's demo config, whose smaller samples a larger config
    may decide, or on the default config already.

    Args:
        table: a claims table (:data:`CLAIMS_TABLE`).
        claims: the claims it judged (each row's config is read from its claim).

    Returns:
        Up to two lines, none when no claim is undecided.
    """
    by_id = {c.id: c for c in claims}
    rows = table[table.verdict == "undecided"]
    on: dict[str, list[str]] = {"demo": [], "default": []}
    for claim_id, model in zip(rows.claim, rows.model, strict=True):
        claim = by_id.get(claim_id)
        base = claim.base_config if claim is not None else "default"
        on[base].append(claim_id if model in ("", "-") else f"{claim_id} ({model})")
    lines = []
    if on["demo"]:
        lines.append(f"undecided on the demo config, which the default config's larger "
                     f"samples may decide: {', '.join(on['demo'])}")
    if on["default"]:
        lines.append(f"undecided on the default config: {', '.join(on['default'])}")
    return lines


def summary(table: pd.DataFrame) -> str:
    """The verdict counts of each kind: ``"reproductions: ...; invariants: ..."``."""
    return "; ".join(f"{kind}s: {counts(table.verdict[table.kind == kind])}" for kind in KINDS)


# ---- generic checks -----------------------------------------------------------------------

def _head_scores(run: Run, metric: str) -> pd.DataFrame:
    metrics.check_known([metric])
    scores = read_table(run, "head_scores")
    picked = scores[scores.metric == metric]
    if picked.empty:
        raise WorkbenchError(f"run {run.id} has no '{metric}' head scores")
    return picked.sort_values("score", ascending=False, ignore_index=True)


@claim_check("max_score_at_least")
def max_score_at_least(run: Run, *, metric: HeadMetric, threshold: float) -> Measurement:
    """The best head's ``metric`` is at least ``threshold``: its bootstrap interval
    (over prompts) is judged against the threshold. A table without intervals is judged
    on the score alone, and the text says so."""
    top = _head_scores(run, metric).iloc[0]
    score = float(top.score)
    if "ci_low" in top and math.isfinite(top.ci_low) and math.isfinite(top.ci_high):
        low, high = float(top.ci_low), float(top.ci_high)
        ci = f" [{low:.2f}, {high:.2f}]"
    else:
        low = high = score
        ci = " (no interval in the table)"
    return Measurement.compare(f"max {metric} = {score:.3f}{ci} at L{top.layer}H{top['head']} "
                               f"(threshold {threshold})", score, low, high, threshold, "above")


@claim_check("max_score_above_null")
def max_score_above_null(run: Run, *, metric: HeadMetric, margin: float) -> Measurement:
    """The best head's ``metric`` exceeds the score of uniform attention on the same
    prompts (the table's ``null``) by at least ``margin``. The null is exact (no sampling),
    so the interval judged is the head's bootstrap interval over prompts less the null."""
    top = _head_scores(run, metric).iloc[0]
    if "null" not in top or not math.isfinite(top.null):
        raise WorkbenchError(f"run {run.id}'s '{metric}' head scores have no null")
    score, null = float(top.score), float(top.null)
    low, high = float(top.ci_low) - null, float(top.ci_high) - null
    return Measurement.compare(
        f"max {metric} = {score:.3f} [{top.ci_low:.3f}, {top.ci_high:.3f}] at "
        f"L{top.layer}H{top['head']}, uniform attention {null:.3f}: {score - null:.3f} "
        f"[{low:.3f}, {high:.3f}] above it (at least {margin} needed)", score - null, low,
        high, margin, "above")


@claim_check("heads_in_top_k")
def heads_in_top_k(run: Run, *, metric: HeadMetric, heads: list[str], k: int) -> Measurement:
    """Every published head ``"layer.head"`` ranks within the top ``k`` by ``metric``."""
    ranked = _head_scores(run, metric)
    labels = [f"{r.layer}.{r.head}" for r in ranked.itertuples()]
    ranks = {h: labels.index(h) + 1 if h in labels else None for h in heads}
    shown = ", ".join(f"{h}: rank {r}" for h, r in ranks.items())
    passed = all(r is not None and r <= k for r in ranks.values())
    # a rank, not an estimate: no interval to compare
    return Measurement(f"{shown} (top {k} needed)", verdict="pass" if passed else "fail")


# ---- checks of the head classes (workbench.scores.classes) -------------------------------

def _class_rows(run: Run, head_class: str, fdr: float | None) -> tuple[pd.DataFrame, float]:
    """Every tested head of ``head_class`` with an ``inside`` column (q <= the rate), and
    the rate: the claim's ``fdr``, else the run's declared one."""
    from workbench.scores import classes

    classes.get(head_class)  # an unknown class lists the known ones
    table = read_table(run, "head_classes")
    rows = table[table.head_class == head_class]
    if rows.empty:
        raise WorkbenchError(f"run {run.id} tested no head for the {head_class} class")
    rows = classes.at_rate(rows, fdr)
    return rows.assign(inside=rows.in_class), float(rows.fdr.iloc[0])


def _labels(rows: pd.DataFrame) -> str:
    ranked = rows.sort_values("score", ascending=False)
    shown = ", ".join(f"{r.layer}.{r.head}" for r in ranked.head(10).itertuples())
    return shown + (f" and {len(ranked) - 10} more" if len(ranked) > 10 else "")


def _layer_span(rows: pd.DataFrame) -> str:
    return f"layers {int(rows.layer.min())}-{int(rows.layer.max())}" if len(rows) else "none"


@claim_check("class_size_at_least")
def class_size_at_least(run: Run, *, head_class: str, at_least: float, share: bool = False,
                        fdr: float | None = None) -> Measurement:
    """At least ``at_least`` heads (with ``share``: that percentage of the model's tested
    heads) are in ``head_class`` at the run's false-discovery rate (or ``fdr``)."""
    rows, rate = _class_rows(run, head_class, fdr)
    inside = rows[rows.inside]
    value = 100 * len(inside) / len(rows) if share else float(len(inside))
    size = f"{len(inside)} of {len(rows)} heads" + (f" ({value:.1f}%)" if share else "")
    return Measurement(f"{head_class} class at FDR {rate:g}: {size}, {_layer_span(inside)}"
                       f"{': ' + _labels(inside) if len(inside) else ''} (needs >= "
                       f"{at_least:g}{'%' if share else ''})", value=value,
                       threshold=float(at_least), verdict="pass" if value >= at_least else "fail")


@claim_check("heads_in_class")
def heads_in_class(run: Run, *, head_class: str, heads: list[str], fdr: float | None = None
                   ) -> Measurement:
    """Every published head ``"layer.head"`` is in ``head_class`` at the run's rate."""
    rows, rate = _class_rows(run, head_class, fdr)
    by_label = {f"{r.layer}.{r.head}": r for r in rows.itertuples()}
    missing = [h for h in heads if h not in by_label]
    if missing:
        return Measurement(f"heads {', '.join(missing)} were not tested", verdict="undecided")
    shown = ", ".join(f"{h}: q {by_label[h].q:.2g}{' (in)' if by_label[h].inside else ''}"
                      for h in heads)
    passed = all(by_label[h].inside for h in heads)
    return Measurement(f"{head_class} class at FDR {rate:g} ({int(rows.inside.sum())} heads): "
                       f"{shown}", verdict="pass" if passed else "fail")


@claim_check("class_above_layer")
def class_above_layer(run: Run, *, head_class: str, layer: int, fdr: float | None = None
                      ) -> Measurement:
    """Every head in ``head_class`` lies above layer ``layer`` (undecided when the class is
    empty: there is nothing to place)."""
    rows, rate = _class_rows(run, head_class, fdr)
    inside = rows[rows.inside]
    if inside.empty:
        return Measurement(f"no head is in the {head_class} class at FDR {rate:g}",
                           verdict="undecided")
    low = inside[inside.layer <= layer]
    return Measurement(f"{head_class} class at FDR {rate:g}: {len(inside)} heads in "
                       f"{_layer_span(inside)}; at or below layer {layer}: "
                       f"{_labels(low) if len(low) else 'none'}", value=float(len(low)),
                       verdict="pass" if low.empty else "fail")


@claim_check("class_below_class")
def class_below_class(run: Run, *, earlier: str, later: str, fdr: float | None = None
                      ) -> Measurement:
    """The lowest head of class ``earlier`` lies in a lower layer than the lowest head of
    class ``later`` (both at the run's rate; undecided when either class is empty)."""
    first, rate = _class_rows(run, earlier, fdr)
    second, _ = _class_rows(run, later, fdr)
    a, b = first[first.inside], second[second.inside]
    if a.empty or b.empty:
        empty = earlier if a.empty else later
        return Measurement(f"no head is in the {empty} class at FDR {rate:g}",
                           verdict="undecided")
    low_a, low_b = int(a.layer.min()), int(b.layer.min())
    return Measurement(f"at FDR {rate:g}: {earlier} class {len(a)} heads from layer {low_a} "
                       f"({_labels(a[a.layer == low_a])}); {later} class {len(b)} heads from "
                       f"layer {low_b} ({_labels(b[b.layer == low_b])})",
                       value=float(low_b - low_a), verdict="pass" if low_a < low_b else "fail")
@claim_check("invariant_at_most")
def invariant_at_most(run: Run, *, invariant: str, threshold: float) -> Measurement:
    """The largest deviation a run measured for ``invariant`` is at most ``threshold``: read
    from the run's ``checks`` table (``invariant, value, meaning``: ``ioi``, ``logit-lens``).
    A bound, not an estimate: no interval."""
    checks = read_table(run, "checks").set_index("invariant")
    if invariant not in checks.index:
        return Measurement(f"the run measured no {invariant!r}; it has "
                           f"{', '.join(checks.index)}", verdict="undecided")
    value = float(checks.value[invariant])
    return Measurement(f"{checks.meaning[invariant]}: {value:.2e} (needs <= {threshold:g})",
                       passed=value <= threshold, value=value, threshold=threshold)


def known_checks() -> list[str]:
    return CHECKS.names()


def ensure_checks_exist(claims: Sequence[Claim]) -> None:
    """Fail early on a claim whose check is not registered, or names an unregistered head
    metric (after experiments load)."""
    for claim in claims:
        if claim.check.name not in CHECKS:
            raise UnknownNameError(
                f"claim '{claim.id}' uses unknown check '{claim.check.name}'; "
                f"known checks: {', '.join(known_checks())}")
        check_metric_names(claim)
