"""Claim checks of the circuit experiment (see ``data/claims/circuit.json``).

They read ``metric_by_prompt``: each prompt's metric on the full graph and on the empty
circuit (both run through the edge-ablation machinery) and on the corrupted input run
plainly, with no edge patched.
"""

from __future__ import annotations

import numpy as np

from workbench.harness.claims import Measurement, claim_check
from workbench.harness.tables import read as read_table
from workbench.store.runs import Run


@claim_check("empty_circuit_is_corrupted_run")
def empty_circuit_is_corrupted_run(run: Run, *, threshold: float = 1e-3) -> Measurement:
    """With every edge carrying its corrupted output, the model is the corrupted run: the
    largest ``|m(empty) - m(corrupted)|`` over prompts, relative to the clean-corrupted gap
    ``|mean m(full) - mean m(corrupted)|``, is at most ``threshold`` (float round-off).
    Only a run with ``ablation=corrupted`` asks it: a mean-ablated empty circuit is
    another model."""
    if run.meta.config.get("ablation") != "corrupted":
        return Measurement(f"the run ablates edges to their {run.meta.config.get('ablation')}"
                           ", not their corrupted outputs", verdict="undecided")
    if "metric_by_prompt" not in run.table_names():
        return Measurement("the run stores no metric_by_prompt table (stored before it)",
                           verdict="undecided")
    table = read_table(run, "metric_by_prompt")
    clean, empty, corrupted = (table[c].to_numpy() for c in ("clean", "empty", "corrupted"))
    gap = abs(float(clean.mean() - corrupted.mean()))
    worst = float(np.abs(empty - corrupted).max())
    if gap == 0.0:
        return Measurement("the clean and corrupted metrics are equal: no gap to measure "
                           "against", verdict="undecided")
    share = worst / gap
    return Measurement(
        f"{len(table)} prompts: the empty circuit's metric differs from the corrupted run's "
        f"by at most {worst:.3g} (mean empty {empty.mean():+.4f}, corrupted "
        f"{corrupted.mean():+.4f}, clean {clean.mean():+.4f}): {share:.2g} of the "
        f"clean-corrupted gap (needs <= {threshold:g})",
        passed=share <= threshold, value=share, threshold=threshold)
