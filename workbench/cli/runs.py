"""The run-store commands: ``runs`` (list the stored runs), ``show`` (one run, and the
first rows of one of its tables) and ``clean`` (what processes that died left behind)."""

from __future__ import annotations

import argparse

from workbench.cli.render import _out, _table
from workbench.core import paths


def cmd_runs(args: argparse.Namespace) -> None:
    from workbench.harness.experiment import check_run_kind
    from workbench.store.runs import RunStore

    if args.experiment is not None:
        check_run_kind(args.experiment)
    store = RunStore(paths.runs_dir(args.out))
    runs = store.runs(experiment=args.experiment, model=args.model, status=args.status)
    if not runs:
        _out(f"no runs in {store.root}")
        return
    rows = [{"run": r.id, "experiment": r.experiment, "model": r.model_name or "-",
             "status": r.status, "started": r.meta.started_at[:19]} for r in runs]
    _out(_table(rows, ["run", "experiment", "model", "status", "started"]))
    _out(f"\n{len(runs)} runs in {store.root}")


def cmd_show(args: argparse.Namespace) -> None:
    import json

    from workbench.store.runs import RunStore

    run = RunStore(paths.runs_dir(args.out)).get(args.run)
    if args.table and run.status != "damaged" and args.table not in run.table_names():
        from workbench.core.errors import UnknownNameError
        from workbench.core.registry import did_you_mean

        known = run.table_names()  # refused before anything is printed
        raise UnknownNameError(f"run {run.id} has no table '{args.table}'"
                               f"{did_you_mean(args.table, known)}; its tables: "
                               f"{', '.join(known) or 'none'}")
    meta = run.meta
    _out(f"run        {run.id}")
    _out(f"experiment {run.experiment}")
    if meta.model is None:
        _out("model      -")
    else:
        _out(f"model      {meta.model.name}  ({meta.model.source}, "
             f"sha256 {meta.model.checksum[:16] or '-'})")
    _out(f"status     {run.status}  ({meta.started_at} -> {meta.ended_at or '...'})")
    if meta.error:
        _out(f"error      {meta.error}")
    commit, dirty = (meta.git.commit, meta.git.dirty) if meta.git else (None, False)
    _out(f"code       workbench {meta.workbench_version}, git "
         f"{(commit or '-')[:12]}{' (dirty)' if dirty else ''}")
    _out("config     " + json.dumps(meta.config, sort_keys=True))
    for line in meta.summary:
        _out(f"summary    {line}")
    for name, entry in sorted(meta.tables.items()):
        _out(f"table      {name} ({entry.rows} rows)")
    if (run.path / "recording").is_dir():
        _out("recording  recording/ (open with workbench.recording.Recording.open)")
    if args.table:
        import pandas as pd

        with pd.option_context("display.width", 120, "display.max_columns", 20):
            _out(run.table(args.table).head(args.rows).to_string(index=False))
    _out(str(run.path))


def cmd_clean(args: argparse.Namespace) -> None:
    from workbench.store.runs import RunStore

    store = RunStore(paths.runs_dir(args.out))
    found = store.remove_leftovers() if args.yes else store.leftovers()
    if not found:
        _out(f"nothing left behind in {store.root / '.incomplete'}")
        return
    rows = [{"run": r.id, "experiment": r.experiment, "status": r.status,
             "started": r.meta.started_at[:19], "why": (r.meta.error or "")[:60]}
            for r in found]
    _out(_table(rows, ["run", "experiment", "status", "started", "why"]))
    if args.yes:
        _out(f"\nremoved {len(found)} runs left by processes that died")
    else:
        _out(f"\n{len(found)} runs left by processes that died; `workbench clean --yes` "
             "removes them")
