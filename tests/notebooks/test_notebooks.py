"""The tutorial notebooks in ``notebooks/``: each runs top to bottom in a real Jupyter kernel
on the bundled models, each is committed without outputs, and each has a current executed
copy in ``docs/notebooks/`` for the documentation site.

A notebook's ``parameters`` cell (tagged as papermill tags it) holds the sizes a reader
runs; the test inserts a cell after it with the smaller sizes of :data:`TEST_SIZES`, as
papermill's injected parameters do, so the suite stays within its time. The kernel's runs
go to the test's ``tmp_path``, its temporary folders to a short-lived folder of its own.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))

TEST_SIZES: dict[str, dict[str, object]] = {
    # one 8,192-token recording takes several minutes on 2 cores; 1,024 tokens show the same
    # stored form (the notebook asks for topk, which auto would not choose at this length)
    "06_long_document": {"N_TOKENS": 1024},
    "04_why_a_head_attends": {"N_PROMPTS": 2, "N_RANDOM": 3},
    "03_head_pruning": {"FIT_TOKENS": 128, "EVAL_TOKENS": 128},
    "02_attention_sinks": {"N_PROMPTS": 4, "SEQ_LEN": 32, "STREAM_TOKENS": 384, "WINDOW": 64},
    # training is the notebook's cost: 100 small steps run every cell (no phase change yet)
    "05_formation_sweep": {"STEPS": 100, "BATCH_SIZE": 8, "CHECKPOINT_EVERY": 50,
                           "SWEEP_EVERY": 50},
}
"""Parameter overrides per notebook (its file name without ``.ipynb``)."""

RECORDS_ONLY = {"06_long_document"}
"""Notebooks that store no run (a recording into a temporary folder only)."""

TIMEOUT = 900
"""Seconds a single cell may take before the test fails (on 2 cores shared with others)."""


def test_there_are_notebooks():
    assert len(PATHS) >= 6, f"expected the tutorial notebooks in {NOTEBOOKS}"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [], f"{path.name} cell {i} has outputs: clear them"
        assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_has_one_parameters_cell_first(path):
    """The parameters cell is the first code cell, so overriding it changes every use."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: expected one cell tagged 'parameters'"
    assert code[0] is tagged[0], f"{path.name}: the parameters cell must be the first code cell"
    for name in TEST_SIZES.get(path.stem, {}):
        assert f"{name} = " in tagged[0].source, f"{path.name} has no parameter {name}"


EXECUTED = NOTEBOOKS.parent / "docs" / "notebooks"
"""The executed copies that the documentation site shows (``notebooks/execute.py``)."""

PLOTLY = "application/vnd.plotly.v1+json"
STATIC = ("image/png", "image/svg+xml")


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_the_executed_copy_is_current(path):
    """The copy the site shows holds the notebook's cells as they are now, every code cell
    run without error, and every figure with a static PNG and SVG beside its Plotly form
    (which nbconvert, the site and notebook viewers do not draw)."""
    copy = EXECUTED / path.name
    assert copy.is_file(), f"no executed copy of {path.name}: make tutorials NOTEBOOKS={path.stem}"
    nb, executed = nbformat.read(path, as_version=4), nbformat.read(copy, as_version=4)
    stale = f"{copy.name} is not the notebook as it is now: make tutorials NOTEBOOKS={path.stem}"
    assert [(c.cell_type, c.source) for c in executed.cells] == [
        (c.cell_type, c.source) for c in nb.cells], stale
    figures = 0
    for i, cell in enumerate(c for c in executed.cells if c.cell_type == "code"):
        assert cell.execution_count is not None, f"{copy.name} code cell {i} was not run"
        for output in cell.outputs:
            assert output.output_type != "error", f"{copy.name} code cell {i} raised"
            data = output.get("data", {})
            if PLOTLY in data:
                figures += 1
                missing = [kind for kind in STATIC if kind not in data]
                assert not missing, f"{copy.name} code cell {i}: a figure without {missing}"
    plots = sum(c.source.count("figure(") + c.source.count("px.") + c.source.count("show_")
                for c in nb.cells if c.cell_type == "code")
    assert figures or not plots, f"{copy.name} shows no figure"


def with_test_sizes(nb: nbformat.NotebookNode, sizes: dict[str, object]
                    ) -> nbformat.NotebookNode:
    """The notebook with a cell of ``sizes`` after its parameters cell, and a first cell
    that reports which Python the kernel runs."""
    index = next(i for i, c in enumerate(nb.cells)
                 if "parameters" in c.metadata.get("tags", []))
    injected = "\n".join(f"{name} = {value!r}" for name, value in sizes.items())
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(
        injected, metadata={"tags": ["injected-parameters"]}))
    nb.cells.insert(0, nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"))
    return nb


@pytest.mark.integration
@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_runs_top_to_bottom(path, tmp_path):
    nb = with_test_sizes(nbformat.read(path, as_version=4), TEST_SIZES.get(path.stem, {}))
    # the kernel's temporary folders (recordings, Ray's session) in a short path of its own:
    # Ray's socket paths under pytest's long tmp_path pass the 107-byte limit of AF_UNIX
    scratch = Path(tempfile.mkdtemp(prefix="wb-nb-"))
    env = {**os.environ, "WORKBENCH_RUNS_DIR": str(tmp_path / "runs"), "TMPDIR": str(scratch)}
    client = NotebookClient(nb, kernel_name="python3", timeout=TIMEOUT,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute(env=env)  # a cell that raises fails the test with its traceback
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    kernel_python = nb.cells[0].outputs[0]["text"].strip()
    assert Path(kernel_python).resolve() == Path(sys.executable).resolve(), (
        f"the kernel ran {kernel_python}, not this environment's {sys.executable}")
    if path.stem not in RECORDS_ONLY:
        assert list((tmp_path / "runs").glob("*/run.json")), (
            "the notebook's runs did not go to WORKBENCH_RUNS_DIR")
