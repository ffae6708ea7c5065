"""Every table and recording of one run store against another's, column by column: what
a change of the workbench changed in its results.

Runs are paired by kind and model (the newest complete run of each pair in each store, so
two ``workbench demo`` stores made before and after a change pair up). For each pair the
script reads every Parquet table with pandas and every recording array with Zarr directly,
not through the workbench's readers, so the comparison does not trust the code it
compares; metric names stored before the metric registry (``sink``, ``self``) are read as
the registered ones, as every reader does. It prints one line per difference:

- a config field that differs, is new or is gone;
- a table or a column in one store only;
- a different row count;
- for a shared column, the largest absolute difference of a numeric column (rows aligned
  by the shared non-float columns, sorted) or the number of rows that differ in another.

Values within ``--atol`` (default 0: exactly equal) are the same; NaN equals NaN. The exit
status is 0 either way: the output is the list to explain.

Usage:
    python benchmarks/compare_stores.py BEFORE_STORE AFTER_STORE [--atol 1e-6]
    python benchmarks/compare_stores.py --smoke MODEL_FOLDER   # the tests' tiny run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

LEGACY_METRIC_NAMES = {"sink": "first_token", "self": "self_attention"}
"""As ``workbench.store.schema.LEGACY_METRIC_NAMES`` (written out: this script reads the
stores without the workbench)."""


def complete_runs(store: Path) -> dict[tuple[str, str], Path]:
    """The newest complete run folder of each (kind, model) in ``store``."""
    found: dict[tuple[str, str], Path] = {}
    for meta_path in sorted(store.glob("*/run.json")):
        meta = json.loads(meta_path.read_text())
        if meta.get("status") != "complete":
            continue
        model = meta.get("model") or {}
        name = model.get("name", "") if isinstance(model, dict) else str(model)
        found[(meta.get("experiment") or meta.get("kind", ""), name)] = meta_path.parent
    return found


def compare_configs(before: Path, after: Path) -> list[str]:
    """The config fields of two runs that differ, are new or are gone."""
    old = json.loads((before / "run.json").read_text()).get("config") or {}
    new = json.loads((after / "run.json").read_text()).get("config") or {}
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


def _renamed(frame: pd.DataFrame) -> pd.DataFrame:
    if "metric" in frame.columns:
        return frame.assign(metric=frame.metric.replace(LEGACY_METRIC_NAMES))
    return frame


def _arrays(folder: Path) -> dict[str, np.ndarray]:
    import zarr

    arrays: dict[str, np.ndarray] = {}
    for meta in sorted(folder.rglob("zarr.json")):
        if json.loads(meta.read_text()).get("node_type") != "array":
            continue  # a group
        node = meta.parent
        stored = zarr.open_array(str(node), mode="r")
        arrays[str(node.relative_to(folder))] = np.asarray(stored[...])
    return arrays


def compare_runs(before: Path, after: Path, atol: float) -> list[str]:
    """Every difference between two runs of the same kind and model."""
    lines = compare_configs(before, after)
    old = {p.relative_to(before).as_posix(): p for p in before.rglob("*.parquet")}
    new = {p.relative_to(after).as_posix(): p for p in after.rglob("*.parquet")}
    lines += [f"{name}: only before" for name in sorted(old.keys() - new.keys())]
    lines += [f"{name}: only after" for name in sorted(new.keys() - old.keys())]
    for name in sorted(old.keys() & new.keys()):
        said = compare_tables(_renamed(pd.read_parquet(old[name])),
                              _renamed(pd.read_parquet(new[name])), atol)
        lines += [f"{name}: {line}" for line in said]
    a, b = _arrays(before), _arrays(after)
    lines += [f"array {name}: only before" for name in sorted(a.keys() - b.keys())]
    lines += [f"array {name}: only after" for name in sorted(b.keys() - a.keys())]
    for name in sorted(a.keys() & b.keys()):
        if a[name].shape != b[name].shape:
            lines.append(f"array {name}: shape {a[name].shape} before, {b[name].shape} after")
            continue
        said = _column_difference(pd.Series(a[name].ravel()), pd.Series(b[name].ravel()), atol)
        if said:
            lines.append(f"array {name}: {said}")
    return lines


def compare_stores(before: Path, after: Path, atol: float) -> list[str]:
    """Every difference between the paired runs of two stores, each line led by its run."""
    old, new = complete_runs(before), complete_runs(after)
    lines = [f"{kind} on {model}: only before" for kind, model in sorted(old.keys() - new.keys())]
    lines += [f"{kind} on {model}: only after" for kind, model in sorted(new.keys() - old.keys())]
    for key in sorted(old.keys() & new.keys()):
        said = compare_runs(old[key], new[key], atol)
        lines += [f"{key[0]} on {key[1]}: {line}" for line in said] or \
            [f"{key[0]} on {key[1]}: the same"]
    return lines


def _smoke(model: str) -> list[str]:
    """Two stores of the same small run on ``model``: every table and array the same."""
    with tempfile.TemporaryDirectory() as tmp:
        stores = [Path(tmp) / "before", Path(tmp) / "after"]
        for store in stores:
            env = {**os.environ, "WORKBENCH_RUNS_DIR": str(store)}
            subprocess.run([sys.executable, "-m", "workbench", "run", "head-overview",
                            "--model", model, "--set", "n_boot=10"],
                           env=env, check=True, stdout=subprocess.DEVNULL)
        lines = compare_stores(*stores, atol=0.0)
    if any(not line.endswith(": the same") for line in lines) or not lines:
        raise SystemExit("two identical runs differ:\n" + "\n".join(lines))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="*", metavar="STORE", help="BEFORE_STORE AFTER_STORE")
    parser.add_argument("--atol", type=float, default=0.0,
                        help="the largest absolute difference counted as the same")
    parser.add_argument("--smoke", metavar="MODEL", help="compare two runs of MODEL")
    args = parser.parse_args()
    if args.smoke:
        lines = _smoke(args.smoke)
    elif len(args.stores) == 2:
        lines = compare_stores(Path(args.stores[0]), Path(args.stores[1]), args.atol)
    else:
        parser.error("give BEFORE_STORE and AFTER_STORE, or --smoke MODEL")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
