"""``workbench sweep``: a sweep spec run on Ray, resumably, with a bar of its cells; or,
with ``--dry-run``, its cells and a cost estimate from earlier runs."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from workbench.cli.render import _cell, _duration, _one_line, _out, _table
from workbench.core import paths


def cmd_sweep(args: argparse.Namespace) -> None:
    from workbench.harness.sweeps import runner

    if not args.dry_run:
        from workbench.harness.sweeps.cluster import import_ray

        import_ray()  # without Ray, say so before reading anything
    spec, cells = runner.plan(args.spec, args.out)
    if args.dry_run:
        _sweep_plan(spec, cells, args)
        return
    with _sweep_bar(len(cells), args.quiet) as show:
        run = runner.run_sweep(spec, cells, runs_dir=args.out, cpus=args.cpus, gpus=args.gpus,
                              address=args.address, dtype=args.dtype, on_progress=show)
    for line in run.meta.summary:
        _out(_cell(line))
    _out(_cell(run.path))
    bad = runner.failed_cells(run)
    if len(bad):
        first = bad.iloc[0]
        sys.stderr.write(f"error: {len(bad)} of {len(cells)} cells did not complete (cell "
                         f"{first.cell}: {first.status}: {_one_line(first.error)[:200]}); "
                         "run the sweep again to retry them\n")
        sys.exit(1)


def _sweep_plan(spec: Any, cells: Sequence[Any], args: argparse.Namespace) -> None:
    """``--dry-run``: the cells, whether each is run, reused or skipped (and why), and a
    cost estimate of those that run."""
    from workbench.harness.sweeps import runner
    from workbench.store.runs import RunStore

    store = RunStore(paths.runs_dir(args.out))
    reused = runner.reusable(cells, store)
    cost = runner.estimate(cells, store, reused)
    rows = [{"cell": c.index, "experiment": c.experiment,
             "model": c.model.name if c.model else "-",
             "values": " ".join(f"{k}={v}" for k, v in c.grid.items()),
             "plan": _cell_plan(c, reused),
             "estimate": "-" if c.skip or cost.seconds[c.index] is None
             else _duration(cost.seconds[c.index])} for c in cells]
    _out(_table(rows, ["cell", "experiment", "model", "values", "plan", "estimate"]))
    slots = runner.local_slots(args.cpus)
    skipped = sum(bool(c.skip) for c in cells)
    _out(f"\n{spec.name}: {len(cells)} cells, {len(reused)} reused"
         + (f", {skipped} skipped" if skipped else ""))
    to_run = [c for c in cells if not c.skip and c.index not in reused]
    unknown = sum(cost.seconds[c.index] is None for c in to_run)
    if unknown == len(to_run) and unknown:
        _out("estimate: no estimate (no earlier run of these experiments on these models)")
        return
    known = sum(cost.seconds[c.index] or 0.0 for c in to_run)
    note = f"; {unknown} cells have no earlier run to go by" if unknown else ""
    _out(f"estimate: {_duration(known)} of cell time, about "
         f"{_duration(known / slots)} on {slots} local workers of {args.cpus} CPUs "
         f"(model loading and Ray start-up not included){note}")


def _cell_plan(cell: Any, reused: dict[int, Any]) -> str:
    """What the sweep will do with a cell: skip it (and why), reuse a run, or run it."""
    if cell.skip:
        return f"skip: {cell.skip}"
    return f"reuse {reused[cell.index].id}" if cell.index in reused else "run"


def _plain_cells(total: int) -> Callable[[Any], None]:
    """On a stderr that is not a terminal: a plain line each time a cell ends, no redraws."""
    start = time.monotonic()
    shown: list[tuple[int, int]] = []

    def show(p: Any) -> None:
        if shown and shown[-1] == (p.done, p.failed):
            return
        shown.append((p.done, p.failed))
        sys.stderr.write(f"cells: {p.done + p.failed}/{total} ended ({p.done} done, "
                         f"{p.failed} failed, {p.running} running; "
                         f"{_duration(time.monotonic() - start)} elapsed)\n")
        sys.stderr.flush()

    return show


@contextlib.contextmanager
def _sweep_bar(total: int, quiet: bool) -> Any:
    """A tqdm bar of a sweep's cells: done, running, failed, time left."""
    if quiet:
        yield lambda p: None
        return
    if not sys.stderr.isatty():
        yield _plain_cells(total)
        return
    from tqdm import tqdm

    bars: list[Any] = []  # drawn at the first report, so a refusal before it is one line

    def show(p: Any) -> None:
        if not bars:
            bars.append(tqdm(total=total, desc="cells", dynamic_ncols=True, file=sys.stderr,
                             smoothing=0))
        bar = bars[0]
        bar.set_postfix_str(f"{p.done} done, {p.running} running, {p.failed} failed",
                            refresh=False)
        bar.update(p.done + p.failed - bar.n)

    try:
        yield show
    finally:
        for bar in bars:
            bar.close()
