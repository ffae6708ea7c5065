"""``workbench compare A B``: two runs of one experiment on one model, side by side.

Both runs are opened and checked (one experiment, one model, both complete) before any
table is read, so a refusal is one line and costs nothing. Then the configs that differ,
each run's interventions, what could not be compared, and for every table both runs have
the differences ``B - A`` (:mod:`workbench.harness.compare`), the first ``--rows`` rows
of each table (``--table`` shows one table, ``--rows`` more of it)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from workbench.cli.render import _cell, _out, _table
from workbench.core import paths

SHOWN = ["key", "column", "a", "b", "difference", "ci_low", "ci_high", "p", "n_prompts"]


def _number(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def cmd_compare(args: argparse.Namespace) -> None:
    from workbench.harness.compare import check_comparable, compare
    from workbench.scores import paired
    from workbench.store.runs import RunStore

    store = RunStore(paths.runs_dir(args.out))
    a, b = store.get(args.a), store.get(args.b)
    check_comparable(a, b)
    result = compare(a, b, only=args.table)
    _out(f"A          {_cell(a.id)}  interventions: {_cell(result.interventions[0])}")
    _out(f"B          {_cell(b.id)}  interventions: {_cell(result.interventions[1])}")
    _out(f"experiment {_cell(a.experiment)} on {_cell(a.model_name or '-')}")
    differing = result.config[result.config.differs]
    if differing.empty:
        _out("config     the same")
    for row in differing.itertuples():
        _out(f"config     {_cell(row.field)}: A {_cell(row.a)}, B {_cell(row.b)}")
    for note in result.notes:
        _out(f"note       {_cell(note)}")
    _out(f"differences are B - A; intervals: 95% paired bootstrap over prompts "
         f"({paired.N_RESAMPLES} resamples, seed {paired.SEED}); p: two-sided sign-flip "
         f"test ({paired.N_FLIPS} draws), where both runs scored the same prompts")
    for name, rows in result.differences.groupby("table", sort=False):
        shown = rows.head(args.rows)
        _out(f"\ntable {_cell(name)} ({rows.pairing.iloc[0]}, {len(rows)} rows)")
        _out(_table([{c: _number(r[c]) for c in SHOWN} for r in shown.to_dict("records")],
                    SHOWN))
        if len(rows) > len(shown):
            _out(f"... {len(rows) - len(shown)} more rows (--table {_cell(name)} --rows N)")
