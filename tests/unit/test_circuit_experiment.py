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
    _per_prompt_tables_average_to_the_aggregates(run, n_prompts=4)
    _the_claim_check_reads_the_prompts(run)


def _the_claim_check_reads_the_prompts(run) -> None:
    """``empty_circuit_is_corrupted_run`` passes on the run, fails where one prompt's empty
    circuit is moved by a tenth of the gap, and asks nothing of a mean-ablated run."""
    from unittest import mock

    from experiments.circuit.checks import empty_circuit_is_corrupted_run

    measured = empty_circuit_is_corrupted_run(run, threshold=1e-3)
    assert measured.outcome == "pass" and measured.value is not None
    assert measured.value <= 1e-3
    metric = run.table("metric_by_prompt")
    gap = abs(metric.clean.mean() - metric.corrupted.mean())
    moved = metric.assign(empty=metric["empty"] + np.where(metric.prompt == 2, gap / 10, 0.0))
    with mock.patch("experiments.circuit.checks.read_table", return_value=moved):
        measured = empty_circuit_is_corrupted_run(run, threshold=1e-3)
    assert measured.outcome == "fail" and measured.value == pytest.approx(0.1, rel=1e-3)
    with mock.patch.dict(run.meta.config, {"ablation": "mean"}):
        assert empty_circuit_is_corrupted_run(run).outcome == "undecided"


def _per_prompt_tables_average_to_the_aggregates(run, n_prompts: int) -> None:
    """``metric_by_prompt``'s means are ``scores``' metrics, and the curve's faithfulness is
    made of ``faithfulness_by_prompt``'s means over the same prompts."""
    scores = run.table("scores").set_index("name").value
    metric = run.table("metric_by_prompt")
    assert list(metric.prompt) == list(range(n_prompts)) and metric.tokens.is_unique
    for column in ("clean", "empty", "corrupted"):
        assert metric[column].mean() == pytest.approx(scores[f"metric_{column}"], rel=1e-9,
                                                      abs=1e-12)
    curve = run.table("faithfulness").set_index("fraction")
    by_prompt = run.table("faithfulness_by_prompt")
    assert len(by_prompt) == n_prompts * len(curve)
    assert set(zip(by_prompt.prompt, by_prompt.tokens, strict=True)) == set(
        zip(metric.prompt, metric.tokens, strict=True))
    means = by_prompt.groupby("fraction").metric.mean()
    sizes = by_prompt.groupby("fraction").n_edges.unique()
    assert all(list(sizes[f]) == [curve.n_edges[f]] for f in curve.index)
    full, empty = metric["clean"].mean(), metric["empty"].mean()
    np.testing.assert_allclose(((means - empty) / (full - empty)).loc[curve.index].to_numpy(),
                               curve.faithfulness.to_numpy(), rtol=1e-9, atol=1e-12)


def test_compare_pairs_two_circuit_runs_by_prompt(llama, runs_dir):
    """Two runs of the same prompts, edges outside a circuit ablated two ways: compare
    pairs both per-prompt tables prompt by prompt, with p-values; the corrupted input's
    metric does not depend on the ablation, so it differs by exactly 0."""
    from workbench.harness.compare import compare

    cfg = {"task": "induction", "n_prompts": 4, "seq_len": 3, "method": "eap", "n_exact": 0,
           "n_boot": 20, "fractions": [0.2, 1.0]}
    a = run_experiment("circuit", llama, cfg, runs_dir=runs_dir)
    b = run_experiment("circuit", llama, {**cfg, "ablation": "mean"}, runs_dir=runs_dir)
    _per_prompt_tables_average_to_the_aggregates(b, n_prompts=4)
    result = compare(a, b)
    rows = result.differences
    for table in ("metric_by_prompt", "faithfulness_by_prompt"):
        mine = rows[rows.table == table]
        assert len(mine) and (mine.pairing == "same prompts").all()
        assert mine.p.notna().all() and (mine.n_prompts == 4).all()
    assert set(rows[rows.table == "faithfulness_by_prompt"].key) == {"fraction=0.2",
                                                                    "fraction=1.0"}
    metric = rows[rows.table == "metric_by_prompt"].set_index("column")
    assert metric.difference["corrupted"] == 0 and metric.p["corrupted"] == 1
    assert metric.difference["empty"] != 0  # mean outputs, not the corrupted ones
    assert not any("per-prompt" in note for note in result.notes)


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
