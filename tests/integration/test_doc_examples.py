"""Every Python block of the README and of every page of the documentation site runs as
written, page by page: a page's blocks in order, in one namespace of their own (a later
block of the tour uses the ``model`` and ``ids`` of an earlier one), on the real bundled
models.

Two things differ from a reader's session, both for isolation: the run store is a fresh
temporary folder (``WORKBENCH_RUNS_DIR``) and the recording folder ``/tmp/rec`` is
replaced by a fresh temporary folder for each page, so that the test never writes outside
its own space and a second run does not find the first run's recording there. A block
that names a placeholder for the reader to fill in (``<sweep-run-id>``) cannot run as
written: it is only compiled, and the test names it so that the list stays short.
"""

from __future__ import annotations

import re

import pytest

from tests.unit.test_doc_examples import PAGES, blocks, page_name

PLACEHOLDER = re.compile(r"<[a-z][a-z-]*>")

TEMPLATES = {"data/runs/<sweep-run-id>/scores.parquet"}
"""The placeholders a block may hold (each needs a run the reader made)."""

WITH_PYTHON = [page for page in PAGES if blocks("python", page)]
TOUR = {"README.md", "docs/getting-started.md"}
"""The pages that hold the five-minute tour, whose results are checked below."""


def test_the_pages_with_python_are_found():
    names = {page_name(page) for page in WITH_PYTHON}
    assert TOUR | {"docs/recordings.md", "docs/experiments/ioi.md"} <= names
    assert sum(len(blocks("python", page)) for page in WITH_PYTHON) >= 8


@pytest.mark.parametrize("page", WITH_PYTHON, ids=page_name)
def test_every_python_block_of_a_page_runs(page, tmp_path, monkeypatch, runs_dir):
    monkeypatch.chdir(tmp_path)  # mask.save("prune.json") writes here
    rec = tmp_path / "rec"
    namespace: dict = {}
    for start, text in blocks("python", page):
        where = f"{page_name(page)}:{start}"
        code = compile(text.replace('"/tmp/rec"', repr(str(rec))), where, "exec")
        if PLACEHOLDER.search(text):
            named = set(re.findall(r"[\w/.-]*<[a-z][a-z-]*>[\w/.-]*", text))
            assert named <= TEMPLATES, f"{where}: a block that cannot run: {named}"
            continue
        exec(code, namespace)
    if page_name(page) in TOUR:
        # what the tour says it shows, checked against its own definitions
        model = namespace["model"]
        assert namespace["seen"]["L3"].shape == (1, model.info.n_heads, len(namespace["ids"]),
                                                 len(namespace["ids"]))
        assert (rec / "index.json").is_file() and list(runs_dir.glob("*/run.json"))
