"""Every head metric, declared once: its stored name, meaning, null baseline, source and scale.

A metric's name is what the ``metric`` column of a ``head_scores`` table holds (and of the
tables that repeat it per input, per prompt or per sweep cell), so this registry is the one
place a metric is named. Experiments build their pattern reductions from it
(:func:`reductions`), pages read a metric's meaning and scale from it, and claims and their
checks refuse a name it does not know, listing the known ones. A run stores its per-head
tables only when every metric in them is registered (:func:`check_table`).

Kinds of metric:

- ``pattern``: a function of one layer's attention pattern in :mod:`workbench.scores.patterns`,
  named after it (``fn(pattern, ctx) -> [batch, head]``), run by
  :func:`workbench.recording.reductions.reduce_patterns` or
  :func:`workbench.scores.heads.score_heads`;
- ``received``: the attention a kind of key receives (:func:`workbench.scores.patterns.received`
  summed over the keys of a token type, or taken at the r-th most attended key), built by
  attention-sinks for the model's token types;
- ``ov``: the copying score of a head's OV circuit (:func:`workbench.scores.heads.copying_scores`);
- ``importance``: how much the model needs the head
  (:mod:`workbench.interventions.importance`, in head-pruning).

Examples:
    >>> get("first_token").meaning
    'alpha_1: mean weight on the first position over all queries'
    >>> sorted(reductions("induction", "previous_token"))
    ['induction', 'previous_token']
    >>> get("sink")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    workbench.core.errors.UnknownNameError: unknown head metric 'sink' (the old name of ...
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from workbench.core.errors import UnknownNameError
from workbench.core.registry import Registry
from workbench.inputs.token_types import TOKEN_TYPES
from workbench.recording.reductions import Reduction
from workbench.scores import patterns
from workbench.store.schema import LEGACY_METRIC_NAMES

if TYPE_CHECKING:
    import pandas as pd

    from workbench.models.fused import Statistic

Kind = Literal["pattern", "received", "ov", "importance"]


@dataclass(frozen=True)
class Metric:
    """One head metric.

    Attributes:
        name: the stored name (a pattern metric's is its function's name).
        meaning: one line: what the number is.
        null: what a head with no such behaviour scores (the baseline a page or a summary
            compares with).
        source: the paper (or tool) that defines it.
        kind: see the module docstring.
        reduction: the pattern reduction (``pattern`` metrics only).
        bounded: the score lies in [0, 1] (weights, shares), so a page draws it on that scale.
        statistics: the fused kernel's statistics it reads
            (:class:`workbench.models.fused.Statistics`): a pattern metric's per-query value
            is the one row statistic named, averaged over the same queries; a ``received``
            metric is a function of the keys' received weight. Empty: it needs the pattern
            itself (the blocked path).
    """

    name: str
    meaning: str
    null: str
    source: str
    kind: Kind = "pattern"
    reduction: Reduction | None = None
    bounded: bool = True
    statistics: tuple[Statistic, ...] = ()


METRICS: Registry[Metric] = Registry("head metric")


def get(name: str) -> Metric:
    """The metric ``name``.

    Raises:
        UnknownNameError: an unregistered name (the message lists the registered ones, and
            names the metric an old spelling stands for).
    """
    if isinstance(name, str) and name in LEGACY_METRIC_NAMES:
        raise UnknownNameError(f"unknown head metric '{name}' (the old name of "
                               f"'{LEGACY_METRIC_NAMES[name]}'); known head metrics: "
                               f"{', '.join(METRICS.names())}")
    return METRICS.get(name)


def check_known(names: Iterable[str]) -> None:
    """Raise :class:`~workbench.core.errors.UnknownNameError` for the first of ``names``
    that is not a registered metric (the message lists the registered ones).

    Not to be confused with :meth:`workbench.models.base.Model.require`, which refuses what
    a model cannot do; this checks names."""
    for name in names:
        get(name)


def require(names: Iterable[str]) -> None:
    """The old name of :func:`check_known` (deprecated: it read like
    :meth:`~workbench.models.base.Model.require`, which refuses what a model cannot do)."""
    warnings.warn("workbench.scores.metrics.require is deprecated; use check_known",
                  DeprecationWarning, stacklevel=2)
    check_known(names)


def check_table(frame: pd.DataFrame) -> None:
    """Raise :class:`~workbench.core.errors.UnknownNameError` unless every metric of a
    per-head table (one with ``layer``, ``head`` and ``metric`` columns) is registered; a
    table of any other shape passes."""
    if {"layer", "head", "metric"} <= set(frame.columns):
        check_known(frame.metric.unique())


def reductions(*names: str) -> dict[str, Reduction]:
    """``{name: reduction}`` of the named pattern metrics, for ``reduce_patterns`` and
    ``score_heads``.

    Raises:
        UnknownNameError: an unregistered name.
        ValueError: a metric that is not a function of one pattern (a programming error).
    """
    out = {}
    for name in names:
        metric = get(name)
        if metric.reduction is None:
            raise ValueError(f"head metric '{name}' is a {metric.kind} metric, not a pattern "
                             "reduction")
        out[name] = metric.reduction
    return out


def _declare(metric: Metric) -> None:
    METRICS.register(metric.name, metric)


UNIFORM = "the same score of attention uniform over the keys each query can see"
CLARK = "Clark et al. 2019, What Does BERT Look At?"
OLSSON = "Olsson et al. 2022, In-context Learning and Induction Heads"
GU = "Gu et al. 2024, When Attention Sink Emerges in Language Models"
MICHEL = "Michel et al. 2019, Are Sixteen Heads Really Better than One?"
NO_EFFECT = "0: a head the model's output does not depend on"


def _pattern(reduction: Reduction, meaning: str, source: str, *, bounded: bool = True,
             statistics: tuple[Statistic, ...] = ()) -> None:
    _declare(Metric(reduction.__name__, meaning, UNIFORM, source, "pattern", reduction, bounded,
                    statistics))


_pattern(patterns.entropy, "mean entropy (nats) of each query's attention", CLARK,
         bounded=False, statistics=("entropy",))
_pattern(patterns.normalized_entropy, "entropy over log(keys the query sees): 1 uniform, "
         "0 all weight on one key", CLARK)
_pattern(patterns.mean_distance, "expected |query - key| in tokens under the attention",
         "Vig & Belinkov 2019, Analyzing the Structure of Attention in a Transformer "
         "Language Model", bounded=False, statistics=("distance",))
_pattern(patterns.self_attention, "mean weight a token puts on itself", CLARK)
_pattern(patterns.previous_token, "mean weight on the token just before the query",
         f"{OLSSON}; {CLARK}", statistics=("previous",))
_pattern(patterns.next_token, "mean weight on the token just after the query (encoders)",
         CLARK)
_pattern(patterns.duplicate_token, "weight on earlier occurrences of the query's own token",
         "Wang et al. 2022, Interpretability in the Wild")
_pattern(patterns.induction, "prefix matching: weight on the token after the query token's "
         "one earlier occurrence (the second repeat)", OLSSON, statistics=("target",))
_pattern(patterns.induction_pooled, "total weight on the tokens after every earlier "
         "occurrence of the query token", OLSSON)
_pattern(patterns.induction_stripe_sum, "the induction stripe's total weight divided by all "
         "queries (unnormalised)", "TransformerLens head_detector ('mul' induction score)")
_pattern(patterns.first_token, "alpha_1: mean weight on the first position over all queries",
         GU, statistics=("first",))
for _type in TOKEN_TYPES:
    _declare(Metric(f"share_{_type}", f"share of attention received by {_type} tokens "
                    "(r_j summed over them)", UNIFORM, f"{GU}; {CLARK}", "received",
                    statistics=("received",)))
for _rank in (1, 2, 3):
    _declare(Metric(f"top{_rank}_share", f"weight r_j received by the key ranked {_rank} by "
                    "received weight", UNIFORM, GU, "received", statistics=("received",)))
_declare(Metric("copying", "direct-path z-score of the attended token's own logit (the OV "
                "circuit)", "exactly 0: the mean over a token drawn uniformly from the "
                "vocabulary", "Elhage et al. 2021, A Mathematical Framework for Transformer "
                "Circuits", "ov", bounded=False))
_declare(Metric("importance_gradient", "E_x |dL/dxi_h| on the fit text, normalised per layer "
                "(L2)", NO_EFFECT, MICHEL, "importance"))
_declare(Metric("importance_gradient_raw", "E_x |dL/dxi_h| on the fit text, not normalised",
                NO_EFFECT, MICHEL, "importance", bounded=False))
_declare(Metric("importance_ablation", "degradation on the fit text when the head alone is "
                "removed, minus that of the unpruned model", NO_EFFECT, MICHEL, "importance",
                bounded=False))


def meaning(name: str) -> str | None:
    """A registered metric's one-line meaning; ``None`` for any other name."""
    return METRICS.get(name).meaning if name in METRICS else None

