"""Claim checks of the qk-attribution experiment (see ``data/claims/qk_attribution.json``).

Both read the ``groups`` and ``attribution`` tables: shares of the score's parts, with
bootstrap intervals over prompts.
"""

from __future__ import annotations

from workbench.harness.claims import Measurement, claim_check
from workbench.harness.tables import read as read_table
from workbench.store.runs import Run


@claim_check("group_share_excess_above")
def group_share_excess_above(run: Run, *, side: str = "key", threshold: float = 0.0
                             ) -> Measurement:
    """The previous-token heads' summed share of the ``side`` parts exceeds that of random
    same-layer heads (the mean over the draws), averaged over the attributed heads: the
    95% interval over prompts of the difference, judged against ``threshold``."""
    groups = read_table(run, "groups")
    mine = groups[(groups.layer == -1) & (groups.side == side)].set_index("group")
    if "excess" not in mine.index:
        return Measurement("the run has no previous-token heads to compare (none below the "
                           "attributed heads)", verdict="undecided")
    excess, prev = mine.loc["excess"], mine.loc["previous-token"]
    rand = groups[(groups.layer == -1) & (groups.side == side) & (groups.group == "random")]
    n_heads = len(read_table(run, "attribution")[["layer", "head"]].drop_duplicates())
    return Measurement.compare(
        f"{side} side over {n_heads} heads: previous-token heads ({prev.members}) share "
        f"{prev.share:+.3f} [{prev.ci_low:+.3f}, {prev.ci_high:+.3f}]; random same-layer heads "
        f"{rand.share.mean():+.3f} on average, at most {rand.share.max():+.3f} over "
        f"{len(rand)} draws; excess {excess.share:+.3f} [{excess.ci_low:+.3f}, "
        f"{excess.ci_high:+.3f}] (needs > {threshold})", float(excess.share),
        float(excess.ci_low), float(excess.ci_high), threshold, "above")


@claim_check("component_share_rank_at_most")
def component_share_rank_at_most(run: Run, *, side: str = "query", component: str = "embed",
                                 k: int = 1) -> Measurement:
    """``component`` ranks in the top ``k`` components of the ``side`` parts by mean share,
    for every attributed head (rank 1 = the largest share)."""
    att = read_table(run, "attribution")
    mine = att[att.side == side]
    ranks, parts = [], []
    for (layer, head), group in mine.groupby(["layer", "head"]):
        ordered = group.sort_values("share", ascending=False).component.tolist()
        rank = ordered.index(component) + 1 if component in ordered else len(ordered) + 1
        first = group.loc[group.share.idxmax()]
        ranks.append(rank)
        parts.append(f"L{layer}H{head}: rank {rank} (top: {first.component} "
                     f"{first.share:+.2f})")
    if not ranks:
        return Measurement("the run attributed no head", verdict="undecided")
    return Measurement(f"{component} on the {side} side: " + "; ".join(parts)
                       + f" (needs rank <= {k} for every head)",
                       passed=max(ranks) <= k, value=float(max(ranks)), threshold=float(k))
