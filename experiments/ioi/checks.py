"""Claim checks of the ioi experiment (see ``data/claims/ioi.json``).

The behaviour is judged by the bootstrap interval of the mean logit difference; a head
class is judged only when the model performs the task above chance (else ``undecided``: no
class is claimed). The invariants use the generic ``invariant_at_most`` check
(:mod:`workbench.harness.claims`), which reads the ``checks`` table.
"""

from __future__ import annotations

from workbench.harness.claims import Measurement, claim_check
from workbench.store.runs import Run


def _behaviour(run: Run):
    table = run.table("behaviour")
    return table[table.scope == "all"].iloc[0]


@claim_check("ioi_logit_difference_above")
def ioi_logit_difference_above(run: Run, *, threshold: float = 0.0) -> Measurement:
    """The mean logit difference IO - S at END is above ``threshold``: its 95% bootstrap
    interval over prompts is judged."""
    row = _behaviour(run)
    return Measurement.compare(
        f"logit(IO) - logit(S) at END: {row.logit_diff:+.3f} [{row.ci_low:+.3f}, "
        f"{row.ci_high:+.3f}] over {int(row.n_prompts)} prompts, IO preferred on "
        f"{row.prefers_io:.0%} (needs > {threshold:g}); corrupted (ABC) "
        f"{row.corrupted_logit_diff:+.3f}", float(row.logit_diff), float(row.ci_low),
        float(row.ci_high), threshold, "above")


@claim_check("ioi_class_found")
def ioi_class_found(run: Run, *, head_class: str) -> Measurement:
    """At least one head meets the class's criteria (``classes.criterion``), judged only when
    the behaviour is above chance (and, for s-inhibition, a name mover was found)."""
    row = _behaviour(run)
    if not row.above_chance:
        return Measurement(f"no class is claimed: the logit difference {row.logit_diff:+.3f} "
                           f"[{row.ci_low:+.3f}, {row.ci_high:+.3f}] does not exclude 0",
                           verdict="undecided")
    classes = run.table("classes")
    if head_class == "s-inhibition" and not (classes.head_class == "name mover").any():
        return Measurement("no name mover was found, so no query to patch S-inhibition into",
                           verdict="undecided")
    mine = classes[classes.head_class == head_class]
    heads = ", ".join(f"L{r.layer}H{r.head} {r.effect:+.3f} [{r.ci_low:+.3f}, "
                      f"{r.ci_high:+.3f}], attention {r.attention:.2f}"
                      for r in mine.itertuples())
    criterion = mine.criterion.iloc[0] if len(mine) else "see the experiment's docstring"
    return Measurement(f"{head_class} heads: {heads or 'none'} ({criterion})",
                       passed=bool(len(mine)), value=float(len(mine)), threshold=1.0)
