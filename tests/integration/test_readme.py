"""Every Python block of the README runs as written, in order, in one namespace (a later
block uses the ``model`` and ``ids`` of the tour), on the real bundled models.

Two things differ from a reader's session, both for isolation: the run store is a fresh
temporary folder (``WORKBENCH_RUNS_DIR``) and the tour's recording folder ``/tmp/rec`` is
replaced by a fresh temporary folder, so that the test never writes outside its own space
and a second run does not find the first run's recording there. A block that names a
placeholder for the reader to fill in (``<sweep-run-id>``) cannot run as written: it is
only compiled, and the test names it so that the list stays short.
"""

from __future__ import annotations

import re

from tests.unit.test_readme import blocks

PLACEHOLDER = re.compile(r"<[a-z][a-z-]*>")

TEMPLATES = {"data/runs/<sweep-run-id>/scores.parquet"}
"""The placeholders a block may hold (each needs a run the reader made)."""


def test_every_python_block_runs(tmp_path, monkeypatch, runs_dir):
    monkeypatch.chdir(tmp_path)  # mask.save("prune.json") writes here
    rec = tmp_path / "rec"
    found = blocks("python")
    assert len(found) >= 3
    namespace: dict = {}
    for start, text in found:
        code = compile(text.replace('"/tmp/rec"', repr(str(rec))), f"README.md:{start}", "exec")
        if PLACEHOLDER.search(text):
            named = set(re.findall(r"[\w/.-]*<[a-z][a-z-]*>[\w/.-]*", text))
            assert named <= TEMPLATES, f"README.md:{start}: a block that cannot run: {named}"
            continue
        exec(code, namespace)
    # what the tour says it shows, checked against its own definitions
    model = namespace["model"]
    assert namespace["seen"]["L3"].shape == (1, model.info.n_heads, len(namespace["ids"]),
                                             len(namespace["ids"]))
    assert (rec / "index.json").is_file() and list(runs_dir.glob("*/run.json"))
