"""``workbench sweep``: run the cells of a sweep spec on Ray, resumably, into one sweep run.

A sweep (:mod:`workbench.harness.sweeps.spec`) expands into cells before anything runs, so
an unknown experiment, model or field, a model that is not one, an empty grid, a glob
matching nothing, two cells that are one run, a cell its experiment's ``preflight``
refuses (a document beyond a bundled model's context) or more than
:data:`~workbench.harness.sweeps.spec.MAX_CELLS` cells fail at once, and a cell whose model
its experiment refuses (an encoder for a causal experiment) is known to be skipped. Then:

0. **Models.** Bundled models are fetched (or verified) once, before Ray starts.
1. **Reuse.** A cell whose matching complete run exists (the rule of ``workbench run
   --reuse``: same experiment, weights, config and workbench version, every file
   re-hashed) is not run again. The driver checks the cells whose weights' checksum it
   knows without loading them (bundled models, folders, checkpoints); each worker checks
   the rest after loading the model. A rerun of an interrupted sweep so picks up where it
   stopped.
2. **The store is checked from the workers**: a task on every node writes and removes a
   probe file in the run store; a node that cannot fails the sweep at once.
3. **Cells run as Ray tasks** (:mod:`workbench.harness.sweeps.cluster`), at most as many at a
   time as the cluster has slots of ``cpus`` CPUs, each an ordinary run in the store. A
   failed cell keeps its cause (its run is stored as failed) and the rest go on. Ctrl-C
   or SIGTERM stops scheduling and cancels the running cells (their runs are stored as
   failed); the sweep run is then stored as failed too, with the cells table saying what
   ran (complete, cancelled, not run).
4. **The sweep is a run** (``experiment = sweep``, :mod:`workbench.harness.sweeps.tables`):
   ``spec.toml``, the list of cell runs in ``run.json`` (``cells``), the ``cells`` table
   and the ``scores`` table joining every complete cell's ``head_scores`` with the cell.

Examples:
    >>> spec, cells = plan("data/sweeps/seeds.toml")                  # doctest: +SKIP
    >>> run = run_sweep(spec, cells, cpus=1)                          # doctest: +SKIP
    >>> run.table("scores").groupby(["model", "metric"]).score.max()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.core import paths
from workbench.harness.experiment import verify_stored_files
from workbench.harness.sweeps import cluster
from workbench.harness.sweeps.cluster import Outcome
from workbench.harness.sweeps.spec import Cell, Spec, expand, load_spec
from workbench.harness.sweeps.tables import CELLS, SCORES, TABLES
from workbench.harness.tables import read as read_table
from workbench.models import cache
from workbench.models.zoo import MODELS
from workbench.store.runs import Run, RunStore
from workbench.store.schema import with_layer_types

log = logging.getLogger(__name__)

SPEC_FILE = "spec.toml"
CANCEL_GRACE = 20.0
"""Seconds a cancelled cell has to mark its run failed before its worker is killed."""
DONE = ("complete", "reused", "skipped")


@dataclass(frozen=True)
class Progress:
    """Cells of the sweep so far: ``done`` (complete, reused or skipped), ``running``,
    ``failed``, out of ``total``."""

    total: int
    done: int
    running: int
    failed: int


def plan(spec_path: str | Path, runs_dir: str | Path | None = None) -> tuple[Spec, list[Cell]]:
    """Read a spec and expand it into cells (see :func:`workbench.harness.sweeps.spec.expand`
    for everything refused here, before anything runs).

    Args:
        spec_path: the TOML spec.
        runs_dir: the run store checkpoint names and globs are looked up in.

    Returns:
        The spec and its cells.
    """
    spec = load_spec(spec_path)
    return spec, expand(spec, runs_dir)


def reusable(cells: Sequence[Cell], store: RunStore) -> dict[int, Run]:
    """The cells that a complete, verified run already answers.

    Args:
        cells: the sweep's cells; only those whose weights' checksum is known without
            loading the model are checked here (workers check the others), and none that
            is skipped.
        store: the run store.

    Returns:
        ``{cell index: matching run}``.
    """
    # one listing of the store first: find_matching reads every run of an experiment,
    # which for thousands of cells is worth doing only where a match can be
    stored = {(run.experiment, run.model_name) for run in store.runs(status="complete")}
    found = {}
    for cell in cells:
        weights = None
        if cell.model is not None:
            if cell.model.checksum is None:
                continue
            weights = _Weights(cell.model.name, cell.model.checksum)
        if cell.skip or (cell.experiment, cell.model.name if cell.model else None) not in stored:
            continue
        run = store.find_matching(cell.experiment, weights, cell.overrides,
                                  check=verify_stored_files)
        if run is not None:
            found[cell.index] = run
    return found


@dataclass(frozen=True)
class _Weights:
    """The two facts of a model's info that :meth:`RunStore.find_matching` compares,
    known without loading it (a :class:`~workbench.store.runs.Weights`)."""

    name: str
    checksum: str


def fetch_bundled(cells: Sequence[Cell]) -> None:
    """Fetch (or verify) every bundled model the cells run on, once, in this process: a
    model that cannot be had fails here, before Ray starts or a run exists, not in every
    cell.

    Raises:
        WorkbenchError: a model that cannot be downloaded or whose cached copy is damaged.
    """
    for name in sorted({c.model.name for c in cells if c.model and c.model.name in MODELS}):
        cache.fetch(name)


# ---- the cost estimate --------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """Seconds per cell from earlier runs (``None``: no earlier run to go by)."""

    seconds: dict[int, float | None]

    @property
    def known(self) -> float:
        return sum(s for s in self.seconds.values() if s is not None)

    @property
    def unknown(self) -> int:
        return sum(s is None for s in self.seconds.values())


def estimate(cells: Sequence[Cell], store: RunStore,
             reused: Mapping[int, Run] | None = None) -> Estimate:
    """The cost of each cell: the median duration of earlier complete runs of the same
    experiment on the same model, else on the same series (other checkpoints of the same
    trained model); 0 for a cell that will be reused; ``None`` when there is no such run.
    Durations are ``ended_at - started_at`` of the runs (whole seconds, model loading not
    included).

    Args:
        cells: the sweep's cells.
        store: the run store holding the earlier runs.
        reused: the cells that will be reused (:func:`reusable`).

    Returns:
        The estimate of every cell.
    """
    by_model: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_series: dict[tuple[str, str], list[float]] = defaultdict(list)
    for run in store.runs(status="complete"):
        seconds = run.seconds
        if seconds is None:
            continue
        name = run.model_name or "-"
        by_model[run.experiment, name].append(seconds)
        series = name.rpartition(":")[0] if ":" in name else name
        by_series[run.experiment, series].append(seconds)
    out: dict[int, float | None] = {}
    for cell in cells:
        name = cell.model.name if cell.model else "-"
        series = cell.model.series if cell.model else "-"
        known = by_model.get((cell.experiment, name)) or by_series.get((cell.experiment, series))
        out[cell.index] = 0.0 if reused and cell.index in reused else (
            statistics.median(known) if known else None)
    return Estimate(out)


def local_slots(cpus: int) -> int:
    """Cells at a time on this machine with ``cpus`` CPUs each."""
    return max(1, (os.cpu_count() or 1) // cpus)


# ---- running ------------------------------------------------------------------------------

def run_sweep(spec: Spec, cells: Sequence[Cell], *, runs_dir: str | Path | None = None,
              cpus: int = 1, gpus: float = 0, address: str | None = None,
              dtype: str = "float32",
              on_progress: Callable[[Progress], None] | None = None) -> Run:
    """Run the cells of ``spec`` (from :func:`plan`) and store the sweep as a run.

    Args:
        spec: the parsed spec (kept with the run).
        cells: its cells.
        runs_dir: the run store (``--out``); every Ray node must see and write it.
        cpus: CPUs per cell (``--cpus``; also each worker's torch threads).
        gpus: GPUs per cell (``--gpus``); with any, models load on ``cuda``.
        address: ``None`` for a local Ray sized to the machine (or the Ray this process
            already runs), ``auto``, ``ray://host:port`` or ``host:port`` to join a
            cluster (checked to answer first).
        dtype: model dtype.
        on_progress: called with a :class:`Progress` whenever a cell starts or ends.

    Returns:
        The complete sweep run; cells that failed are in its ``cells`` table.

    Raises:
        WorkbenchError: Ray is missing or unreachable, or a worker cannot write the store
            (before any run exists).
        KeyboardInterrupt: Ctrl-C (or SIGTERM, which the CLI raises as one); the running
            cells and the sweep run are stored as failed.
    """
    root = paths.runs_dir(runs_dir).absolute()  # workers may start in another folder
    store = RunStore(root)
    outcomes = {c.index: Outcome(c.index, "skipped", error=c.skip) for c in cells if c.skip}
    reused = reusable(cells, store)
    outcomes.update((i, Outcome(i, "reused", run.id)) for i, run in reused.items())
    todo = [c for c in cells if c.index not in outcomes]
    fetch_bundled(todo)  # a model no worker could fetch fails the sweep before it starts
    report = on_progress or (lambda p: None)
    session = cluster.connect(address, cpus=cpus, gpus=gpus) if todo else None
    since = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        if session is not None:
            cluster.check_workers_can_write(root)
        report(_progress(len(cells), outcomes, 0))  # once nothing can refuse the sweep
        with store.start("sweep", None, spec.to_dict(), tables=TABLES, name=spec.name,
                         extra={"cpus": cpus, "gpus": gpus, "address": address}) as active:
            (active.dir / SPEC_FILE).write_text(spec.text, encoding="utf-8")
            try:
                if session is not None:
                    _schedule(todo, outcomes, len(cells), session.slots, report,
                              args=(str(root), dtype, cpus, _env(root),
                                    "cuda" if gpus else "cpu"), cpus=cpus, gpus=gpus)
            finally:  # an interrupted sweep still says what its cells did
                record_cells(active, store, cells, outcomes, since)
        return store.get(active.final)
    finally:
        if session is not None:
            cluster.disconnect(session)


def _env(root: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in cluster.ENV_PASSED if k in os.environ}
    return {**env, "WORKBENCH_RUNS_DIR": str(root)}


def _progress(total: int, outcomes: Mapping[int, Outcome], running: int) -> Progress:
    done = sum(o.status in DONE for o in outcomes.values())
    return Progress(total, done, running, len(outcomes) - done)


def _schedule(todo: Sequence[Cell], outcomes: dict[int, Outcome], total: int, slots: int,
              report: Callable[[Progress], None], *, args: tuple[Any, ...], cpus: int,
              gpus: float) -> None:
    """Run ``todo`` with at most ``slots`` cells at a time, filling ``outcomes`` as cells
    end; on Ctrl-C or SIGTERM cancel the running cells and mark the rest not run."""
    ray = cluster.import_ray()
    task = cluster.remote_cell(cpus, gpus)
    queue, running = list(todo), {}
    try:
        while queue or running:
            while queue and len(running) < slots:
                cell = queue.pop(0)
                running[task.remote(cell, *args)] = cell
            report(_progress(total, outcomes, len(running)))
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in ready:
                cell = running.pop(ref)
                outcomes[cell.index] = _collect(ray, ref, cell)
        report(_progress(total, outcomes, 0))
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (raised as one by the CLI)
        # Inside ray.wait Ray turns any KeyboardInterrupt into a plain one, so the cause
        # is named only when the exception still says it
        why = f"the sweep was interrupted{f' ({exc})' if str(exc) else ''}"
        log.warning("%s: stopping %d running cells", why, len(running))
        cancelled = _cancel(ray, running, outcomes, why)
        # said after the fact: a cell may end on its own between the signal and the cancel
        log.warning("%d cells cancelled, %d ended on their own first", cancelled,
                    len(running) - cancelled)
        for cell in queue:
            outcomes[cell.index] = Outcome(cell.index, "not run",
                                           error=f"{why} before it started")
        raise


def _collect(ray: Any, ref: Any, cell: Cell) -> Outcome:
    """The outcome of a finished task; a task that did not return one (cancelled, or its
    worker died) is a cell ``cancelled`` or ``failed`` with the reason."""
    try:
        return ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return Outcome(cell.index, "cancelled", error="cancelled: the sweep was interrupted")
    except ray.exceptions.RayError as exc:  # the worker died (killed, out of memory)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Outcome(cell.index, "failed",
                       error=f"{type(exc).__name__}: the worker running the cell died ({first})")


def _cancel(ray: Any, running: dict[Any, Cell], outcomes: dict[int, Outcome],
            why: str) -> int:
    """Interrupt the running cells (their runs are stored as failed), wait for them to end,
    then kill any that would not. A task that has already ended is not cancelled (Ray
    aborts the driver when a cancel races a task's completion).

    Returns:
        How many cells ended cancelled (the others ended on their own, with their outcome).
    """
    ended, _ = ray.wait(list(running), num_returns=len(running), timeout=0)
    for ref in running:
        if ref not in ended:
            ray.cancel(ref, force=False)
    ready, late = ray.wait(list(running), num_returns=len(running), timeout=CANCEL_GRACE)
    for ref in late:
        ray.cancel(ref, force=True)
    for ref in [*ready, *late]:
        cell = running[ref]
        outcome = None
        with contextlib.suppress(ray.exceptions.RayError):  # one that ended on its own
            outcome = ray.get(ref, timeout=0) if ref in ready else None   # keeps its outcome
        outcomes[cell.index] = outcome or Outcome(
            cell.index, "cancelled", error=f"cancelled: {why}")
    return sum(outcomes[cell.index].status == "cancelled" for cell in running.values())


# ---- the sweep's tables -------------------------------------------------------------------

def _cell_run(store: RunStore, cell: Cell, since: str) -> str:
    """The id of the run a cell left without reporting it (cancelled, or its worker died):
    the newest run of the cell's experiment, model and config started since the sweep."""
    name = cell.model.name if cell.model else None
    for run in reversed(store.runs(experiment=cell.experiment)):
        if (run.meta.started_at >= since[:19] and run.model_name == name
                and run.config == dict(cell.overrides)):
            return run.id
    return ""


def _key_columns(cell: Cell, run_id: str) -> dict[str, Any]:
    ref = cell.model
    return {"cell": cell.index, "experiment": cell.experiment,
            "model": ref.name if ref else "-", "series": ref.series if ref else "-",
            "step": -1 if ref is None or ref.step is None else ref.step,
            "tokens": -1 if ref is None or ref.tokens is None else ref.tokens,
            "seed": -1 if cell.seed is None else cell.seed,
            "grid": json.dumps(dict(cell.grid), sort_keys=True), "run_id": run_id}


def cells_table(store: RunStore, cells: Sequence[Cell], outcomes: Mapping[int, Outcome],
                since: str) -> pd.DataFrame:
    """The ``cells`` table (see :data:`workbench.harness.sweeps.tables.CELLS`).

    Args:
        store: the run store (to find the run of a cell that did not report it).
        cells: every cell of the sweep.
        outcomes: how each cell ended, by index (a missing one did not run).
        since: when the sweep started (ISO, UTC).

    Returns:
        One row per cell.
    """
    rows = []
    for cell in cells:
        out = outcomes.get(cell.index) or Outcome(cell.index, "not run",
                                                  error="the sweep ended before it started")
        run_id = out.run_id or (_cell_run(store, cell, since)
                                if out.status in ("failed", "cancelled", "not run") else "")
        status, error = out.status, out.error
        if status not in DONE and run_id and store.get(run_id).status == "complete":
            # it finished just before the sweep was stopped, and never got to report it
            status, error = "complete", ""
        rows.append({**_key_columns(cell, run_id), "status": status, "error": error,
                     "seconds": float(out.seconds),
                     "config": json.dumps(dict(cell.overrides), sort_keys=True),
                     "worker": out.pid, "loaded_model": out.loaded,
                     "peak_rss_mib": float(out.peak_rss_mb)})
    return pd.DataFrame(rows, columns=CELLS.names) if rows else CELLS.empty()


def scores_table(store: RunStore, cells: Sequence[Cell], table: pd.DataFrame) -> pd.DataFrame:
    """The ``scores`` table: each complete cell's ``head_scores`` with the cell's columns.

    Args:
        store: the run store holding the cells' runs.
        cells: every cell of the sweep.
        table: the ``cells`` table (:func:`cells_table`).

    Returns:
        The long table, declared as :data:`workbench.harness.sweeps.tables.SCORES`.
    """
    by_index = {c.index: c for c in cells}
    parts = []
    done = table[table.status.isin(["complete", "reused"])]
    for index, run_id in zip(done.cell.tolist(), done.run_id.tolist(), strict=True):
        run = store.get(run_id)
        if "head_scores" not in run.table_names():
            continue
        scores = read_table(run, "head_scores")
        if "null" not in scores.columns:
            scores = scores.assign(null=float("nan"))
        if run.meta.model is not None:  # a run written before the column: from its model
            scores = with_layer_types(scores, run.meta.model.layer_types)
        elif "layer_type" not in scores.columns:  # models the experiment trained: global
            scores = scores.assign(layer_type="global")
        keys = _key_columns(by_index[index], run_id)
        parts.append(scores[SCORES.names[len(keys):]].assign(**keys)[SCORES.names])
    if not parts:
        return SCORES.empty()
    return pd.concat(parts, ignore_index=True).astype({"null": "float64"})


def record_cells(active: Any, store: RunStore, cells: Sequence[Cell],
                 outcomes: Mapping[int, Outcome], since: str) -> None:
    """Write the sweep run's tables, its list of cell runs and its summary.

    Args:
        active: the sweep's :class:`~workbench.store.runs.ActiveRun`.
        store: the run store.
        cells: every cell of the sweep.
        outcomes: how each cell ended, by index (a missing one did not run).
        since: when the sweep started (ISO, UTC), to find the runs of cells that did
            not report back.
    """
    table = cells_table(store, cells, outcomes, since)
    active.save_table("cells", table)
    active.save_table("scores", scores_table(store, cells, table))
    counts = table.status.value_counts().to_dict()
    active.update(cells=table.run_id.tolist(), summary=[f"{len(cells)} cells: " + ", ".join(
        f"{n} {status}" for status, n in sorted(counts.items()))])


def failed_cells(run: Run) -> pd.DataFrame:
    """The cells of a sweep run that did not end well (failed, cancelled or not run)."""
    table = read_table(run, "cells")
    return table[~table.status.isin(DONE)]
