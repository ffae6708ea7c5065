"""How head-pruning reads its curves (the degradation, the prunable fraction, each
fraction's summary over orders) and the :class:`Result` with its summary lines
(definitions in the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from experiments.head_pruning.measure import SIMILARITY
from experiments.head_pruning.survival import spearman
from experiments.head_pruning.tables import KIND_EXPERIMENTS


def degradation(metric: str, value: float, baseline: float) -> float:
    """How much worse ``value`` is than ``baseline``: a relative increase for losses, a
    drop for the similarity."""
    if metric == SIMILARITY:
        return baseline - value
    return (value - baseline) / baseline


def prunable_fraction(curve: pd.DataFrame, metric: str, tolerance: float) -> float:
    """The largest fraction pruned before ``metric`` first degrades by more than
    ``tolerance``, along one order (rows of one order and seed)."""
    rows = curve[curve.metric == metric].sort_values("fraction_pruned")
    baseline = float(rows.value.iloc[0])
    best = 0.0
    for row in rows.itertuples():
        if degradation(metric, row.value, baseline) > tolerance:
            break
        best = float(row.fraction_pruned)
    return best


def curve_summary(curve: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per fraction pruned: the metric for every order, and the random orders'
    mean, standard deviation, minimum and maximum over seeds."""
    rows = curve[curve.metric == metric]
    wide = rows[rows.order != "random"].pivot_table(index="fraction_pruned", columns="order",
                                                    values="value")
    rand = rows[rows.order == "random"].groupby("fraction_pruned").value
    if len(rand):
        wide["random_mean"] = rand.mean()
        wide["random_sd"] = rand.std(ddof=1) if rand.size().min() > 1 else np.nan
        wide["random_min"], wide["random_max"] = rand.min(), rand.max()
    return wide.reset_index()


def nearest(table: pd.DataFrame, fraction: float) -> pd.Series:
    """The row of a :func:`curve_summary` whose fraction pruned is nearest ``fraction``."""
    return table.iloc[int((table.fraction_pruned - fraction).abs().to_numpy().argmin())]


def _heads(scores: pd.DataFrame, metric: str, n: int, largest: bool) -> str:
    df = scores[scores.metric == metric]
    picked = df.nlargest(n, "score") if largest else df.nsmallest(n, "score")
    return ", ".join(f"L{r.layer}H{r.head} ({r.score:.3g})" for r in picked.itertuples())


# ---- the result --------------------------------------------------------------------------------

@dataclass
class Result:
    head_scores: pd.DataFrame
    pruning_curve: pd.DataFrame
    pruning_order: pd.DataFrame
    masks: pd.DataFrame
    survival: pd.DataFrame
    speedup: pd.DataFrame
    metrics: tuple[str, ...]
    tolerance: float
    notes: list[str] = field(default_factory=list)
    pruning_curve_by_prompt: pd.DataFrame | None = None
    """Each text's values of ``pruning_curve`` (``None``: not kept)."""
    head_scores_by_prompt: pd.DataFrame | None = None
    """Each fit text's importances of ``head_scores`` (``None``: not kept)."""

    def tables(self) -> dict[str, pd.DataFrame]:
        kept = {"head_scores_by_prompt": self.head_scores_by_prompt,
                "pruning_curve_by_prompt": self.pruning_curve_by_prompt}
        by_prompt = {name: frame for name, frame in kept.items() if frame is not None}
        return {"head_scores": self.head_scores, "pruning_curve": self.pruning_curve,
                **by_prompt, "pruning_order": self.pruning_order, "masks": self.masks,
                "survival": self.survival, "speedup": self.speedup}

    def summary(self) -> list[str]:
        return [*self._curve_lines(), *self._importance_lines(), *self._survival_lines(),
                *self._speed_lines(), *self.notes]

    def _curve_lines(self) -> list[str]:
        lines = []
        for metric in self.metrics:
            table = curve_summary(self.pruning_curve, metric)
            orders = [c for c in table.columns if c not in ("fraction_pruned", "random_sd",
                                                           "random_min", "random_max")]
            lines.append(f"{metric}, unpruned: {table.iloc[0][orders[0]]:.4f}")
            shown = sorted({int(nearest(table, f).name) for f in (0.1, 0.2, 0.3, 0.5)})
            for index in shown:
                row = table.loc[index]
                parts = [f"{o} {row[o]:.3f}" for o in orders if o != "random_mean"]
                if "random_mean" in row:
                    parts.append(f"random {row.random_mean:.3f} ± {row.random_sd:.3f}")
                lines.append(f"  {row.fraction_pruned:.0%} pruned: " + ", ".join(parts))
            primary = self.metrics[0]
            if metric == primary:
                lines.append(self._prunable_line(primary))
        return lines

    def _prunable_line(self, metric: str) -> str:
        parts = []
        for order, group in self.pruning_curve.groupby("order", sort=False):
            fractions = [prunable_fraction(g, metric, self.tolerance)
                         for _, g in group.groupby("seed", dropna=False)]
            parts.append(f"{order} {np.mean(fractions):.0%}" + (
                f" ± {np.std(fractions, ddof=1):.0%}" if len(fractions) > 1 else ""))
        what = "drops by" if metric == SIMILARITY else "rises by"
        return (f"  prunable before {metric} {what} more than "
                f"{self.tolerance:g}{'' if metric == SIMILARITY else ' (relative)'}: "
                + ", ".join(parts))

    def _importance_lines(self) -> list[str]:
        present = set(self.head_scores.metric)
        lines = [f"{metric}: least {_heads(self.head_scores, metric, 3, False)}; "
                 f"most {_heads(self.head_scores, metric, 3, True)}"
                 for metric in ("importance_gradient", "importance_ablation")
                 if metric in present]
        if "importance_ablation" in present:
            wide = self.head_scores.pivot_table(index=["layer", "head"], columns="metric",
                                                values="score")
            lines.append("Spearman correlation with ablation importance: gradient "
                         f"{spearman(wide.importance_gradient, wide.importance_ablation):.2f}"
                         ", unnormalised gradient "
                         f"{spearman(wide.importance_gradient_raw, wide.importance_ablation):.2f}")
        return lines

    def _survival_lines(self) -> list[str]:
        if self.survival.empty:
            return [f"no complete run of {', '.join(KIND_EXPERIMENTS)} on these weights: "
                    "survival by kind of head skipped"]
        return [f"top {r.top_k} {r.metric} heads ({r.experiment}) in the {r.order} order: "
                f"mean survival {r.top_mean_survival:.2f} (0.5 expected by chance, "
                f"z = {r.z:.1f}), Spearman with score {r.spearman:.2f}"
                for r in self.survival.itertuples()]

    def _speed_lines(self) -> list[str]:
        skipped = self.speedup[self.speedup.skipped != ""]
        if len(skipped):
            return [f"heads not removed from the weights: {skipped.skipped.iloc[0]}"]
        return [f"heads removed from the weights at {r.budget:.0%} ({r.n_removed} heads): "
                f"{r.seconds_full * 1000:.0f} ms -> {r.seconds_removed * 1000:.0f} ms per "
                f"{r.batch_tokens} tokens ({r.speedup:.2f}x), output within "
                f"{r.max_abs_diff:.1e} of masking" for r in self.speedup.itertuples()]
