"""Claim checks of the induction-heads experiment (see ``data/claims/head_finding.json``).

Each judges an interval against the claim's threshold: the bootstrap intervals the tables
carry, or the spread across the random ablation draws.
"""

from __future__ import annotations

import pandas as pd

from workbench.harness.claims import Measurement, claim_check
from workbench.store.runs import Run


@claim_check("second_repeat_loss_ratio_below")
def second_repeat_loss_ratio_below(run: Run, *, ratio: float) -> Measurement:
    """Loss on the second repeat is below ``ratio`` times the loss on the first. The
    interval is the ratio of the two losses' bootstrap bounds (second low / first high ..
    second high / first low): conservative, since it ignores that they are paired."""
    table = run.table("repeat_loss").set_index("repeat")
    first, second = table.loc[1], table.loc[2]
    got = float(second.loss / first.loss)
    low, high = float(second.ci_low / first.ci_high), float(second.ci_high / first.ci_low)
    return Measurement.compare(
        f"first repeat {first.loss:.2f} nats [{first.ci_low:.2f}, {first.ci_high:.2f}], "
        f"second {second.loss:.2f} [{second.ci_low:.2f}, {second.ci_high:.2f}]; ratio "
        f"{got:.3f} [{low:.3f}, {high:.3f}] (needs <= {ratio})", got, low, high, ratio, "below")


@claim_check("icl_score_negative")
def icl_score_negative(run: Run, *, metric: str = "icl_score_window") -> Measurement:
    """The in-context-learning score's 95% interval lies below zero (``metric`` picks the
    estimator; the other one is reported alongside)."""
    table = run.table("icl").set_index("metric")
    icl = table.loc[metric]
    if icl.definition.startswith("n/a"):
        return Measurement(icl.definition, verdict="undecided")
    others = "; ".join(f"{name}: {row.value:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]"
                       for name, row in table.iterrows() if name != metric)
    return Measurement.compare(
        f"{icl.definition} = {icl.value:.3f} [{icl.ci_low:.3f}, {icl.ci_high:.3f}] nats "
        f"({icl.loss_at_50:.2f} -> {icl.loss_at_500:.2f}); {others}", float(icl.value),
        float(icl.ci_low), float(icl.ci_high), 0.0, "below")


def _drops(table: pd.DataFrame, column: str, value: str
           ) -> tuple[pd.DataFrame, float, pd.Series, pd.Series]:
    """The previous-token rows of one ``column`` value, the drop of the tracked induction
    score they cause, the drop of each random draw, and the excess over each draw."""
    clean = table[table.condition == "clean"].induction_tracked.iloc[0]
    prev = table[(table.condition == "previous-token") & (table[column] == value)]
    rand = table[(table.condition == "random") & (table[column] == value)]
    drop_prev = float(clean - prev.induction_tracked.iloc[0])
    drops = clean - rand.induction_tracked
    return prev, drop_prev, drops, drop_prev - drops


@claim_check("previous_token_ablation_beats_random")
def previous_token_ablation_beats_random(run: Run, *, kind: str = "zero") -> Measurement:
    """Ablating the previous-token heads lowers the tracked induction heads' score more
    than random same-layer draws do. The interval is the excess drop over each random draw
    (min..max across the draws), judged against 0: pass when it beats every draw."""
    prev, drop_prev, drops, excess = _drops(run.table("ablation"), "kind", kind)
    return Measurement.compare(
        f"{kind} ablation of {prev.heads.iloc[0]}: tracked induction score drops by "
        f"{drop_prev:.3f}; random same-layer heads: {drops.mean():.3f} on average, at most "
        f"{drops.max():.3f} over {len(drops)} draws; excess over the draws "
        f"{excess.min():.3f}..{excess.max():.3f}", float(excess.mean()), float(excess.min()),
        float(excess.max()), 0.0, "above")


@claim_check("previous_token_path_beats_random")
def previous_token_path_beats_random(run: Run, *, path: str = "key") -> Measurement:
    """Removing the previous-token heads from only the ``path`` input of the tracked
    induction heads lowers their score more than removing random same-layer heads the same
    way. The interval is the excess drop over each random draw (min..max across the draws),
    judged against 0: pass when it beats every draw."""
    if "path_patch" not in run.table_names():
        return Measurement("the run has no path_patch table (an older run, or a post-norm "
                           "model)", verdict="undecided")
    prev, drop_prev, drops, excess = _drops(run.table("path_patch"), "path", path)
    return Measurement.compare(
        f"{prev.heads.iloc[0]} removed from the {path} input of {prev.tracked.iloc[0]} only: "
        f"tracked induction score drops by {drop_prev:.3f}; random same-layer heads: "
        f"{drops.mean():.3f} on average, at most {drops.max():.3f} over {len(drops)} draws; "
        f"excess over the draws {excess.min():.3f}..{excess.max():.3f}", float(excess.mean()),
        float(excess.min()), float(excess.max()), 0.0, "above")
