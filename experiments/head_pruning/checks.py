"""The claim checks of head-pruning: they read a run's stored pruning curves."""

from __future__ import annotations

import numpy as np

from experiments.head_pruning.measure import SIMILARITY, curve_summary, nearest, prunable_fraction
from workbench.core.errors import WorkbenchError
from workbench.harness.claims import Measurement, claim_check
from workbench.store.runs import Run


def _better(metric: str, value: float, other: float) -> bool:
    return value > other if metric == SIMILARITY else value < other


@claim_check("pruning_beats_random")
def pruning_beats_random(run: Run, *, order: str, metric: str,
                         fractions: list[float]) -> Measurement:
    """At each fraction pruned, ``order`` leaves a better ``metric`` than the mean of the
    random orders (the pruning step nearest each fraction)."""
    table = curve_summary(run.table("pruning_curve"), metric)
    if order not in table.columns or "random_mean" not in table.columns:
        raise WorkbenchError(f"run {run.id} has no '{order}' and random pruning curves")
    parts, passed = [], True
    for fraction in fractions:
        row = nearest(table, fraction)
        passed &= _better(metric, row[order], row.random_mean)
        parts.append(f"{row.fraction_pruned:.0%}: {row[order]:.3f} vs random "
                     f"{row.random_mean:.3f} ± {row.random_sd:.3f}")
    return Measurement(f"{metric}, {order} order vs random: " + "; ".join(parts), passed)


@claim_check("prunable_fraction_at_least")
def prunable_fraction_at_least(run: Run, *, order: str, metric: str, tolerance: float,
                               fraction: float) -> Measurement:
    """Along ``order``, at least ``fraction`` of the heads go before ``metric`` degrades by
    more than ``tolerance`` (relative increase of a loss, drop of the similarity)."""
    curve = run.table("pruning_curve")
    mine = curve[curve.order == order]
    if mine.empty:
        raise WorkbenchError(f"run {run.id} has no '{order}' pruning curve")
    found = prunable_fraction(mine, metric, tolerance)
    random = [prunable_fraction(g, metric, tolerance)
              for _, g in curve[curve.order == "random"].groupby("seed")]
    tail = f"; random orders {np.mean(random):.0%}" if random else ""
    reached = mine.fraction_pruned.max()
    cap = (" (as far as the run pruned: it cannot decide more)"
           if found >= reached and fraction > reached else "")
    return Measurement(f"{found:.0%} of heads{cap} pruned in the {order} order before "
                       f"{metric} degraded by more than {tolerance:g}{tail} "
                       f"(needed {fraction:.0%})", bool(found >= fraction - 1e-9), found)
