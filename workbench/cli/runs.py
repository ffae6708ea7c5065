"""The run-store commands: ``runs`` (list the stored runs), ``show`` (one run, and the
first rows of one of its tables) and ``clean`` (what processes that died left behind).

Everything they print comes from stored files a damaged or hostile store may have
written, so every stored string is shown inert (:func:`workbench.cli.render._cell`): a
newline in a folder's name or an escape sequence in a run's ``error`` prints as its
escape, never as a forged row or a rewritten screen. A folder whose name is not a run id
(:data:`workbench.store.records.RUN_ID_PATTERN`) is listed as ``damaged``."""

from __future__ import annotations

import argparse
import re
from typing import Any

from workbench.cli.render import _cell, _out, _table
from workbench.core import paths


def _status(run: Any) -> str:
    """The run's status, ``damaged`` whatever its ``run.json`` says when its folder's name
    is not a run id (nothing the store writes is named so)."""
    from workbench.store.records import RUN_ID_PATTERN

    return run.status if re.fullmatch(RUN_ID_PATTERN, run.path.name) else "damaged"


def cmd_runs(args: argparse.Namespace) -> None:
    from workbench.harness.run_facts import check_run_kind
    from workbench.store.runs import RunStore

    if args.experiment is not None:
        check_run_kind(args.experiment)
    store = RunStore(paths.runs_dir(args.out))
    every = store.runs()
    runs = [r for r in every if (args.experiment is None or r.experiment == args.experiment)
            and (args.model is None or r.model_name == args.model)
            and (args.status is None or _status(r) == args.status)]
    if not runs:
        _out(f"no runs in {_cell(store.root)}")
        return
    rows = _rows(runs, every)
    _out(_table(rows, RUN_COLUMNS))
    _out(f"\n{len(runs)} runs in {_cell(store.root)}")
    if any(row["load"] == "busy" for row in rows):
        _out("load busy: the machine's load was above its cores at the run's start or end, "
             "so its duration is not its own")


RUN_COLUMNS = ["run", "experiment", "model", "status", "started", "duration", "load",
               "varies", "sweep"]


def _rows(runs: list[Any], every: list[Any]) -> list[dict[str, str]]:
    """One row of ``workbench runs`` a run: what tells it apart from its neighbours (the
    config values it changed from its experiment's defaults, the sweep of ``every`` it was
    a cell of), how long it took and whether the machine was busy meanwhile."""
    from workbench.harness import run_facts

    sweeps = run_facts.parents(every)
    return [{"run": r.id, "experiment": r.experiment,
             "model": run_facts.sweep_name(r) or r.model_name or "-", "status": _status(r),
             "started": r.started_at[:19],
             "duration": run_facts.duration_text(r.seconds), "load": run_facts.load_text(r),
             "varies": run_facts.varies_text(r), "sweep": run_facts.parent_text(r, sweeps)}
            for r in runs]


def _check_classes(run: Any, classes: bool) -> None:
    """Refuse ``--classes`` for a run without a head_classes table, before printing."""
    if not classes or run.status == "damaged" or "head_classes" in run.table_names():
        return
    from workbench.core.errors import WorkbenchError

    raise WorkbenchError(f"run {_cell(run.id)} has no head_classes table (runs of "
                         "previous-token-heads, induction-heads, head-overview and "
                         "attention-sinks store one)")


CLASS_COLUMNS = ["layer", "head", "score", "ci_low", "ci_high", "null_mean", "chance", "p",
                 "q"]


def _classes(run: Any, fdr: float | None) -> str:
    """The heads in each class of the run's head_classes table, best score first: at the
    run's declared rate, or at ``fdr`` (a BH q-value is the least rate that rejects)."""
    from workbench.core.errors import WorkbenchError
    from workbench.harness import tables
    from workbench.scores import classes
    from workbench.store.runs import model_sizes
    from workbench.store.schema import head_classes

    if "head_classes" not in run.table_names():
        return "class      none: the run has no head_classes table"
    table = tables.read(run, "head_classes")
    try:  # also for a kind that does not declare it: every head_classes table is one shape
        head_classes().check(table, model_sizes(run.meta.model))
    except WorkbenchError as exc:
        raise WorkbenchError(f"run {_cell(run.id)}: {exc}") from None
    blocks = []
    for name, rows in classes.at_rate(table, fdr).groupby("head_class", sort=False):
        rate = float(rows.fdr.iloc[0])
        inside = rows[rows.in_class].sort_values("score", ascending=False)
        first = rows.iloc[0]
        draws = int(first.n_draws)
        floor = f", smallest p {1 / (1 + draws):.2g}" if draws >= 0 else ""
        head = (f"class      {_cell(name)} at FDR {rate:g}: {len(inside)} of {len(rows)} heads "
                f"({_cell(first.metric)} on {_cell(first.inputs)}; null: {_cell(first.null)}; "
                f"{draws} draws{floor})")
        if inside.empty:
            blocks.append(head)
            continue
        cells = [{"layer": int(r["layer"]), "head": int(r["head"]),
                  **{c: f"{float(r[c]):.3g}" for c in CLASS_COLUMNS[2:]}}
                 for r in inside.to_dict("records")]
        blocks.append(head + "\n" + _table(cells, CLASS_COLUMNS))
    return "\n".join(blocks) if blocks else "class      none: the head_classes table is empty"


def _check_table(run: Any, table: str | None) -> None:
    """Refuse a ``--table`` the run does not have, before anything is printed."""
    if not table or run.status == "damaged" or table in run.table_names():
        return
    from workbench.core.errors import UnknownNameError
    from workbench.core.registry import did_you_mean
    from workbench.core.values import shown

    known = run.table_names()
    raise UnknownNameError(f"run {_cell(run.id)} has no table {shown(table)}"
                           f"{did_you_mean(table, known)}; its tables: "
                           f"{', '.join(_cell(k) for k in known) or 'none'}")


def _model_line(meta: Any) -> str:
    if meta.model is None:
        return "-"
    model = meta.model
    return (f"{_cell(model.name)}  ({_cell(model.source)}, "
            f"sha256 {_cell(model.checksum[:16]) or '-'})")


def _memory_line(meta: Any) -> str:
    """``peak RSS 1.2 GiB, peak GPU 3.4 GiB`` from what the run recorded (empty: nothing)."""
    parts = [f"peak {what} {mib / 1024:.1f} GiB" for what, mib in
             (("RSS", meta.peak_rss_mib), ("GPU", meta.peak_gpu_mib)) if mib is not None]
    return ", ".join(parts)


def cmd_show(args: argparse.Namespace) -> None:
    import json

    from workbench.store.runs import RunStore

    run = RunStore(paths.runs_dir(args.out)).get(args.run)
    _check_table(run, args.table)
    _check_classes(run, args.classes)
    if args.fdr is not None and not args.classes:
        from workbench.core.errors import WorkbenchError

        raise WorkbenchError("--fdr goes with --classes")
    meta = run.meta
    _out(f"run        {_cell(run.id)}")
    _out(f"experiment {_cell(run.experiment)}")
    _out(f"model      {_model_line(meta)}")
    if run.interventions_text:
        _out(f"intervened {_cell(run.interventions_text)}")
    _out(f"status     {_status(run)}  ({_cell(meta.started_at)} -> "
         f"{_cell(meta.ended_at) or '...'})")
    if run.seconds is not None:
        from workbench.harness.run_facts import duration_text

        _out(f"wall time  {duration_text(run.seconds)}  ({meta.load_note})")
    if meta.error:
        _out(f"error      {_cell(meta.error)}")
    if meta.attention is not None:
        _out(f"attention  {meta.attention}")
    memory = _memory_line(meta)
    if memory:
        _out(f"memory     {memory}")
    commit, dirty = (meta.git.commit, meta.git.dirty) if meta.git else (None, False)
    _out(f"code       workbench {_cell(meta.workbench_version)}, git "
         f"{_cell((commit or '-')[:12])}{' (dirty)' if dirty else ''}")
    _out("config     " + json.dumps(meta.config, sort_keys=True))  # JSON escapes controls
    for line in meta.summary:
        _out(f"summary    {_cell(line)}")
    for name, entry in sorted(meta.tables.items()):
        _out(f"table      {_cell(name)} ({entry.rows} rows)")
    if (run.path / "recording").is_dir():
        _out("recording  recording/ (open with workbench.recording.Recording.open)")
    if args.table:
        _out(_table_head(run, args.table, args.rows))
    if args.classes:
        _out(_classes(run, args.fdr))
    _out(_cell(run.path))


def cmd_clean(args: argparse.Namespace) -> None:
    from workbench.store.runs import RunStore

    store = RunStore(paths.runs_dir(args.out))
    found = store.remove_leftovers() if args.yes else store.leftovers()
    # listed so that a run clean will not remove is not a mystery; removed only by hand
    for run in store.held_back():
        writer = (f"its writer, process {run.meta.pid}, still runs" if run.meta.pid
                  else "its run.json names no writer process, so it may still be written")
        _out(f"kept {_cell(run.id)} ({run.status}): {writer}; remove it by hand once "
             "nothing writes it")
    if not found:
        _out(f"nothing left behind in {store.root / '.incomplete'} by processes that died")
        return
    rows = [{"run": r.id, "experiment": r.experiment, "status": r.status,
             "started": r.started_at[:19], "why": (r.meta.error or "")[:60]}
            for r in found]
    _out(_table(rows, ["run", "experiment", "status", "started", "why"]))
    if args.yes:
        _out(f"\nremoved {len(found)} runs left by processes that died")
    else:
        _out(f"\n{len(found)} runs left by processes that died; `workbench clean --yes` "
             "removes them")


def _table_head(run: Any, table: str, rows: int) -> str:
    """The first ``rows`` rows of a stored table, every text cell inert."""
    import pandas as pd

    from workbench.core.errors import printable
    from workbench.harness import tables

    head = tables.read(run, table).head(rows)
    head = head.map(lambda v: printable(v) if isinstance(v, str) else v)
    with pd.option_context("display.width", 120, "display.max_columns", 20):
        return head.to_string(index=False)
