"""Every benchmark script still runs: each one's smoke mode on the tiny Llama, so a script
that no longer imports or whose parts no longer fit the library fails here (the figures
themselves are measured by running the scripts, not by tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = {
    "recording.py": ["--smoke", "--model", "{model}"],
    "long_context.py": ["--smoke", "--model", "{model}"],
    "bf16.py": ["--smoke", "--models", "{model}", "--dtypes", "bfloat16"],
    "defaults.py": ["--smoke", "{model}"],
    "qk_attribution.py": ["--smoke", "{model}"],
    "patching.py": ["--smoke", "{model}"],
    "sweep.py": ["--smoke", "{model}"],
    "models.py": ["--smoke"],
    "live.py": ["--smoke", "--model", "{model}"],
    "compare_stores.py": ["--smoke", "{model}"],
    "losses.py": ["--smoke", "{model}"],
    "store_scale.py": ["--smoke", "{model}"],
    "gpu.py": ["--smoke"],
    "circuit.py": ["--smoke", "--model", "{model}", "--keys", "dog", "--values", "on,the"],
}
"""Each script's smallest run: its arguments, ``{model}`` the tiny model's folder."""


def test_every_benchmark_has_a_smoke_run():
    assert {p.name for p in (ROOT / "benchmarks").glob("*.py")} == set(SMOKE)


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_benchmark_runs_at_its_smallest_size(script, llama_folder, tmp_path):
    argv = [a.format(model=llama_folder) for a in SMOKE[script]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_RUNS_DIR": str(tmp_path / "runs"),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *argv],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip()


def test_compare_stores_names_each_difference_and_only_those():
    import importlib.util

    import numpy as np
    import pandas as pd

    from workbench.store.schema import current_metric_names

    spec = importlib.util.spec_from_file_location("compare_stores",
                                                  ROOT / "benchmarks" / "compare_stores.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    before = pd.DataFrame({"layer": [1, 0], "metric": ["sink", "self"], "score": [0.5, np.nan],
                           "holds": [None, True], "gone": [1, 2]})
    after = pd.DataFrame({"layer": [0, 1], "metric": ["self_attention", "first_token"],
                          "score": [np.nan, 0.75], "holds": [True, None], "new": [3, 4]})
    lines = compare.compare_tables(current_metric_names(before), current_metric_names(after),
                                   atol=0.0)
    # rows aligned by layer and metric (old metric names read as the registered ones, as
    # Run.table, through which the script reads, gives them),
    # NaN equal to NaN and None to None: only the columns and the one score differ
    assert lines == ["column 'gone' only before", "column 'new' only after",
                     "column 'score': max abs difference 0.25"]
    assert compare.compare_tables(before, before, atol=0.0) == []
    assert compare.compare_tables(before, before.iloc[:1], atol=0.0)[-1] == "2 rows before, 1 after"
