"""The circuit experiment on the tiny Llama: its tables against their declarations and
the library, and its refusals before any model loads."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.core.errors import ConfigError, ModelCapabilityError, WorkbenchError
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import get, run_experiment

WORDS = {"names": "and dog on sat the", "places": "dog", "objects": "sat"}
"""The tiny tokenizer's only words that are one token with their leading space."""


@pytest.mark.parametrize("task", ["ioi", "induction"])
def test_circuit_tables_on_the_tiny_llama(llama, runs_dir, task):
    cfg = {**WORDS, "task": task, "n_prompts": 4, "templates": 2, "seq_len": 5, "steps": 2,
           "n_exact": 5, "n_boot": 50, "fractions": [0.05, 0.2, 1.0]}
    run = run_experiment("circuit", llama, cfg, runs_dir=runs_dir)
    edges, nodes = run.table("edges"), run.table("nodes")
    curve, scores = run.table("faithfulness"), run.table("scores").set_index("name").value
    assert len(edges) == 82 and sorted(edges["rank"]) == list(range(1, 83))
    assert edges.exact.notna().sum() == 5
    assert set(edges[edges.exact.notna()]["rank"]) == {1, 2, 3, 4, 5}
    assert list(curve.fraction) == [0.05, 0.2, 1.0] and curve.faithfulness.iloc[-1] == 1.0
    assert np.isclose(nodes.score_out.sum(), edges.score.sum())
    assert np.isclose(nodes[nodes.node == "logits"].score_in.iloc[0],
                      edges[edges.receiver == "logits"].score.sum())
    # the empty circuit ablated to the corrupted outputs is the corrupted run
    assert scores["metric_empty"] == pytest.approx(scores["metric_corrupted"], abs=1e-4)


def test_refusals_before_a_model_loads():
    exp = get("circuit")
    with pytest.raises((ConfigError, WorkbenchError)) as err:
        apply_overrides(exp.config, {"fractions": [0.5, 1.5]})
    assert "\n" not in str(err.value)
    with pytest.raises((ConfigError, WorkbenchError)) as err:
        apply_overrides(exp.config, {"fractions": [0.0, 0.5]})
    assert "(0, 1]" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        apply_overrides(exp.config, {"steps": 0})
    assert "steps" in str(err.value) and "\n" not in str(err.value)


def test_an_encoder_is_refused(bert, runs_dir):
    with pytest.raises(ModelCapabilityError):
        run_experiment("circuit", bert, {}, runs_dir=runs_dir)
