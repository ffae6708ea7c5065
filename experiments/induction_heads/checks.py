"""Claim checks of the induction-heads experiment (see ``data/claims/head_finding.json``)."""

from __future__ import annotations

from workbench.harness.claims import Measurement, claim_check
from workbench.store.runs import Run


@claim_check("second_repeat_loss_ratio_below")
def second_repeat_loss_ratio_below(run: Run, *, ratio: float) -> Measurement:
    """Loss on the second repeat is below ``ratio`` times the loss on the first."""
    table = run.table("repeat_loss").set_index("repeat")
    first, second = table.loc[1], table.loc[2]
    got = second.loss / first.loss
    return Measurement(f"first repeat {first.loss:.2f} nats [{first.ci_low:.2f}, "
                       f"{first.ci_high:.2f}], second {second.loss:.2f} [{second.ci_low:.2f}, "
                       f"{second.ci_high:.2f}]; ratio {got:.3f} (needs < {ratio})",
                       bool(got < ratio), float(got))


@claim_check("icl_score_negative")
def icl_score_negative(run: Run, *, metric: str = "icl_score_window") -> Measurement:
    """The in-context-learning score's 95% interval lies below zero (``metric`` picks the
    estimator; the other one is reported alongside)."""
    table = run.table("icl").set_index("metric")
    icl = table.loc[metric]
    others = "; ".join(f"{name}: {row.value:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]"
                       for name, row in table.iterrows() if name != metric)
    return Measurement(f"{icl.definition} = {icl.value:.3f} [{icl.ci_low:.3f}, "
                       f"{icl.ci_high:.3f}] nats ({icl.loss_at_50:.2f} -> {icl.loss_at_500:.2f})"
                       f"; {others}", bool(icl.ci_high < 0), float(icl.value))


@claim_check("previous_token_ablation_beats_random")
def previous_token_ablation_beats_random(run: Run, *, kind: str = "zero") -> Measurement:
    """Ablating the previous-token heads lowers the tracked induction heads' score more
    than every random same-layer draw does."""
    table = run.table("ablation")
    clean = table[table.condition == "clean"].induction_tracked.iloc[0]
    prev = table[(table.condition == "previous-token") & (table.kind == kind)]
    rand = table[(table.condition == "random") & (table.kind == kind)]
    drop_prev = clean - prev.induction_tracked.iloc[0]
    drops = clean - rand.induction_tracked
    return Measurement(
        f"{kind} ablation of {prev.heads.iloc[0]}: tracked induction score drops by "
        f"{drop_prev:.3f}; random same-layer heads: {drops.mean():.3f} on average, at most "
        f"{drops.max():.3f} over {len(drops)} draws", bool(drop_prev > drops.max()),
        float(drop_prev))
