"""Hostile and broken head-mask files.

A mask file is read and checked before any model loads or run exists: each case gives
exit status 2, one ``error:`` line naming what is wrong, no traceback and no run. A NaN,
an infinity or a value outside [0, 1] never reaches a forward pass, so no recording of
NaN residuals can look complete.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.robustness.test_cli_inputs import check_refused, no_model_load  # noqa: F401 (a fixture)
from tests.tiny import cli
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.harness.experiment import run_experiment
from workbench.interventions.masks import HeadMask


def valid() -> dict:
    return HeadMask.ones(2, 4, model="tiny-llama").to_json()


def edit(**changes) -> dict:
    data = valid()
    for key, value in changes.items():
        if value is _DROP:
            data.pop(key)
        else:
            data[key] = value
    return data


_DROP = object()
ROWS = [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]


def with_value(value) -> dict:
    rows = [list(r) for r in ROWS]
    rows[1][2] = value
    return edit(mask=rows)


BAD_MASKS = [
    pytest.param([[1, 1, 1, 1], [1, 1, 1, 1]], ": expected an object, got [[1, 1, 1, 1], [1, 1, "
                 "1, 1]]", id="json-list"),
    pytest.param("zero", ': expected an object, got "zero"', id="json-string"),
    pytest.param(None, ": expected an object, got null", id="json-null"),
    pytest.param(7, ": expected an object, got 7", id="json-number"),
    pytest.param({}, "mask.json has no 'format'", id="empty-object"),
    pytest.param(edit(format="something-else"), "'format': expected 'workbench-heads-mask', "
                 'got "something-else"', id="wrong-format"),
    pytest.param(edit(mask=_DROP), "mask.json has no 'mask'", id="missing-mask"),
    pytest.param(edit(n_layers=_DROP, n_heads=_DROP), "mask.json has no 'n_layers'",
                 id="missing-sizes"),
    pytest.param(edit(mask=[["1", "1", "1", "1"], ["1", "1", "1", "1"]]),
                 "'mask.0.0': expected a valid number, got \"1\"", id="string-values"),
    pytest.param(with_value(True), "'mask.1.2': expected a valid number, got true",
                 id="boolean-value"),
    pytest.param(with_value(None), "'mask.1.2': expected a valid number, got null",
                 id="null-value"),
    pytest.param(with_value([1.0]), "'mask.1.2': expected a valid number, got [1.0]",
                 id="nested-value"),
    pytest.param(with_value(math.nan), "'mask.1.2': expected a finite number, got NaN",
                 id="nan"),
    pytest.param(with_value(math.inf), "'mask.1.2': expected a finite number, got Infinity",
                 id="infinity"),
    pytest.param(with_value(-math.inf), "'mask.1.2': expected a finite number, got -Infinity",
                 id="minus-infinity"),
    pytest.param(with_value(1.5), "'mask.1.2': expected at most 1.0, got 1.5", id="above-one"),
    pytest.param(with_value(-0.1), "'mask.1.2': expected at least 0.0, got -0.1",
                 id="below-zero"),
    pytest.param(with_value(10**400), "'mask.1.2': expected a finite number, got 1000000",
                 id="huge-integer"),
    pytest.param(edit(mask=[[1, 1, 1, 1], [1, 1, 1]]), "'mask' row 1 must hold n_heads = 4 "
                 "values, got 3 values", id="ragged-rows"),
    pytest.param(edit(mask=[1, [1, 1, 1, 1]]), "'mask.0': expected a valid array, got 1",
                 id="row-not-a-list"),
    pytest.param(edit(mask=[[1, 1, 1, 1]] * 3), "'mask' must be a list of n_layers = 2 rows, "
                 "got 3 rows", id="too-many-rows"),
    pytest.param(edit(mask="all ones"), "'mask': expected a valid array, got \"all ones\"",
                 id="mask-not-a-list"),
    pytest.param(edit(n_layers=-2), "'n_layers': expected at least 1, got -2",
                 id="negative-layers"),
    pytest.param(edit(n_heads=0), "'n_heads': expected at least 1, got 0", id="zero-heads"),
    pytest.param(edit(n_heads=4.0), "'n_heads': expected a valid integer, got 4.0",
                 id="float-size"),
    pytest.param(edit(n_layers="2"), "'n_layers': expected a valid integer, got \"2\"",
                 id="string-size"),
    pytest.param(edit(n_layers=True), "'n_layers': expected a valid integer, got true",
                 id="boolean-size"),
    pytest.param(edit(ablation="shuffle"), "'ablation': expected 'zero', 'mean' or "
                 "'resample', got \"shuffle\"", id="unknown-ablation"),
    pytest.param(edit(ablation=["zero"]), "'ablation': expected 'zero', 'mean' or "
                 "'resample', got [\"zero\"]", id="ablation-not-a-string"),
    pytest.param(edit(ablation="mean", reference="poems"), "the mean ablation's reference "
                 "'poems' is not a prompt set; known prompt sets: ", id="mean-unknown-reference"),
    pytest.param(edit(reference=3), "'reference': expected a valid string, got 3",
                 id="reference-not-a-string"),
    pytest.param(edit(model=["tiny-llama"]), "'model': expected a valid string, got "
                 '["tiny-llama"]', id="model-not-a-string"),
    pytest.param(edit(extra=[1]), "'extra': expected an object, got [1]",
                 id="extra-not-an-object"),
    pytest.param(edit(colour="red"), "mask.json has an unknown field 'colour'",
                 id="unknown-field"),
]


@pytest.mark.parametrize("data, message", BAD_MASKS)
@pytest.mark.usefixtures("no_model_load")
def test_bad_mask_file_on_record(capsys, runs_dir, llama_folder, tmp_path, data, message):
    path = tmp_path / "mask.json"
    path.write_text(json.dumps(data))
    result = cli(capsys, "record", str(llama_folder), "--text", "the cat sat", "--heads-mask",
                 str(path))
    check_refused(result, 2, message, runs_dir)
    assert f"head mask {path}" in result[2]  # says which file


@pytest.mark.parametrize("content, message", [
    pytest.param(b'{"format": ', "cannot read head mask", id="not-json"),
    pytest.param(b"\xff\xfe\x00{", "cannot read head mask", id="not-utf8"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "cannot read head mask", id="nested-too-deep"),
    pytest.param(b"[" + b"1" * 5000 + b"]", "cannot read head mask", id="integer-too-long"),
    pytest.param(None, "cannot read head mask", id="missing-file"),
])
@pytest.mark.usefixtures("no_model_load")
def test_unreadable_mask_file(capsys, runs_dir, llama_folder, tmp_path, content, message):
    path = tmp_path / "mask.json"
    if content is not None:
        path.write_bytes(content)
    result = cli(capsys, "record", str(llama_folder), "--text", "hi", "--heads-mask", str(path))
    check_refused(result, 2, f"{message} {path}", runs_dir)


@pytest.mark.usefixtures("no_model_load")
def test_mask_folder_instead_of_file(capsys, runs_dir, llama_folder, tmp_path):
    result = cli(capsys, "record", str(llama_folder), "--text", "hi", "--heads-mask",
                 str(tmp_path))
    check_refused(result, 2, f"head mask {tmp_path} is not a regular file", runs_dir)


@pytest.mark.parametrize("data, message", [
    pytest.param(edit(ablation="mean", reference="poems"), "reference 'poems' is not a prompt set",
                 id="mean-unknown-reference"),
    pytest.param(with_value(math.nan), "'mask.1.2': expected a finite number, got NaN", id="nan"),
])
@pytest.mark.usefixtures("no_model_load")
def test_bad_mask_file_on_run(capsys, runs_dir, llama_folder, tmp_path, data, message):
    path = tmp_path / "mask.json"
    path.write_text(json.dumps(data))
    result = cli(capsys, "run", "head-overview", "--model", str(llama_folder), "--heads-mask",
                 str(path))
    check_refused(result, 2, message, runs_dir)


def test_mask_of_another_shape_is_refused_before_a_run(capsys, runs_dir, llama_folder, tmp_path):
    path = HeadMask.ones(3, 4, model="other").save(tmp_path / "mask.json")
    result = cli(capsys, "record", str(llama_folder), "--text", "hi", "--heads-mask", str(path))
    check_refused(result, 2, "head mask is 3 layers x 4 heads (made for other)", runs_dir)


# ---- masks built in Python: the same rules --------------------------------------------------

@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1.01, -1e-6],
                         ids=["nan", "inf", "-inf", "above-one", "below-zero"])
def test_mask_values_outside_unit_interval_are_refused(value):
    values = torch.ones(2, 4)
    values[1, 3] = value
    with pytest.raises(WorkbenchError, match=r"layer 1, head 3 is .*must be a number in \[0, 1\]"):
        HeadMask(values)


def test_unit_interval_masks_are_accepted():
    values = torch.tensor([[0.0, 0.5, 1.0, 0.25], [1.0, 1.0, 0.0, 0.0]])
    assert HeadMask(values).removed() == [(0, 0), (1, 2), (1, 3)]
    grad = torch.ones(2, 4, requires_grad=True)  # gradient importance differentiates it
    assert HeadMask(grad).shape == (2, 4)


def test_round_trip_keeps_every_field(tmp_path):
    mask = HeadMask.ones(2, 4, ablation="mean", reference="natural", model="m", note="n",
                         extra={"k": 1}).without([(1, 1)])
    back = HeadMask.load(mask.save(tmp_path / "m.json"))
    assert back.to_json() == mask.to_json()


def test_mean_mask_with_unknown_reference_creates_no_run(runs_dir, llama):
    mask = HeadMask.for_model(llama, ablation="mean", reference="poems").without([(0, 1)])
    with pytest.raises(UnknownNameError, match="reference 'poems' is not a prompt set"):
        run_experiment("head-overview", llama, {"n_boot": 5}, heads_mask=mask)
    assert not runs_dir.exists() or not any(runs_dir.rglob("run.json"))
