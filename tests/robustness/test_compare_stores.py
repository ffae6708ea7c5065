"""``benchmarks/compare_stores.py`` reads both stores through the store's guarded readers:
a FIFO does not block it, a damaged ``run.json`` or table is named (exit 1) rather than a
traceback, a run folder linked in from outside is not read, and a store that is missing,
a file or empty, or a tolerance that is negative or not finite, is refused in one
``error:`` line (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from workbench.core.paths import REPO_ROOT
from workbench.inputs.prompts import Prompt
from workbench.recording import zarr_store
from workbench.recording.writer import record
from workbench.store import provenance
from workbench.store.runs import RUN_JSON, RunStore
from workbench.store.schema import Table, columns, tables

SCRIPT = REPO_ROOT / "benchmarks" / "compare_stores.py"
TABLES = tables(Table("t", "one score per layer", columns(("layer", "int", "a layer"),
                                                           ("x", "float", "a score"))))
TEXTS = ["the cat sat on the mat", "a quick brown fox"]


def make_store(root: Path, llama, xs: list[float], texts: list[str]) -> Path:
    """A store with one complete run: table ``t`` (score ``xs`` by layer) and a recording
    of ``texts``."""
    with RunStore(root).start("exp", llama.info, {"n": 2}, tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"layer": range(len(xs)), "x": xs}))
        record(llama, [Prompt(text=t) for t in texts], run.dir / "recording",
               store_dtype="float32")
    return root / run.id


@pytest.fixture(scope="module")
def pristine(llama, tmp_path_factory):
    """Three stores: ``before``, ``same`` (made the same way) and ``changed`` (one score
    0.25 higher, and a recording of one more prompt)."""
    base = tmp_path_factory.mktemp("compare")
    with pytest.MonkeyPatch.context() as patch:  # skip torch and git lookups
        patch.setattr(provenance, "collect",
                      lambda: {"versions": {}, "git": None, "machine": None})
        make_store(base / "before", llama, [0.5, 1.0], TEXTS)
        make_store(base / "same", llama, [0.5, 1.0], TEXTS)
        make_store(base / "changed", llama, [0.5, 1.25], [*TEXTS, "bread is made from flour"])
    return base


@pytest.fixture
def stores(pristine, tmp_path):
    """Copies of the three stores, free to damage."""
    for name in ("before", "same", "changed"):
        shutil.copytree(pristine / name, tmp_path / name, symlinks=True)
    return tmp_path


def only_run(store: Path) -> Path:
    [run] = [p for p in store.iterdir() if not p.name.startswith(".")]
    return run


def compare(*args: str | Path) -> tuple[int, list[str], str]:
    """Run the script; its exit status, stdout lines and stderr. A read that blocks fails
    the test at the timeout instead of hanging it."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.returncode, proc.stdout.strip().splitlines(), proc.stderr


def lead(llama) -> str:
    return f"exp on {llama.info.name}"


# ---- what it reads, it compares ------------------------------------------------------------

def test_two_stores_made_the_same_way_are_the_same(stores, llama):
    assert compare(stores / "before", stores / "same")[:2] == (0, [f"{lead(llama)}: the same"])


def test_each_difference_is_named_and_atol_forgives_only_values(stores, llama):
    status, out, _ = compare(stores / "before", stores / "changed")
    assert status == 0
    # the hand-made differences: score 1.0 -> 1.25; every array one prompt longer
    assert out[0] == f"{lead(llama)}: t: column 'x': max abs difference 0.25"
    n = llama.info.n_layers
    arrays = [f"attn/L{layer:03d}" for layer in range(n)] \
        + [f"resid/B{boundary:03d}" for boundary in range(n + 1)]
    assert [line.split(": shape")[0] for line in out[1:]] \
        == [f"{lead(llama)}: array recording/{name}" for name in arrays]
    assert all(": shape (2, " in line and " before, (3, " in line for line in out[1:])
    status, out_atol, _ = compare(stores / "before", stores / "changed", "--atol", "0.3")
    assert status == 0 and out_atol == out[1:]  # the score is within it, a shape never


# ---- what the store's readers refuse is not read -------------------------------------------

def test_a_fifo_zarr_json_is_refused_without_blocking(stores, llama):
    recording = only_run(stores / "same") / "recording"
    meta = recording / zarr_store.GROUP / "attn" / "L000" / "zarr.json"
    meta.unlink()
    os.mkfifo(meta)  # opening it would block until a writer came
    status, out, _ = compare(stores / "before", stores / "same")
    assert status == 1
    assert out == [f"{lead(llama)}: not compared: {recording}/index.json file: {meta} is not "
                   "a regular file"]


def test_a_damaged_run_json_is_named_not_a_traceback(stores, llama):
    damaged = stores / "same" / "20990101-000000-exp-tiny-dead"
    shutil.copytree(only_run(stores / "same"), damaged)
    (damaged / RUN_JSON).write_text('{"run_id": "20990101-000000-exp-tiny-dead", "stat')
    status, out, _ = compare(stores / "before", stores / "same")
    assert status == 1
    assert out[0].startswith(f"after: run {damaged.name} is damaged (")
    assert out[1:] == [f"{lead(llama)}: the same"]  # the intact pair is still compared


def test_a_table_changed_after_its_run_is_named_not_compared(stores, llama):
    table = only_run(stores / "same") / "t.parquet"
    good = pd.read_parquet(table)
    good.assign(x=good.x + 100).to_parquet(table)  # it no longer matches run.json's SHA-256
    status, out, _ = compare(stores / "before", stores / "same")
    assert status == 1 and len(out) == 1
    assert out[0].startswith(f"{lead(llama)}: not compared: checksum mismatch for {table}")


def test_a_run_folder_linked_in_from_outside_is_not_read(stores, llama):
    # the changed run, made newer than every other, linked into the store that is the same:
    # followed, it would be the pair's newest run and its differences would show
    outside = only_run(stores / "changed")
    meta = json.loads((outside / RUN_JSON).read_text())
    meta["started_at"] = "2099-01-01T00:00:00+00:00"
    (outside / RUN_JSON).write_text(json.dumps(meta))
    (stores / "same" / outside.name).symlink_to(outside, target_is_directory=True)
    assert compare(stores / "before", stores / "same")[:2] == (0, [f"{lead(llama)}: the same"])
    assert compare(stores / "before", stores / "changed")[1] != [f"{lead(llama)}: the same"]


# ---- bad input: one line, exit 2 -----------------------------------------------------------

def _file(root: Path) -> Path:
    (root / "a-file").write_text("not a store")
    return root / "a-file"


def _empty(root: Path) -> Path:
    (root / "empty").mkdir()
    return root / "empty"


def _only_linked(root: Path) -> Path:
    (root / "linked").mkdir()
    (root / "linked" / "run").symlink_to(only_run(root / "same"), target_is_directory=True)
    return root / "linked"


BAD_STORES = {
    "missing": (lambda root: root / "nowhere", "does not exist"),
    "a-file": (_file, "is not a folder"),
    "empty": (_empty, "no complete run in"),
    "only-a-linked-run": (_only_linked, "no complete run in"),
}


@pytest.mark.parametrize("make, said", BAD_STORES.values(), ids=BAD_STORES)
def test_a_store_that_is_not_one_is_refused_in_one_line(stores, make, said):
    status, out, err = compare(stores / "before", make(stores))
    assert (status, out) == (2, []) and err.count("\n") == 1
    assert err.startswith("error: ") and said in err


@pytest.mark.parametrize("atol", ["nan", "inf", "-1e-9", "lots"])
def test_a_tolerance_that_is_not_a_finite_number_at_least_0_is_refused(stores, atol):
    status, out, err = compare(stores / "before", stores / "changed", f"--atol={atol}")
    assert (status, out) == (2, [])
    assert err == f"error: --atol must be a finite number >= 0, got {atol!r}\n"
