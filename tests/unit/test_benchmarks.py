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
