"""The types dashboard callbacks declare for their inputs (dashboards/components/values.py):
what each accepts from a browser, what it refuses, and the one line that says so."""

from __future__ import annotations

import math
from typing import Annotated

import pytest

from dashboards.components import values
from dashboards.components.messages import safe
from dashboards.components.values import (
    MAX_INDEX,
    Click,
    Fields,
    HeadName,
    JsonPair,
    ListOf,
    OneOf,
    Real,
    Records,
    Refused,
    RunId,
    Text,
    Whole,
    Zoom,
    among,
    below,
    cell_of,
    check,
    declared,
    shown,
)

NOT_WHOLE = [True, False, 1.0, 10.0, 1.5, math.nan, math.inf, -math.inf, "1", [1], {"a": 1}]


@pytest.mark.parametrize("value", NOT_WHOLE)
def test_a_whole_number_is_an_int_and_nothing_else(value):
    with pytest.raises(Refused, match=rf"^layer: expected a whole number 0\.\.{MAX_INDEX}, "):
        Whole().check("layer", value)


@pytest.mark.parametrize(("spec", "value", "ok"), [
    (Whole(), 0, True), (Whole(), MAX_INDEX, True), (Whole(), MAX_INDEX + 1, False),
    (Whole(), -1, False), (Whole(1, 5), 5, True), (Whole(1, 5), 0, False),
    (Whole(1, 5), 6, False)])
def test_a_whole_number_is_within_its_bounds(spec, value, ok):
    if ok:
        assert spec.check("k", value) == value
    else:
        with pytest.raises(Refused):
            spec.check("k", value)


def test_none_is_a_control_not_yet_set_unless_the_spec_says_otherwise():
    assert Whole().check("layer", None) is None
    assert Text().check("run id", None) is None
    with pytest.raises(Refused, match=r"^pooling: expected one of 'max', 'sum', got null$"):
        OneOf(("max", "sum"), optional=False).check("pooling", None)


@pytest.mark.parametrize(("value", "ok"), [(0, True), (1, True), (0.25, True), (1.5, False),
                                           (math.nan, False), (math.inf, False),
                                           (True, False), ("0.5", False), (None, True)])
def test_a_real_number_is_finite_and_a_whole_number_is_one(value, ok):
    # JavaScript sends a dropdown's 1.0 back as 1: a whole number is a real number here
    if ok:
        got = Real(0, 1).check("budget", value)
        assert got is None if value is None else (got == value and isinstance(got, float))
    else:
        with pytest.raises(Refused, match=r"^budget: expected a number from 0 to 1, got "):
            Real(0, 1).check("budget", value)


@pytest.mark.parametrize("value", ["x" * 201, "a\nb", "tab\there", "nul\x00", "sep\u2028",
                                   "para\u2029", 5, ["x"], {"x": 1}, True])
def test_text_is_one_bounded_line(value):
    with pytest.raises(Refused, match=r"^run id: expected text of at most 200 characters on one "
                                      r"line, got "):
        Text().check("run id", value)


@pytest.mark.parametrize("value", ["x" * 200, "", "run-20260101 é ∑", "../../etc/passwd"])
def test_text_of_any_content_passes_to_the_store_to_judge(value):
    assert Text().check("run id", value) == value


def test_a_list_and_an_object_check_their_parts():
    rows = ListOf(Whole(optional=False), 1)
    assert rows.check("selected", [3]) == [3]
    for bad in ([0, 1], [None], ["0"], (0,), 0):
        with pytest.raises(Refused, match=r"^selected: expected a list of at most 1 of: "):
            rows.check("selected", bad)
    head = Fields((("layer", Whole(optional=False)), ("head", Whole(optional=False))))
    assert head.check("selected", {"layer": 1, "head": 2}) == {"layer": 1, "head": 2}
    for bad in ({"layer": 1}, {"layer": 1, "head": 2, "x": 0}, {"layer": 1.0, "head": 2}, []):
        with pytest.raises(Refused):
            head.check("selected", bad)
    cell = Fields((("row", Whole(optional=False)),), extra=True)
    assert cell.check("cell", {"row": 2, "column": 1, "column_id": "x"}) == {"row": 2}


def test_rows_are_objects_whatever_their_cells():
    assert Records().check("rows", [{"run": 5}, {}]) == [{"run": 5}, {}]
    for bad in ([1], [[]], {"run": "x"}, "rows"):
        with pytest.raises(Refused):
            Records().check("rows", bad)
    with pytest.raises(Refused):
        Records(max_rows=2).check("rows", [{}, {}, {}])


@pytest.mark.parametrize(("click", "cell"), [
    ({"points": [{"x": 2, "y": 1, "z": 0.3, "curveNumber": 0}]}, (1, 2)),
    ({"points": [{"x": 2.9, "y": 0.1}]}, (0, 2)),  # a grid in units of cells
    ({"points": [{"x": 0, "y": 0}, {"x": 5, "y": 5}]}, (0, 0)),  # the first point
])
def test_a_click_on_a_grid_reads_its_layer_and_head(click, cell):
    assert Click(cell_of, "a click").check("click", click) == cell


@pytest.mark.parametrize("click", [{}, {"points": []}, {"points": [5]}, [{"x": 0, "y": 0}],
                                   {"points": [{"x": "1", "y": 0}]},
                                   {"points": [{"x": -1, "y": 0}]},
                                   {"points": [{"x": math.nan, "y": 0}]},
                                   {"points": [{"x": 1e12, "y": 0}]},
                                   {"points": [{"x": True, "y": 0}]},
                                   {"points": [{"y": 0}]}])
def test_a_click_anywhere_else_is_refused(click):
    with pytest.raises(Refused, match=r"^click: expected a click, got "):
        Click(cell_of, "a click").check("click", click)


def test_a_zoom_reads_its_box_and_ignores_other_layout_changes():
    box = {"xaxis.range[0]": 1, "xaxis.range[1]": 9.5, "yaxis.range[0]": 0,
           "yaxis.range[1]": 4, "dragmode": "zoom"}
    assert Zoom().check("zoom", box) == (1.0, 9.5, 0.0, 4.0)
    assert Zoom().check("zoom", {"autosize": True}) is None
    assert Zoom().check("zoom", {"xaxis.autorange": True, "yaxis.autorange": True}) is None
    for bad in ({**box, "xaxis.range[0]": "1"}, {**box, "yaxis.range[1]": math.inf}, [box]):
        with pytest.raises(Refused):
            Zoom().check("zoom", bad)


@pytest.mark.parametrize(("value", "head"), [("L0H1", (0, 1)), ("L12H30", (12, 30))])
def test_a_head_name_reads_its_layer_and_head(value, head):
    assert HeadName().check("head", value) == head


@pytest.mark.parametrize("value", ["H1L0", "L0H", "L-1H0", "l0h1", "L0H1 ", "L" + "9" * 10 + "H0",
                                   ["L0H1"], 5])
def test_anything_else_is_not_a_head_name(value):
    with pytest.raises(Refused, match=r"^head: expected a head such as 'L0H1', got "):
        HeadName().check("head", value)


def test_a_json_pair_is_two_lines_of_text():
    assert JsonPair().check("choice", '["run", "head_scores"]') == ("run", "head_scores")
    for bad in ("not json", '["run"]', '["run", 5]', '["a", "b", "c"]', '{"a": "b"}',
                '["a\\nb", "t"]', ["run", "t"]):
        with pytest.raises(Refused):
            JsonPair().check("choice", bad)


@pytest.mark.parametrize(("value", "text"), [
    ("x", '"x"'), (1.5, "1.5"), (math.nan, "NaN"), (math.inf, "Infinity"), (True, "true"),
    (None, "null"), ([0], "[0]"), ({"a": 1}, '{"a": 1}'), ("a\nb\x00", '"a\\nb\\u0000"'),
    ("<br>", '"\\u003cbr\\u003e"')])
def test_a_value_is_shown_as_the_client_sent_it_on_one_line(value, text):
    assert shown(value) == text


def test_a_long_value_is_shortened():
    text = shown("x" * 500)
    assert len(text) == 60 and text.endswith("…") and text.startswith('"xxx')


def test_a_value_beyond_the_data_is_refused_in_the_same_words():
    assert below("layer", 1, 2, "layers") == 1
    with pytest.raises(Refused, match=r"^layer: expected 0\.\.1 \(2 layers\), got 2$"):
        below("layer", 2, 2, "layers")
    with pytest.raises(Refused, match=r"^prompt: expected nothing \(0 prompts\), got 0$"):
        below("prompt", 0, 0, "prompts")
    assert among("metric", "a", ["a", "b"], "the run's metrics") == "a"
    with pytest.raises(Refused, match=r'^metric: expected one of the run\'s metrics '
                                      r'\("a", "b"\), got "c"$'):
        among("metric", "c", ["a", "b"], "the run's metrics")


def test_check_takes_a_declared_type_or_a_spec():
    assert check("run", RunId, "abc") == "abc"
    with pytest.raises(Refused, match=r"^run: expected text"):
        check("run", RunId, 5)
    assert check("k", Whole(1, 3), 2) == 2


def test_a_callback_declares_every_parameter_or_fails_at_import():
    def draw(run_id: RunId, top_k: Annotated[int | None, Whole(1, 50)], input_: RunId):
        return run_id, top_k, input_

    labels = [label for label, _ in declared(draw)]
    assert labels == ["run id", "top k", "input"]

    def undeclared(run_id: RunId, layer: int | None):
        return run_id, layer

    def variadic(*args: RunId):
        return args

    for fn in (undeclared, variadic):
        with pytest.raises(TypeError, match="callback"):
            safe(fn)


def test_checked_values_are_what_the_callback_receives():
    specs = declared(lambda_like)
    assert values.checked(specs, ["run", {"points": [{"x": 1, "y": 0}]}]) == ["run", (0, 1)]
    with pytest.raises(Refused, match=r"^expected 2 values, got 1$"):
        values.checked(specs, ["run"])


def lambda_like(run_id: RunId, click: values.ClickedHead):
    return run_id, click
