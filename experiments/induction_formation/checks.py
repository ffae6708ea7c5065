"""Claim checks of the induction-formation experiment (see
``data/claims/induction_formation.json``); each reads the run's ``phase_change`` table."""

from __future__ import annotations

import pandas as pd

from workbench.core.errors import WorkbenchError
from workbench.harness.claims import Measurement, claim_check
from workbench.store.runs import Run


def _phase(run: Run, n_layers: int) -> pd.Series:
    table = run.table("phase_change")
    rows = table[table.n_layers == n_layers]
    if rows.empty:
        raise WorkbenchError(f"run {run.id} trained no {n_layers}-layer model")
    return rows.iloc[0]


@claim_check("formation_no_induction")
def no_induction_heads(run: Run, *, n_layers: int = 1, threshold: float = 0.2
                       ) -> Measurement:
    """No phase change, and every head's final induction score stays below ``threshold``."""
    r = _phase(run, n_layers)
    passed = (not r.detected) and r.induction_final < threshold
    return Measurement(
        f"L{n_layers}: max induction {r.induction_initial:.2f} -> {r.induction_final:.2f} "
        f"(threshold {threshold}), phase change {'found' if r.detected else 'not found'}; "
        f"second-repeat loss {r.second_repeat_final:.2f} vs first {r.first_repeat_final:.2f}",
        bool(passed), float(r.induction_final))


@claim_check("formation_induction_forms")
def induction_heads_form(run: Run, *, n_layers: int = 2, threshold: float = 0.4,
                         repeat_ratio: float = 0.5) -> Measurement:
    """A phase change is found, a head's final induction score reaches ``threshold``, and
    the second-repeat loss falls below ``repeat_ratio`` times the first-repeat loss."""
    r = _phase(run, n_layers)
    ratio = r.second_repeat_final / r.first_repeat_final
    passed = bool(r.detected) and r.induction_final >= threshold and ratio <= repeat_ratio
    where = (f"window steps {int(r.start_step)}-{int(r.end_step)}" if r.detected
             else "no phase change")
    return Measurement(
        f"L{n_layers}: max induction {r.induction_initial:.2f} -> {r.induction_final:.2f} "
        f"(threshold {threshold}), {where}; second/first repeat loss {ratio:.2f} "
        f"(needed <= {repeat_ratio})", passed, float(r.induction_final))


@claim_check("formation_coincide")
def bump_and_icl_jump_coincide(run: Run, *, n_layers: int = 2) -> Measurement:
    """The ICL jump and a loss bump fall in the induction phase-change window."""
    r = _phase(run, n_layers)
    if not r.detected:
        return Measurement(f"L{n_layers}: no phase change window to compare with", False)
    return Measurement(
        f"L{n_layers}: window steps {int(r.start_step)}-{int(r.end_step)}; ICL jump at "
        f"{r.icl_jump_start}-{r.icl_jump_end} ({'in' if r.icl_jump_in_window else 'outside'});"
        f" loss bump {'at ' + str(int(r.loss_bump_step)) if r.loss_bump else 'none'} (rate "
        f"{r.loss_rate_in_window:.2f} vs {r.loss_rate_before:.2f} before, nats per e-fold)",
        bool(r.coincide))
