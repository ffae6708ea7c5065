"""The claim check of ``permutation-equivariance``: a condition met its expectation."""

from __future__ import annotations

from experiments.permutation_equivariance.conditions import HOLDS
from experiments.permutation_equivariance.tables import VERDICTS
from workbench.core.errors import WorkbenchError
from workbench.harness.claims import Measurement, claim_check
from workbench.store.runs import Run


@claim_check("equivariance_verdict")
def equivariance_verdict(run: Run, *, component: str, condition: str | list[str],
                         shift: int | None = None) -> Measurement:
    """Every case of ``component`` / ``condition`` (one name or several, at every shift or
    at one) met its expectation within the run's tolerance.

    Args:
        run: a run of ``permutation-equivariance``.
        component: attention sublayer, whole model or attention heads.
        condition: one condition name or several (all must pass).
        shift: only the cases at this position shift (``None``: every shift).

    Returns:
        The largest error (for equivariant / unchanged) or the smallest (for not
        equivariant / changes) of each condition, and the errors' range over the cases
        (min..max) with the tolerance. An invariant admits no exception: it passes when no
        case failed and fails otherwise (one failing case is a counterexample, so a range
        that straddles the tolerance is a fail, not undecided).

    Raises:
        WorkbenchError: the run measured no case of a condition (it did not apply).
    """
    table = run.table(VERDICTS.name)
    parts, passed, spans = [], True, []
    for name in [condition] if isinstance(condition, str) else condition:
        picked = table[(table.component == component) & (table.condition == name)
                       & (table.verdict != "n/a")]
        if shift is not None:
            picked = picked[picked["shift"] == shift]
        if picked.empty:
            raise WorkbenchError(f"run {run.id} measured no '{component} / {name}'"
                                 + (f" at shift {shift}" if shift is not None else ""))
        expected = picked.expected.iloc[0]
        holds = HOLDS[expected]
        err = picked.max_rel_error.max() if holds else picked.min_rel_error.min()
        n_failed = int(picked.n_failed.sum())
        tolerance = float(picked.tolerance.iloc[0])
        parts.append(f"{name}: {expected}, {'max' if holds else 'min'} rel. error {err:.2g} "
                     f"over {int(picked.n_cases.sum())} cases (tolerance {tolerance:g}, "
                     f"{n_failed} failed)")
        passed &= n_failed == 0
        spans.append((float(err), float(picked.min_rel_error.min()),
                      float(picked.max_rel_error.max()), tolerance))
    verdict = "pass" if passed else "fail"
    if len(spans) != 1:
        return Measurement("; ".join(parts), verdict=verdict)
    err, low, high, tolerance = spans[0]
    return Measurement("; ".join(parts), verdict=verdict, value=err, ci_low=low, ci_high=high,
                       threshold=tolerance)
