"""Sweep specs fuzzed: dicts built from the ``Spec`` record's own fields (right and wrong
shapes for every key, nested sections, unknown keys), the same dicts written as TOML, and
arbitrary TOML text, through ``parse_text`` / ``parse_spec`` / ``expand`` and through
``workbench sweep SPEC --dry-run``.

Properties: a spec is either expanded or refused with a ``WorkbenchError`` of one line
(never another exception, never a traceback at the command line); expansion never gives
more than ``MAX_CELLS`` cells, nor two cells that are one run; the count of a spec's cells
is the product of its lists, and a spec is refused exactly when that passes the bound;
nothing is ever written to the run store. No Ray is started, and the hub is offline.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import typing

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.robustness.test_cli_inputs import stored
from tests.tiny import cli
from workbench.core.errors import WorkbenchError
from workbench.harness.experiment import get
from workbench.harness.sweeps.spec import (
    MAX_CELLS,
    CellSpec,
    ExperimentSection,
    Spec,
    SpecError,
    count_cells,
    expand,
    parse_spec,
    parse_text,
)
from workbench.models import reference

EXPERIMENTS = ["previous-token-heads", "head-overview", "induction-heads",
               "induction-formation", "permutation-equivariance"]
"""Registered experiments (with and without a model, seed or causal requirement)."""
MODELS = ["minilm", "smollm2", "smollm", "./no-such-folder", "no-run/L*:*", "no-run/L1:5",
          "nobody/no-such-model", "x:y", ""]
"""Bundled models, and names the plan must refuse quickly (no weights are ever read)."""
FIELDS = sorted({f.name for name in EXPERIMENTS for f in dataclasses.fields(get(name).config)})
"""Config field names of those experiments."""

# ---- values of any TOML shape ----------------------------------------------------------------

_keys = st.text(max_size=8)
_scalars = st.one_of(
    st.booleans(), st.integers(min_value=-3, max_value=300), st.integers(),
    st.floats(allow_subnormal=False), st.text(max_size=12),
    st.dates(), st.times(), st.datetimes(timezones=st.none() | st.just(datetime.UTC)))
toml_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner,
                                                                         max_size=4),
    max_leaves=10)
"""Anything a TOML value can be: scalars, dates and times, arrays and tables of them."""


def _either(right: st.SearchStrategy) -> st.SearchStrategy:
    """The right shape for a key most of the time, any TOML value otherwise."""
    return st.one_of(right, right, toml_values)


_field = st.sampled_from(FIELDS) | st.text(max_size=6)
_field_value = st.one_of(st.integers(min_value=-2, max_value=64), st.sampled_from(
    ["corpus", "natural", "8", "demo"]), st.lists(st.integers(0, 5), max_size=3), toml_values)
_set = st.dictionaries(_field, _field_value, max_size=3)
_grid = st.dictionaries(_field, st.lists(_field_value, min_size=0, max_size=3), max_size=3)
_names = st.lists(st.sampled_from(EXPERIMENTS) | st.text(max_size=6), max_size=3)
_models = st.lists(st.sampled_from(MODELS), max_size=3)
_seeds = st.lists(st.integers(min_value=-1, max_value=4) | st.integers(), max_size=3)

FIELD_SHAPES: dict[str, st.SearchStrategy] = {
    "name": st.text(max_size=20),
    "experiments": _names,
    "models": _models,
    "seeds": _seeds,
    "config": st.sampled_from(["default", "demo", "fast"]),
    "steps_every": st.integers(min_value=-1, max_value=200),
    "set": _set,
    "grid": _grid,
    "by_experiment": st.dictionaries(
        st.sampled_from(EXPERIMENTS) | st.text(max_size=6),
        _either(st.fixed_dictionaries({}, optional={"set": _either(_set),
                                                    "grid": _either(_grid)})), max_size=2),
    "cells": st.lists(_either(st.fixed_dictionaries(
        {"experiment": _either(st.sampled_from(EXPERIMENTS))},
        optional={"model": _either(st.sampled_from(MODELS)),
                  "seed": _either(st.integers(min_value=-1, max_value=3)),
                  "set": _either(_set)})), max_size=3),
}
"""A strategy of the right shape for every field of :class:`Spec` (checked below)."""

_any_shape = st.builds(
    lambda known, extra: {**extra, **known},
    st.fixed_dictionaries({}, optional={k: _either(v) for k, v in FIELD_SHAPES.items()}),
    st.dictionaries(_keys, toml_values, max_size=2))
_right_shape = st.fixed_dictionaries(
    {"experiments": st.lists(st.sampled_from(EXPERIMENTS), min_size=1, max_size=2),
     "models": st.lists(st.sampled_from(MODELS[:2]), min_size=1, max_size=2)},
    optional={k: v for k, v in FIELD_SHAPES.items() if k not in ("experiments", "models")})
_shared = st.sampled_from(["n_boot", "max_batch_tokens"])
_ok = st.integers(min_value=2, max_value=40)
_valid_shape = st.fixed_dictionaries(
    {"experiments": st.lists(st.sampled_from(["previous-token-heads", "head-overview",
                                              "induction-heads"]), min_size=1, max_size=2,
                             unique=True),
     "models": st.lists(st.sampled_from(MODELS[:2]), min_size=1, max_size=2, unique=True)},
    optional={"seeds": st.lists(st.integers(0, 3), max_size=2, unique=True),
              "config": st.sampled_from(["default", "demo"]),
              "set": st.dictionaries(_shared, _ok, max_size=1),
              "grid": st.dictionaries(_shared, st.lists(_ok, min_size=1, max_size=2),
                                      max_size=1),
              "cells": st.lists(st.fixed_dictionaries(
                  {"experiment": st.sampled_from(["head-overview", "induction-formation"])},
                  optional={"seed": st.integers(0, 3),
                            "set": st.dictionaries(_shared, _ok, max_size=1)}), max_size=2)})
specs = _any_shape | _right_shape | _valid_shape
"""Spec dicts: any subset of the record's keys, of right or wrong shapes, plus unknown
keys; every key of the right shape; or specs that are nearly always valid (so that many
get as far as building cells, and some have cells that are one run)."""


def test_the_strategies_cover_every_field_of_the_records():
    assert set(FIELD_SHAPES) == set(Spec.model_fields)
    cells = FIELD_SHAPES["cells"]
    assert set(CellSpec.model_fields) == {"experiment", "model", "seed", "set"}, cells
    assert set(ExperimentSection.model_fields) == {"set", "grid"}


# ---- TOML text of a dict ---------------------------------------------------------------------

def _toml_string(text: str) -> str:
    # JSON's escapes are TOML's, but TOML also wants DEL escaped
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: typing.Any) -> str:
    """``value`` as TOML (inline tables for tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(
            value) else repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{_toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_text(spec: dict[str, typing.Any]) -> str:
    return "".join(f"{_toml_string(k)} = {toml_value(v)}\n" for k, v in spec.items())


# ---- the properties --------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No network (a hub id is refused at once), and a working folder holding nothing a
    model name could find."""
    monkeypatch.setattr(reference, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.chdir(tmp_path)


def _one_line(exc: BaseException) -> None:
    message = str(exc)
    assert isinstance(exc, WorkbenchError), repr(exc)
    assert message.strip() and "\n" not in message, message


def _expanded_or_refused(make_spec: typing.Callable[[], Spec], runs_dir) -> None:
    try:
        cells = expand(make_spec(), runs_dir)
    except WorkbenchError as exc:
        _one_line(exc)
        event(f"refused: {type(exc).__name__}")
        return
    event("expanded" + (" with skipped cells" if any(c.skip for c in cells) else ""))
    assert len(cells) <= MAX_CELLS
    assert [c.index for c in cells] == list(range(len(cells)))
    runs = {(c.experiment, c.model.name if c.model else "", json.dumps(dict(c.overrides),
                                                                     sort_keys=True))
            for c in cells}
    assert len(runs) == len(cells)  # no two cells are one run
    for cell in cells:
        assert not cell.skip or (cell.model is not None and "\n" not in cell.skip)


@given(raw=specs)
def test_spec_dicts_expand_or_fail_in_one_line(raw, runs_dir):
    _expanded_or_refused(lambda: parse_spec(raw), runs_dir)
    assert stored(runs_dir) == []


@given(raw=specs)
def test_spec_dicts_as_toml_read_as_the_dicts_do(raw, runs_dir):
    text = toml_text(raw)
    _expanded_or_refused(lambda: parse_text(text), runs_dir)
    try:
        from_text = parse_text(text)
        from_dict = parse_spec(raw)
    except WorkbenchError as exc:
        _one_line(exc)
        return
    if "nan" not in json.dumps(from_dict.to_data()).lower():  # NaN is equal to nothing
        assert from_text.to_data() == from_dict.to_data()


_fragments = st.sampled_from([
    "experiments = ", "models = ", "seeds = ", "[grid]\n", "[set]\n", "[[cells]]\n",
    "[by_experiment.previous-token-heads]\n", '"previous-token-heads"', '"minilm"', "[", "]",
    "{", "}", ", ", "=", "\n", "n_boot", " = ", "1", "-1", "nan", "1979-05-27", '"', "'''",
    "experiment = ", "set = ", "grid = ", "seed", "[[", "]]", "#", "\\u0000", "."])
toml_like = st.lists(_fragments, max_size=30).map("".join) | st.text(max_size=80)
"""Text that is sometimes TOML and often nearly so."""


@given(text=toml_like)
def test_arbitrary_toml_text_expands_or_fails_in_one_line(text, runs_dir):
    _expanded_or_refused(lambda: parse_text(text), runs_dir)
    assert stored(runs_dir) == []


@given(sizes=st.lists(st.integers(min_value=1, max_value=40), max_size=12),
       n_seeds=st.integers(min_value=0, max_value=12),
       n_models=st.integers(min_value=1, max_value=2))
def test_the_cell_count_is_the_product_and_the_bound_holds(sizes, n_seeds, n_models,
                                                           runs_dir):
    fields = ["n_prompts", "n_tokens", "n_repeated", "seq_len", "n_boot",
              "max_batch_tokens"] + [f"k{i}" for i in range(6)]
    grid = {name: list(range(2, 2 + n)) for name, n in zip(fields, sizes, strict=False)}
    spec = parse_spec({"experiments": ["previous-token-heads"],
                       "models": ["minilm", "smollm2"][:n_models],
                       "seeds": list(range(n_seeds)), "grid": grid})
    want = n_models * max(n_seeds, 1) * math.prod(sizes)
    assert count_cells(spec, lambda model: 1) == min(want, 10**15 + 1)
    if want > MAX_CELLS:
        with pytest.raises(SpecError, match=r"cells; one sweep runs at most 10,000"):
            expand(spec, runs_dir)
    elif want <= 200 and len(grid) <= 6:  # real fields only: the cells are built
        assert len(expand(spec, runs_dir)) == want


@given(raw=specs)
def test_the_dry_run_plans_or_refuses_in_one_line(raw, capsys, tmp_path, runs_dir):
    path = tmp_path / "spec.toml"
    path.write_text(toml_text(raw), encoding="utf-8")
    status, out, err = cli(capsys, "sweep", str(path), "--dry-run", "--out", str(runs_dir))
    assert status in (0, 2), err
    assert "Traceback" not in err and "internal error" not in err, err
    event(f"exit {status}")
    if status == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err
    else:
        assert any(" cells, " in line and " reused" in line for line in out), out
    assert stored(runs_dir) == []
