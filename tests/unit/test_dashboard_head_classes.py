"""The head classes marked on a heatmap: exactly the heads whose q is at most the rate."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from dashboards.components import head_classes
from dashboards.components.values import Refused, check
from workbench.scores import classes

# 2 layers x 3 heads, two classes, q written by hand (one head untested: q is NaN)
Q = {"induction": [0.001, 0.02, 0.04, 0.2, np.nan, 0.009],
     "previous-token": [0.5, 0.03, 0.6, 0.7, 0.8, 0.9]}
HEADS = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def table(fdr: float = 0.05) -> pd.DataFrame:
    rows = [{"layer": layer, "head": head, "head_class": name, "score": 1.0 - i / 10,
             "q": q[i], "fdr": fdr, "in_class": bool(q[i] <= fdr)}
            for name, q in Q.items() for i, (layer, head) in enumerate(HEADS)]
    return pd.DataFrame(rows)


def run_with(frame: pd.DataFrame | None) -> SimpleNamespace:
    names = [] if frame is None else ["head_scores", "head_classes"]
    # a kind that declares no tables: the frame holds only the columns the heatmap reads
    return SimpleNamespace(id="r1", experiment="a-stand-in", table_names=lambda: names,
                           table=lambda name: frame, meta=SimpleNamespace(
                               tables={n: SimpleNamespace(rows=len(frame)) for n in names}))


def marked(fig: go.Figure) -> set[tuple[int, int]]:
    marks = fig.data[-1]
    return {(int(y), int(x)) for x, y in zip(marks.x, marks.y, strict=True)}


def test_at_rate_keeps_exactly_the_heads_with_q_at_most_the_rate():
    at = classes.at_rate(table(), 0.01)
    inside = at[at.in_class]
    assert sorted(zip(inside.head_class, inside.layer, inside["head"], strict=True)) == [
        ("induction", 0, 0), ("induction", 1, 2)]
    assert (at.fdr == 0.01).all()
    # no rate: the declared one, and the stored in_class back
    assert classes.at_rate(table(), None).in_class.tolist() == table().in_class.tolist()


def test_the_heatmap_marks_the_class_at_the_rate_and_says_how_many():
    for rate, want in ((None, {(0, 0), (0, 1), (0, 2), (1, 2)}), (0.03, {(0, 0), (0, 1),
                                                                     (1, 2)}),
                       (1.0, {(0, 0), (0, 1), (0, 2), (1, 0), (1, 2)})):
        fig = go.Figure(go.Heatmap(z=np.zeros((2, 3))))
        line = head_classes.mark(fig, run_with(table()), "induction", rate)
        assert marked(fig) == want
        by_head = dict(zip(HEADS, Q["induction"], strict=True))
        assert list(fig.data[-1].customdata) == [by_head[(int(y), int(x))] for x, y in
                                                 zip(fig.data[-1].x, fig.data[-1].y,
                                                     strict=True)]
        assert line.startswith(f"induction heads at FDR {rate or 0.05:g}: {len(want)} of 6 ")
    fig = go.Figure(go.Heatmap(z=np.zeros((2, 3))))
    line = head_classes.mark(fig, run_with(table()), "previous-token", 0.01)
    assert marked(fig) == set()
    assert line == "previous-token heads at FDR 0.01: none of 6 (smallest q 0.03)"


def test_a_run_without_classes_marks_nothing_and_says_so():
    fig = go.Figure(go.Heatmap(z=np.zeros((2, 3))))
    line = head_classes.mark(fig, run_with(None), "induction", 0.05)
    assert len(fig.data) == 1
    assert line.startswith("run r1 has no head_classes table")


def test_the_class_shown_follows_the_metric_when_one_tests_it():
    names = head_classes.class_names(table())
    assert names == ["induction", "previous-token"]
    assert head_classes.default_class(names, "previous_token", "induction") == "previous-token"
    assert head_classes.default_class(names, "entropy", "previous-token") == "previous-token"
    assert head_classes.default_class(names, "first_token", None) == "induction"
    assert head_classes.default_class([], "induction", None) is None
    # a page that outlines only the shown metric's class: none for a metric without one
    assert head_classes.default_class(names, "previous_token", None,
                                      any_class=False) == "previous-token"
    assert head_classes.default_class(names, "next_token", "previous-token",
                                      any_class=False) is None


def test_the_rate_is_a_number_in_the_unit_interval_and_the_class_a_known_name():
    assert check("fdr", head_classes.Rate, 1) == 1.0
    for bad in (0, -0.1, 1.5, "0.05", True):
        with pytest.raises(Refused, match="fdr: expected a number from 1e-06 to 1"):
            check("fdr", head_classes.Rate, bad)
    with pytest.raises(Refused, match=r"head class: expected one of .*'induction'"):
        check("head class", head_classes.ClassName, "inductoin")
