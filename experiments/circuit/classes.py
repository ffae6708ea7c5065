"""How the circuit's heads overlap the head classes other runs stored (``classes_from``).

Each class is tested as a draw: of the model's ``N`` query heads, ``K`` are in the class
and the circuit holds ``n``; if the circuit's heads were drawn at random, the overlap would
be hypergeometric, expected ``n K / N``, and the p-value is its upper tail
``P(overlap >= observed)`` (exact, :func:`workbench.scores.stats.hypergeometric_tail`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from workbench.harness.run_classes import Head, run_classes
from workbench.scores.stats import hypergeometric_tail
from workbench.store.records import head_name
from workbench.store.runs import Run

COLUMNS = ["run", "experiment", "head_class", "class_size", "circuit_heads", "overlap",
           "expected", "p", "heads"]


def parse_runs(text: str) -> list[str]:
    """The run references of ``classes_from``: comma-separated, blanks dropped."""
    return [ref.strip() for ref in text.split(",") if ref.strip()]


def overlap_table(runs: Sequence[Run], circuit: Sequence[Head], n_heads: int
                  ) -> pd.DataFrame:
    """One row per (run, class): the class's size, the circuit's heads, their overlap, the
    overlap expected by chance and its hypergeometric upper-tail p-value.

    Args:
        runs: the runs whose classes are read (checked by
            :func:`workbench.harness.run_classes.class_runs`).
        circuit: the circuit's heads.
        n_heads: the model's query heads, all layers (the population drawn from).
    """
    mine = set(circuit)
    rows = []
    for run in runs:
        for name, heads in run_classes(run).items():
            both = sorted(mine & set(heads))
            rows.append({
                "run": run.id, "experiment": run.experiment, "head_class": name,
                "class_size": len(heads), "circuit_heads": len(mine), "overlap": len(both),
                "expected": len(mine) * len(heads) / n_heads,
                "p": hypergeometric_tail(n_heads, len(heads), len(mine), len(both)),
                "heads": " ".join(head_name(*h) for h in both)})
    return pd.DataFrame(rows, columns=COLUMNS)


def overlap_lines(table: pd.DataFrame) -> list[str]:
    """The summary's lines: each class the circuit's heads overlap, with its p-value, and
    the classes they miss."""
    if table.empty:
        return ["class overlap: the runs named store no head class"]
    hit = table[table.overlap > 0]
    lines = [f"class overlap: {r.head_class} ({r.experiment} {r.run}): {r.overlap} of "
             f"{r.class_size} in the circuit ({r.heads}), expected {r.expected:.2f}, "
             f"p = {r.p:.3g}" for r in hit.itertuples()]
    missed = table[table.overlap == 0]
    if len(missed):
        lines.append("no overlap with: " + ", ".join(
            f"{r.head_class} ({r.class_size} heads)" for r in missed.itertuples()))
    return lines
