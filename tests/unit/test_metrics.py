"""The head-metric registry: one declaration per metric, old names read as new, unknown
names refused with the known ones listed."""

from __future__ import annotations

import ast
import inspect
import typing
from dataclasses import dataclass

import pandas as pd
import pytest

from experiments.qk_attribution import Metric as QkMetric
from experiments.qk_attribution.measure import METRIC_SOURCES
from workbench.core.errors import UnknownNameError
from workbench.core.paths import REPO_ROOT
from workbench.harness.experiment import experiment, run_experiment
from workbench.recording.reductions import BlockReduction
from workbench.scores import metrics, patterns
from workbench.store.runs import RunStore
from workbench.store.schema import LEGACY_METRIC_NAMES, Table, columns, tables


def _pattern_functions() -> dict[str, object]:
    """Every pattern metric of ``patterns``: each is a block-wise reduction, ``(pattern,
    ctx)`` to one number per prompt and head."""
    return dict(inspect.getmembers(patterns, lambda fn: isinstance(fn, BlockReduction)))


def test_every_pattern_function_is_registered_under_its_own_name():
    functions = _pattern_functions()
    assert {"first_token", "self_attention", "induction"} <= set(functions)
    registered = {name: m.reduction for name, m in metrics.METRICS.items()
                  if m.kind == "pattern"}
    assert registered == functions
    for metric in (metrics.get(name) for name in metrics.METRICS):
        assert metric.meaning and metric.null and metric.source, metric.name
        assert (metric.reduction is not None) == (metric.kind == "pattern"), metric.name


def test_old_names_are_not_registered_and_name_what_they_became():
    for old, new in LEGACY_METRIC_NAMES.items():
        assert old not in metrics.METRICS and new in metrics.METRICS
        with pytest.raises(UnknownNameError, match=f"'{old}' \\(the old name of '{new}'\\); "
                                                   "known head metrics: copying, "):
            metrics.get(old)
    with pytest.raises(UnknownNameError, match="unknown head metric 'inducton' \\(did you mean "
                                               "'induction'"):
        metrics.check_known(["entropy", "inducton"])


def test_the_old_name_require_still_checks_names_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="use check_known"):
        metrics.require(["entropy"])
    with pytest.warns(DeprecationWarning), pytest.raises(UnknownNameError, match="inducton"):
        metrics.require(["inducton"])


def test_reductions_are_the_pattern_functions_and_nothing_else():
    assert metrics.reductions("first_token", "previous_token") == {
        "first_token": patterns.first_token, "previous_token": patterns.previous_token}
    with pytest.raises(ValueError, match="'copying' is a ov metric"):
        metrics.reductions("copying")


ICL_ESTIMATORS = {"icl_score", "icl_score_window"}
"""The ``metric`` column of induction-heads' ``icl`` table: whole-model scores."""


def _compared_metric_names() -> set[str]:
    """Every string the code compares a ``.metric`` column with (``df.metric == "x"``)."""
    names = set()
    for folder in ("workbench", "experiments", "dashboards"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare) and getattr(node.left, "attr", "") == "metric":
                    names |= {c.value for c in node.comparators
                              if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


def test_every_metric_name_the_code_selects_by_is_registered():
    named = _compared_metric_names()
    assert {"first_token", "induction"} <= named
    metrics.check_known(named - ICL_ESTIMATORS)


def test_qk_attribution_head_kinds_are_registered_pattern_metrics():
    assert list(METRIC_SOURCES) == list(typing.get_args(QkMetric))
    assert all(metrics.get(name).kind == "pattern" for name in METRIC_SOURCES)


HEADS = Table("head_scores", "scores", columns(
    ("layer", "int", "layer"), ("head", "int", "head"), ("metric", "str", "which score"),
    ("score", "float", "the score")))
CURVE = Table("curve", "a metric column that names no head metric", columns(
    ("metric", "str", "which loss"), ("value", "float", "its value")))


def test_a_table_written_with_old_names_reads_back_with_the_registered_ones(tmp_path):
    store = RunStore(tmp_path)
    old = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0],
                        "metric": ["sink", "self", "entropy"], "score": [0.5, 0.25, 1.0]})
    curve = pd.DataFrame({"metric": ["heldout_loss"], "value": [2.0]})
    with store.start("exp", None, {}, tables=tables(HEADS, CURVE)) as run:
        run.save_table("head_scores", old)
        run.save_table("curve", curve)
    read = store.get(run.id)
    assert read.table("head_scores").metric.tolist() == ["first_token", "self_attention",
                                                         "entropy"]
    pd.testing.assert_frame_equal(read.table("head_scores").drop(columns="metric"),
                                  old.drop(columns="metric"))
    pd.testing.assert_frame_equal(read.table("curve"), curve)


@dataclass(frozen=True)
class _Cfg:
    pass


@dataclass
class _Unregistered:
    def tables(self) -> dict[str, pd.DataFrame]:
        return {"head_scores": pd.DataFrame({"layer": [0], "head": [0], "metric": ["sink"],
                                             "score": [1.0]})}

    def summary(self) -> list[str]:
        return []


@experiment("test-unregistered-metric", config=_Cfg, tables=tables(HEADS), needs_model=False)
def _run(model, cfg, ctx=None):
    return _Unregistered()


def test_a_run_with_an_unregistered_metric_fails_and_says_which(tmp_path):
    with pytest.raises(UnknownNameError, match="unknown head metric 'sink'"):
        run_experiment("test-unregistered-metric", None, runs_dir=tmp_path)
    (failed,) = RunStore(tmp_path).runs()
    assert failed.status == "failed" and "head_scores" not in failed.table_names()
