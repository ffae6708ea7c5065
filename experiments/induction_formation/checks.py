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


def _coincide(r: pd.Series, prefix: str) -> bool | None:
    """Whether the ICL jump and a loss bump lie in the window on one kind of text
    (``None``: not known, the bump test could not run or the run predates the column)."""
    value = r.get(f"{prefix}coincide")
    return None if value is None or pd.isna(value) else bool(value)


def _true(value: object) -> bool:
    """A bool column's value that is present and true (missing reads as not true)."""
    return value is not None and not pd.isna(value) and bool(value)


def _signals(r: pd.Series, prefix: str) -> str:
    if pd.isna(r.get(f"{prefix}icl_jump_start")):
        return "not measured (the run predates these columns)"
    jump = (f"ICL jump at {int(r[prefix + 'icl_jump_start'])}-"
            f"{int(r[prefix + 'icl_jump_end'])} "
            f"({'in' if _true(r[prefix + 'icl_jump_in_window']) else 'outside'})")
    if not _true(r.get(f"{prefix}loss_bump_tested")):
        return f"{jump}; loss bump not testable (too few checkpoints around the window)"
    bump = "found" if _true(r[f"{prefix}loss_bump"]) else "none"
    return (f"{jump}; loss bump {bump} ({r[prefix + 'loss_bump_z']:.1f} noise SDs at step "
            f"{int(r[prefix + 'loss_bump_step'])}, needed > "
            f"{r[prefix + 'loss_bump_threshold']:.1f})")


@claim_check("formation_coincide")
def bump_and_icl_jump_coincide(run: Run, *, n_layers: int = 2) -> Measurement:
    """The ICL jump and a loss bump fall in the induction phase-change window, judged on
    the plain held-out text (Olsson et al.'s argument is about natural data), with the
    repeated-passage windows reported beside it.

    ``undecided`` when there is no window to compare with or the loss-bump test could not
    run on the plain text; otherwise pass or fail on whether both signals lie in it.
    """
    r = _phase(run, n_layers)
    if not r.detected:
        return Measurement(f"L{n_layers}: no phase change window to compare with",
                           verdict="undecided")
    natural = _coincide(r, "natural_")
    repeated = _coincide(r, "")
    verdict = "undecided" if natural is None else "pass" if natural else "fail"
    said = {True: "coincide", False: "do not coincide", None: "undecided"}
    return Measurement(
        f"L{n_layers}: window steps {int(r.start_step)}-{int(r.end_step)}; plain text "
        f"(the verdict): {_signals(r, 'natural_')}, {said[natural]}; repeated-passage "
        f"windows: {_signals(r, '')}, {said[repeated]}", verdict=verdict)
