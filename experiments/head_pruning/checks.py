"""The claim checks of head-pruning: they read a run's stored pruning curves.

Both checks judge an interval against the claim's threshold: the spread of the random
orders (their minimum..maximum at each fraction) for an order's advantage over random, and
the fractions reached on the bootstrap bounds of the metric for a prunable fraction. A claim
about more heads than the run pruned is ``undecided``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.head_pruning.measure import SIMILARITY
from experiments.head_pruning.summary import curve_summary, nearest, prunable_fraction
from workbench.core.errors import WorkbenchError
from workbench.harness.claims import Measurement, Verdict, claim_check, judge
from workbench.store.runs import Run

SECOND_REPEAT = "second_repeat_loss"


def _advantage(metric: str, value: float, others: np.ndarray) -> np.ndarray:
    """How much better ``value`` is than each of ``others`` (positive: better)."""
    return others - value if metric != SIMILARITY else value - others


def _random_values(curve: pd.DataFrame, metric: str, fraction: float) -> np.ndarray:
    rows = curve[(curve.metric == metric) & (curve.order == "random")
                 & np.isclose(curve.fraction_pruned, fraction)]
    return rows.value.to_numpy(dtype=float)


def _worst(verdicts: list[Verdict]) -> Verdict:
    """Fail over undecided over pass: every fraction must be shown."""
    if "fail" in verdicts:
        return "fail"
    return "undecided" if "undecided" in verdicts else "pass"


@claim_check("pruning_beats_random")
def pruning_beats_random(run: Run, *, order: str, metric: str,
                         fractions: list[float]) -> Measurement:
    """At each fraction pruned, ``order`` leaves a better ``metric`` than random orders do.

    The interval is the advantage of ``order`` over each random order, from the least to
    the most favourable random order (min..max across the random seeds); it is judged
    against 0 at every fraction: pass when ``order`` beats every random order, fail when it
    beats none, undecided otherwise. The stored interval is that of the least favourable
    fraction. On a causal LM the second-repeat loss is reported alongside (not judged).
    """
    curve = run.table("pruning_curve")
    table = curve_summary(curve, metric)
    if order not in table.columns or "random_mean" not in table.columns:
        raise WorkbenchError(f"run {run.id} has no '{order}' and random pruning curves")
    parts, verdicts, worst = [], [], None
    for fraction in fractions:
        row = nearest(table, fraction)
        adv = _advantage(metric, float(row[order]),
                         _random_values(curve, metric, float(row.fraction_pruned)))
        low, high = float(adv.min()), float(adv.max())
        verdicts.append(judge(low, high, 0.0, "above"))
        if worst is None or low < worst[1]:
            worst = (float(adv.mean()), low, high)
        parts.append(f"{row.fraction_pruned:.0%}: {row[order]:.3f} vs random "
                     f"{row.random_mean:.3f} (min {row.random_min:.3f}, max "
                     f"{row.random_max:.3f}, {len(adv)} orders): {verdicts[-1]}")
    text = (f"{metric}, {order} order vs the random orders' spread (min..max): "
            + "; ".join(parts))
    if SECOND_REPEAT in set(curve.metric) and metric != SECOND_REPEAT:
        text += "; " + _second_repeat(curve, order, fractions)
    assert worst is not None
    return Measurement(text, value=worst[0], verdict=_worst(verdicts), ci_low=worst[1],
                       ci_high=worst[2], threshold=0.0)


def _second_repeat(curve: pd.DataFrame, order: str, fractions: list[float]) -> str:
    table = curve_summary(curve, SECOND_REPEAT)
    parts = []
    for fraction in fractions:
        row = nearest(table, fraction)
        parts.append(f"{row.fraction_pruned:.0%}: {row[order]:.2f} vs random "
                     f"{row.random_mean:.2f} ({row.random_min:.2f}..{row.random_max:.2f})")
    return f"not judged, second-repeat loss (induction): {'; '.join(parts)}"


def _bound(rows: pd.DataFrame, metric: str, pessimistic: bool) -> pd.DataFrame:
    """The curve with each pruned step's value moved to one end of its bootstrap interval
    (the unpruned step keeps its value: it is the baseline)."""
    worse = "ci_high" if (metric != SIMILARITY) == pessimistic else "ci_low"
    moved = rows.copy()
    pruned = moved.fraction_pruned > 0
    moved.loc[pruned, "value"] = moved.loc[pruned, worse]
    return moved


@claim_check("prunable_fraction_at_least")
def prunable_fraction_at_least(run: Run, *, order: str, metric: str, tolerance: float,
                               fraction: float) -> Measurement:
    """Along ``order``, at least ``fraction`` of the heads go before ``metric`` degrades by
    more than ``tolerance`` (relative increase of a loss, drop of the similarity).

    The interval is the prunable fraction found on the pessimistic and on the optimistic
    end of each step's bootstrap interval. A run that stopped pruning below ``fraction``
    cannot reach the claimed quantity: it is undecided, whatever happened within the run
    (a degradation before the last step does not show that the metric is still degraded
    at ``fraction``: the paper reads its curve at that point).
    """
    curve = run.table("pruning_curve")
    mine = curve[(curve.order == order) & (curve.metric == metric)]
    if mine.empty:
        raise WorkbenchError(f"run {run.id} has no '{order}' pruning curve of {metric}")
    found = prunable_fraction(mine, metric, tolerance)
    low = prunable_fraction(_bound(mine, metric, pessimistic=True), metric, tolerance)
    high = prunable_fraction(_bound(mine, metric, pessimistic=False), metric, tolerance)
    random = [prunable_fraction(g, metric, tolerance)
              for _, g in curve[curve.order == "random"].groupby("seed")]
    tail = f"; random orders {np.mean(random):.0%}" if random else ""
    reached = float(mine.fraction_pruned.max())
    text = (f"{found:.0%} [{low:.0%}, {high:.0%}] of heads pruned in the {order} order "
            f"before {metric} degraded by more than {tolerance:g}{tail} (needed "
            f"{fraction:.0%}; interval from the steps' bootstrap bounds)")
    verdict = judge(low, high, fraction - 1e-9, "above")
    if fraction > reached + 1e-9:
        verdict = "undecided"
        text += (f"; undecided: the run stopped pruning at {reached:.0%} (max_fraction), "
                 f"so it cannot reach the claimed {fraction:.0%}")
    return Measurement(text, value=found, verdict=verdict, ci_low=low, ci_high=high,
                       threshold=fraction)
