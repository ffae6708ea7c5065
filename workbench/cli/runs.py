"""The run-store commands: ``runs`` (list the stored runs) and ``show`` (one run, and the
first rows of one of its tables)."""

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
             "status": r.status, "started": r.meta.get("started_at", "")[:19]} for r in runs]
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
    model = meta.get("model") or {}
    _out(f"run        {run.id}")
    _out(f"experiment {run.experiment}")
    _out(f"model      {model.get('name', '-')}  ({model.get('source', '-')}, "
         f"sha256 {str(model.get('checksum', ''))[:16] or '-'})")
    _out(f"status     {run.status}  ({meta.get('started_at')} -> {meta.get('ended_at', '...')})")
    if meta.get("error"):
        _out(f"error      {meta['error']}")
    git = meta.get("git") or {}
    _out(f"code       workbench {meta.get('workbench_version')}, git "
         f"{(git.get('commit') or '-')[:12]}{' (dirty)' if git.get('dirty') else ''}")
    _out("config     " + json.dumps(meta.get("config", {}), sort_keys=True))
    for line in meta.get("summary", []):
        _out(f"summary    {line}")
    for name, entry in sorted(meta.get("tables", {}).items()):
        _out(f"table      {name} ({entry['rows']} rows)")
    if (run.path / "recording").is_dir():
        _out("recording  recording/ (open with workbench.recording.Recording.open)")
    if args.table:
        import pandas as pd

        with pd.option_context("display.width", 120, "display.max_columns", 20):
            _out(run.table(args.table).head(args.rows).to_string(index=False))
    _out(str(run.path))
