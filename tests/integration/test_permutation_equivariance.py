"""Permutation equivariance on the bundled models: every expected outcome, per model.

Each test runs every check on every layer of one prompt of 24 tokens under one permutation
seed (the demo configuration has two of each); the tolerances are the experiment's own,
stated in advance.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from experiments.permutation_equivariance import DEMO
from workbench.harness.experiment import run_experiment
from workbench.store.runs import RunStore

SMALL = {**DEMO, "n_prompts": 1, "seeds": (0,)}
"""The demo configuration on one prompt and one seed: every condition, layer and shift."""

EXPECTED = {
    "smollm2": {
        ("attention sublayer", "no positions, no mask"): "pass",
        ("attention sublayer", "no positions, causal mask"): "pass",
        ("attention sublayer", "no positions, causal mask, prefix permutation"): "pass",
        ("attention sublayer", "RoPE, no mask"): "pass",
        ("attention sublayer", "RoPE, causal mask, prefix permutation"): "pass",
        ("whole model", "as trained"): "pass",
        ("whole model", "position embeddings zeroed"): "n/a",
        ("whole model", "RoPE removed"): "pass",
        ("whole model", "RoPE removed, no mask"): "pass",
        ("whole model", "RoPE removed, prefix permutation"): "pass",
        ("whole model", "as trained, prefix permutation"): "pass",
        ("whole model", "position ids + c"): "pass",
        ("whole model", "position ids + c, float64 RoPE angles"): "pass",
        ("whole model", "position ids + c, learned positions"): "n/a",
        ("attention heads", "query heads moved across kv groups (control)"): "pass",
    },
    "minilm": {
        ("attention sublayer", "no positions, no mask"): "pass",
        ("attention sublayer", "no positions, causal mask"): "pass",
        ("attention sublayer", "RoPE, no mask"): "n/a",
        ("whole model", "as trained"): "pass",
        ("whole model", "position embeddings zeroed"): "pass",
        ("whole model", "RoPE removed"): "n/a",
        ("whole model", "position ids + c"): "n/a",
        ("whole model", "position ids + c, learned positions"): "pass",
        ("attention heads", "permuted with W_O slices (weights)"): "pass",
        ("attention heads", "query heads moved across kv groups (control)"): "n/a",
    },
}


@pytest.fixture(scope="module")
def results(smollm2, minilm, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    return {m.info.name: run_experiment("permutation-equivariance", m, SMALL, runs_dir=runs)
            for m in (smollm2, minilm)}


@pytest.mark.parametrize("model", ["smollm2", "minilm"])
def test_every_check_meets_its_expectation(results, model):
    run = results[model]
    verdicts = run.table("verdicts")
    measured = verdicts[verdicts.verdict != "n/a"]
    assert set(measured.verdict) == {"pass"}, measured[measured.verdict != "pass"].to_string()
    for (component, condition), want in EXPECTED[model].items():
        rows = verdicts[(verdicts.component == component) & (verdicts.condition == condition)]
        assert len(rows) and set(rows.verdict) >= {want}, (component, condition)
    cases = run.table("equivariance")
    n_layers = run.meta.model.n_layers
    sub = cases[cases.condition == "no positions, no mask"]
    assert sorted(sub.layer.unique()) == list(range(n_layers))  # every layer
    assert sub.max_rel_error.max() < 1e-5


def test_rope_shift_is_invariant_up_to_1000_and_learned_positions_are_not(results):
    rope = results["smollm2"].table("verdicts")
    shifted = rope[rope.condition == "position ids + c"].set_index("shift")
    assert list(shifted.index) == [1, 10, 100, 1000]
    assert (shifted.max_rel_error < 1e-4).all()
    learned = results["minilm"].table("verdicts")
    shifted = learned[learned.condition == "position ids + c, learned positions"].set_index("shift")
    assert (shifted.loc[[1, 10, 100], "min_rel_error"] > 1e-2).all()
    assert shifted.loc[1000, "verdict"] == "n/a" and "beyond" in shifted.loc[1000, "note"]


def test_runs_from_the_command_line(runs_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "--quiet", "run", "permutation-equivariance",
         "--model", "minilm", "--set", "n_prompts=1", "--set", "seeds=0",
         "--set", "layers=0,5"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    run = RunStore(runs_dir).get(proc.stdout.strip().splitlines()[-1])
    assert run.status == "complete"
    assert "checks as expected" in run.meta.summary[0]
    assert set(run.table("equivariance").query("layer >= 0").layer) == {0, 5}
