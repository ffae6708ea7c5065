"""Claim checks of the circuit experiment (see ``data/claims/circuit.json``).

``empty_circuit_is_corrupted_run`` reads ``metric_by_prompt``: each prompt's metric on the
full graph and on the empty circuit (both run through the edge-ablation machinery) and on
the corrupted input run plainly, with no edge patched.

``class_in_circuit`` reads the head classes of the runs ``classes_from`` names (a claim
fills it with ``run_inputs``) and the circuits of the ``faithfulness`` grid, each the top
edges of ``edges``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.circuit.classes import parse_runs
from experiments.circuit.measure import circuit_heads
from workbench.harness.claims import Measurement, claim_check
from workbench.harness.run_classes import Head, run_classes
from workbench.harness.tables import read as read_table
from workbench.scores.stats import hypergeometric_tail
from workbench.store.records import head_name
from workbench.store.runs import Run, RunStore


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


def _class_heads(run: Run, head_class: str) -> tuple[set[str], str]:
    """The heads the ``classes_from`` runs put in ``head_class`` (their union), and, when
    there are none, why."""
    refs = parse_runs(str(run.meta.config.get("classes_from", "")))
    if not refs:
        return set(), "the run names no classes_from run"
    store = RunStore(run.path.parent)
    heads: set[Head] = set()
    why = []
    for ref in refs:
        source = store.get(ref)
        found = run_classes(source).get(head_class)
        heads.update(found or ())
        if not found:
            why.append(f"{source.experiment} run {source.id} {_why_empty(source, head_class)}")
    return {head_name(*h) for h in heads}, "; ".join(why)


def _why_empty(source: Run, head_class: str) -> str:
    if "classes" in source.table_names():  # an ioi run: a class counts only where claimed
        rows = read_table(source, "classes")
        if (rows.head_class == head_class).any():
            return (f"claims no {head_class}: the model does not do the task above chance "
                    "there (its logit difference's interval does not exclude 0)")
    return f"puts no head in the {head_class} class"


def _first(hits: pd.Series) -> int | None:
    return int(np.argmax(hits.to_numpy())) if hits.any() else None


@claim_check("class_in_circuit")
def class_in_circuit(run: Run, *, head_class: str, level: float = 0.8) -> Measurement:
    """Every head the ``classes_from`` runs put in ``head_class`` is among the heads of the
    smallest circuit reaching faithfulness ``level``, judged on the faithfulness intervals.

    Circuits of the grid are nested (each the top edges by ``|score|``), so the share of
    the class a circuit holds grows with its size. The smallest circuit at ``level`` is
    somewhere between the smallest whose 95% bootstrap interval reaches ``level`` (its high
    end) and the smallest whose whole interval does (its low end): the share held by those
    two is the interval judged against 1 (all of the class). Pass: the first holds every
    head of the class; fail: the second misses one; undecided between, when no circuit's
    interval reaches ``level``, or when the class is empty (an ioi run claims no class
    where the model does not do the task). The value is the share held by the smallest
    circuit whose faithfulness itself reaches ``level``.
    """
    members, why = _class_heads(run, head_class)
    if not members:
        return Measurement(f"no {head_class} to look for: {why}", verdict="undecided")
    curve = read_table(run, "faithfulness").sort_values("n_edges", ignore_index=True)
    edges = read_table(run, "edges")
    maybe, surely = _first(curve.ci_high >= level), _first(curve.ci_low >= level)
    point = _first(curve.faithfulness >= level)
    if maybe is None:
        return Measurement(f"no circuit of the grid has a faithfulness interval reaching "
                           f"{level:g} (the full graph: {curve.faithfulness.iloc[-1]:.3f})",
                           verdict="undecided")

    def held(at: int | None) -> tuple[float, str]:
        if at is None:
            return 1.0, (f"no circuit of the grid has its whole interval at or above "
                         f"{level:g}, so none is known to miss a {head_class}")
        row = curve.iloc[at]
        heads = circuit_heads(edges, int(row.n_edges))
        inside = sorted(members & set(heads), key=_order)
        n_heads = run.meta.model.n_layers * run.meta.model.n_heads if run.meta.model else 0
        p = hypergeometric_tail(n_heads, len(members), len(heads), len(inside))
        return len(inside) / len(members), (
            f"{int(row.n_edges)} edges ({row.fraction:g}), f = {row.faithfulness:.3f} "
            f"[{row.ci_low:.3f}, {row.ci_high:.3f}]: {len(heads)} of {n_heads} heads, "
            f"{len(inside)} of the {len(members)} {head_class}s ({' '.join(inside) or 'none'}; "
            f"expected by chance {len(heads) * len(members) / n_heads:.2f}, p = {p:.2g})")

    low, low_text = held(maybe)
    high, high_text = held(surely)
    value = held(point)[0] if point is not None else None
    return Measurement.compare(
        f"{head_class}s of the classes_from runs: {' '.join(sorted(members, key=_order))}; "
        f"smallest circuit whose interval reaches {level:g}: {low_text}; smallest whose "
        f"interval is all at or above it: {high_text} (needs every {head_class} in the first "
        f"to pass, misses one in the second to fail)",
        value if value is not None else float("nan"), low, high, 1.0, "above")


def _order(head: str) -> tuple[int, int]:
    layer, index = head[1:].split("H")
    return int(layer), int(index)
