"""``workbench reproduce``: published claims checked against measured results, or listed
with their last stored verdicts (``--list``, ``--wide``)."""

from __future__ import annotations

import argparse
import contextlib
import textwrap
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from workbench.cli.render import _cell, _fill, _out, _table
from workbench.core import paths
from workbench.core.devices import chosen_device
from workbench.core.errors import WorkbenchError


def cmd_reproduce(args: argparse.Namespace) -> None:
    from workbench.harness import claims as claims_mod
    from workbench.store.runs import RunStore

    selected = claims_mod.select(claims_mod.load_claims(), args.claims or [])
    store = RunStore(paths.runs_dir(args.out))
    if args.list:
        _claim_list(selected, _last_verdicts(store), wide=args.wide)
        _out(_fill(f"verdict: the newest in {store.root} ('-': not checked there); "
                   "`--wide` shows each claim in full"))
        return
    run = claims_mod.reproduce_run(store, selected, model=args.model, fresh=args.fresh,
                                   device=chosen_device(args.device))
    table = run.table("claims")
    judged = table.verdict.isin(["pass", "fail", "undecided"])
    table = table.assign(measured=table.measured.where(judged, table.reason))
    for kind, title in (("reproduction", "Reproductions"), ("invariant", "Invariants")):
        group = table[table.kind == kind]
        _out(f"== {title} (a paper's findings) ==" if kind == "reproduction"
             else f"== {title} (mathematical properties, not counted as findings) ==")
        for row in group.to_dict("records"):
            _reproduce_row(row)
        _out(f"{title}: {claims_mod.counts(group.verdict)}")
        _out()
    _out(_cell(run.path))


def _last_verdicts(store: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The newest stored verdict of each (claim, model), from the complete ``reproduce``
    runs in the store (none if it holds none)."""
    if not store.root.is_dir():
        return {}
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for run in reversed(store.runs(experiment="reproduce", status="complete")):
        with contextlib.suppress(WorkbenchError, OSError):  # a damaged table: older ones
            for row in run.table("claims").to_dict("records"):
                found.setdefault((row["claim"], row["model"]), {**row, "run": run.id})
    return found


_WIDE_FIELDS = ("source", "quote", "published", "applies_to", "experiment", "config",
                "run_inputs", "check", "file")
"""What ``reproduce --list --wide`` adds under each claim."""


def _claim_list(selected: Sequence[Any], last: dict[tuple[str, str], dict[str, Any]], *,
                wide: bool) -> None:
    """``reproduce --list``: id, kind, model and last verdict, then the statement on its
    own lines; ``--wide`` adds every field of the claim and what was last measured."""
    indent = " " * 4
    per_claim = [[{"claim": c.id, "kind": c.kind, "model": m,
                   "verdict": last.get((c.id, m), {}).get("verdict", "-")}
                  for m in (c.models or ("-",))] for c in selected]
    lines = iter(_table([r for rows in per_claim for r in rows],
                        ["claim", "kind", "model", "verdict"]).splitlines())
    _out(next(lines))  # the header, and its rule
    _out(next(lines))
    for c, rows in zip(selected, per_claim, strict=True):
        for _ in rows:
            _out(next(lines))
        _out(_fill(c.statement, indent=indent))
        if not wide:
            continue
        for name in _WIDE_FIELDS:
            value = getattr(c, name)
            if value not in ("", None, (), {}):
                text = (", ".join(value) if isinstance(value, tuple)
                        else "; ".join(f"{k}: {v}" for k, v in value.items())
                        if name == "run_inputs" else str(value))
                _out(_fill(f"{name}: {text}", indent=indent, hanging=indent * 2))
        for row in rows:
            seen = last.get((c.id, row["model"]))
            if seen is not None:
                measured = seen["measured"] or seen["reason"]
                _out(_fill(f"last on {row['model']}: {seen['verdict']}, {measured} "
                           f"(run {seen['run']})", indent=indent, hanging=indent * 2))
        _out()


def _reproduce_row(row: Mapping[Hashable, Any]) -> None:
    _out(f"{_cell(row['verdict']).upper():9s} {_cell(row['claim'])}  [{_cell(row['model'])}]")
    for label in ("source", "published", "measured"):
        _out(textwrap.indent(textwrap.fill(f"{label}: {_cell(row[label])}", 96), " " * 10))
