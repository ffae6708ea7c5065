"""Every table and recording of one run store against another's, column by column: what
a change of the workbench changed in its results.

Runs are paired by kind and model (the newest complete run of each pair in each store, so
two ``workbench demo`` stores made before and after a change pair up). Both stores are read
through the store's own guarded readers (:class:`~workbench.store.runs.RunStore`,
:meth:`Run.table <workbench.store.runs.Run.table>`,
:class:`~workbench.recording.reader.Recording`), which check what they serve and change no
value: a table is its Parquet file re-hashed against ``run.json``, an array its stored
chunks. So a FIFO, a symlink out of the store or a run folder linked in from outside is
never read, and a damaged ``run.json``, table or recording is named, not compared. Metric
names stored before the metric registry (``sink``, ``self``) are read as the registered
ones, as every reader does. It prints one line per difference:

- a config field that differs, is new or is gone;
- a table, a recording, a column or an array in one store only;
- a different row count;
- for a shared column, the largest absolute difference of a numeric column (rows aligned
  by the shared non-float columns, sorted) or the number of rows that differ in another.

Values within ``--atol`` (default 0: exactly equal) are the same; NaN equals NaN. The exit
status is 0 when everything was compared, differences or not (the output is the list to
explain); 1 when something could not be read (a damaged run, table or recording: its line
says what); 2 for bad input (a store that is missing, not a folder or holds no complete
run; a tolerance that is negative or not a finite number), refused in one ``error:`` line.

Usage:
    python benchmarks/compare_stores.py BEFORE_STORE AFTER_STORE [--atol 1e-6]
    python benchmarks/compare_stores.py --smoke MODEL_FOLDER   # the tests' tiny run
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import numpy as np
import pandas as pd

from workbench.core.errors import WorkbenchError
from workbench.harness.verify import stored_files
from workbench.recording.reader import Recording
from workbench.store.runs import INCOMPLETE, Run, RunStore

Pair = tuple[str, str]
"""A run's experiment and model name."""


def open_store(text: str) -> RunStore:
    """The run store at ``text``: a folder holding at least one complete run.

    Raises:
        WorkbenchError: no such folder, a file or something else that is not a folder, or
            no complete run in it.
    """
    path = Path(text).expanduser()
    if not path.exists():
        raise WorkbenchError(f"no run store at {text}: it does not exist")
    if not path.is_dir():
        raise WorkbenchError(f"{text} is not a folder; a run store is a folder of runs")
    store = RunStore(path.resolve())  # the path given may be a link; nothing inside it is
    runs = store.runs()
    if not any(r.status == "complete" for r in runs):
        held = f" (its {len(runs)} runs: none complete)" if runs else ""
        raise WorkbenchError(f"no complete run in {text}{held}: nothing to compare")
    return store


def tolerance(text: str) -> float:
    """``--atol`` as a number.

    Raises:
        WorkbenchError: not a finite number, or negative.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise WorkbenchError(f"--atol must be a finite number >= 0, got {text!r}")
    return value


def complete_runs(store: RunStore) -> tuple[dict[Pair, Run], list[Run]]:
    """The newest complete run of each (kind, model) in ``store``, and its damaged runs
    (those of ``.incomplete/`` left out: one may be a run another version is writing)."""
    found: dict[Pair, Run] = {}
    damaged = []
    for run in store.runs():  # oldest first, so the newest of a pair stays
        if run.status == "complete":
            found[(run.experiment, run.model_name or "")] = run
        elif run.status == "damaged" and run.path.parent.name != INCOMPLETE:
            damaged.append(run)
    return found, damaged


def compare_configs(before: Run, after: Run) -> list[str]:
    """The config fields of two runs that differ, are new or are gone."""
    old, new = before.config, after.config
    lines = [f"config {k}: {old[k]!r} before, {new[k]!r} after"
             for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
    lines += [f"config {k}: only before ({old[k]!r})" for k in sorted(old.keys() - new.keys())]
    lines += [f"config {k}: only after ({new[k]!r})" for k in sorted(new.keys() - old.keys())]
    return lines


def _aligned(before: pd.DataFrame, after: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    shared = [c for c in before.columns if c in after.columns]
    # sortable keys: the columns whose every value is a string, an integer or a bool
    keys = [c for c in shared
            if before[c].map(lambda v: isinstance(v, (str, int, bool, np.integer))).all()]
    if keys:
        before = before.sort_values(keys, kind="stable")
        after = after.sort_values(keys, kind="stable")
    return before[shared].reset_index(drop=True), after[shared].reset_index(drop=True)


def _column_difference(a: pd.Series, b: pd.Series, atol: float) -> str | None:
    if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
        x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
        both_nan = np.isnan(x) & np.isnan(y)
        diff = np.where(both_nan, 0.0, np.abs(x - y))
        if np.isnan(diff).any():
            return "NaN in one store only"
        worst = float(diff.max()) if diff.size else 0.0
        return None if worst <= atol else f"max abs difference {worst:.3g}"
    # missing values (None, NaN) are one value, equal to each other
    differ = int((a.astype(str).fillna("<missing>") != b.astype(str).fillna("<missing>")).sum())
    return None if differ == 0 else f"{differ} of {len(a)} rows differ"


def compare_tables(before: pd.DataFrame, after: pd.DataFrame, atol: float) -> list[str]:
    """The differences of one table: columns in one only, row count, then each column."""
    lines = [f"column {c!r} only before" for c in before.columns if c not in after.columns]
    lines += [f"column {c!r} only after" for c in after.columns if c not in before.columns]
    if len(before) != len(after):
        return [*lines, f"{len(before)} rows before, {len(after)} after"]
    a, b = _aligned(before, after)
    for column in a.columns:
        said = _column_difference(a[column], b[column], atol)
        if said:
            lines.append(f"column {column!r}: {said}")
    return lines


def recordings(run: Run) -> dict[str, Path]:
    """The recordings of a run (every folder holding an ``index.json``, symlinks not
    followed), by their path inside the run folder."""
    return {held.path.relative_to(run.path).as_posix(): held.path
            for held in stored_files(run.path) if held.kind == "recording"}


def compare_recordings(before: Path, after: Path, atol: float) -> list[str]:
    """The differences of two recordings, array by array, each line led by the array's
    name in its recording (``attn/L000``, ``resid/B000``, ...)."""
    a, b = Recording.open(before), Recording.open(after)
    old, new = set(a.array_names()), set(b.array_names())
    lines = [f"{name}: only before" for name in sorted(old - new)]
    lines += [f"{name}: only after" for name in sorted(new - old)]
    for name in sorted(old & new):
        x, y = a.array(name), b.array(name)  # one pair at a time: a recording can be large
        if x.shape != y.shape:
            lines.append(f"{name}: shape {x.shape} before, {y.shape} after")
            continue
        said = _column_difference(pd.Series(x.ravel()), pd.Series(y.ravel()), atol)
        if said:
            lines.append(f"{name}: {said}")
    return lines


def compare_runs(before: Run, after: Run, atol: float) -> list[str]:
    """Every difference between two runs of the same kind and model.

    Raises:
        WorkbenchError: a table or recording of either that the store's readers refuse
            (the message names the file).
    """
    lines = compare_configs(before, after)
    old, new = set(before.table_names()), set(after.table_names())
    lines += [f"{name}: only before" for name in sorted(old - new)]
    lines += [f"{name}: only after" for name in sorted(new - old)]
    for name in sorted(old & new):
        said = compare_tables(before.table(name), after.table(name), atol)
        lines += [f"{name}: {line}" for line in said]
    a, b = recordings(before), recordings(after)
    lines += [f"recording {name}: only before" for name in sorted(a.keys() - b.keys())]
    lines += [f"recording {name}: only after" for name in sorted(b.keys() - a.keys())]
    for name in sorted(a.keys() & b.keys()):
        said = compare_recordings(a[name], b[name], atol)
        lines += [f"array {name}/{line}" for line in said]
    return lines


def compare_stores(before: RunStore, after: RunStore, atol: float) -> tuple[list[str], int]:
    """Every difference between the paired runs of two stores, each line led by its run.

    Returns:
        The lines, and how many of them say that something could not be read (a damaged
        run, or a pair whose table or recording the store's readers refuse).
    """
    (old, old_damaged), (new, new_damaged) = complete_runs(before), complete_runs(after)
    lines = [f"{side}: run {run.id} is damaged ({_first_line(run.meta.error)}); not compared"
             for side, damaged in (("before", old_damaged), ("after", new_damaged))
             for run in damaged]
    unreadable = len(lines)
    lines += [f"{kind} on {model}: only before" for kind, model in sorted(old.keys() - new.keys())]
    lines += [f"{kind} on {model}: only after" for kind, model in sorted(new.keys() - old.keys())]
    for key in sorted(old.keys() & new.keys()):
        lead = f"{key[0]} on {key[1]}"
        try:
            said = compare_runs(old[key], new[key], atol)
        except (WorkbenchError, OSError) as exc:  # ChecksumError included
            lines.append(f"{lead}: not compared: {_first_line(str(exc))}")
            unreadable += 1
            continue
        lines += [f"{lead}: {line}" for line in said] or [f"{lead}: the same"]
    return lines, unreadable


def _first_line(text: str | None) -> str:
    return (text or "no reason recorded").strip().splitlines()[0]


def _smoke(model: str) -> list[str]:
    """Two stores of the same small run on ``model``: every table and array the same."""
    with tempfile.TemporaryDirectory() as tmp:
        stores = [Path(tmp) / "before", Path(tmp) / "after"]
        for store in stores:
            env = {**os.environ, "WORKBENCH_RUNS_DIR": str(store)}
            subprocess.run([sys.executable, "-m", "workbench", "run", "head-overview",
                            "--model", model, "--set", "n_boot=10"],
                           env=env, check=True, stdout=subprocess.DEVNULL)
        lines, _ = compare_stores(*map(RunStore, stores), atol=0.0)
    if any(not line.endswith(": the same") for line in lines) or not lines:
        raise SystemExit("two identical runs differ:\n" + "\n".join(lines))
    return lines


def _refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="*", metavar="STORE", help="BEFORE_STORE AFTER_STORE")
    parser.add_argument("--atol", default="0", help="the largest absolute difference counted "
                        "as the same (a finite number >= 0; default 0)")
    parser.add_argument("--smoke", metavar="MODEL", help="compare two runs of MODEL")
    args = parser.parse_args()
    if args.smoke:
        print("\n".join(_smoke(args.smoke)))
        return
    if len(args.stores) != 2:
        _refuse("give BEFORE_STORE and AFTER_STORE, or --smoke MODEL")
    try:
        atol = tolerance(args.atol)
        before, after = (open_store(text) for text in args.stores)
    except WorkbenchError as exc:
        _refuse(str(exc))
    lines, unreadable = compare_stores(before, after, atol)
    print("\n".join(lines))
    if unreadable:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
