"""Stored tables that pass their checksums but hold what their declaration forbids.

A ``run.json`` and its checksums can be rewritten with a table, so a checksum says only
that the file is the one the record names. Each case here rewrites one table of a real
complete run (and its checksum and row count in ``run.json``, so every file "verifies"):
a column missing or added, a column of the wrong kind, a duplicated row, an index beyond
the model, a p- or q-value outside [0, 1], a negative count, an empty table. Every page
that shows the run, ``workbench show`` and ``workbench verify`` must answer with one line
naming the problem: never an HTTP 500, never a traceback, never a count taken from it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dashboards.app import create_app
from tests.dashboard_runs import post_callback
from tests.robustness.test_dashboard_paths import page
from tests.tiny import cli
from workbench.core.errors import WorkbenchError
from workbench.harness import tables
from workbench.store.runs import RunStore
from workbench.store.schema import SchemaError
from workbench.views import pages
from workbench.views.pages import page_for

PAGES = {"previous-token-heads": "/heads", "logit-lens": "/lens",
         "induction-distance": "/distance", "ioi": "/patching", "attention-sinks": "/sinks"}
"""The run kinds whose pages read a table with head indices, and the page of each."""
SHOWN = {kind: page_for(kind) for page in pages.PAGES for kind in page.experiments
         if kind not in ("reproduce", "record", "sweep")}
"""Every experiment a page shows, and the page its run opens on."""

Mutation = Callable[[pd.DataFrame], pd.DataFrame]


def _first_int(frame: pd.DataFrame, *names: str) -> str | None:
    return next((n for n in names if n in frame.columns), None)


MUTATIONS: dict[str, Mutation] = {
    "a-column-missing": lambda f: f.drop(columns=[f.columns[0]]),
    "an-extra-column": lambda f: f.assign(smuggled="x"),
    "layer-as-text": lambda f: f.assign(layer=f.layer.astype(str)),
    "duplicated-rows": lambda f: pd.concat([f, f], ignore_index=True),
    "layer-beyond-the-model": lambda f: f.assign(layer=f.layer + 1000),
    "negative-head": lambda f: f.assign(head=-5),
}
"""Each mutation of a table that has ``layer`` and ``head`` columns of the head keys."""


def _rewrite(run, name: str, frame: pd.DataFrame) -> None:
    """Replace table ``name`` of ``run`` with ``frame``, its checksum and rows restated in
    ``run.json`` so that the checksum check passes."""
    path = run.path / f"{name}.parquet"
    frame.to_parquet(path, index=False)
    meta = json.loads((run.path / "run.json").read_text())
    meta["tables"][name].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                                rows=len(frame))
    (run.path / "run.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def store_copy(stocked, tmp_path_factory):
    """A copy of the stocked store's runs of the kinds in :data:`SHOWN` (a sweep's cell
    runs with it)."""
    runs = tmp_path_factory.mktemp("hostile-tables") / "runs"
    runs.mkdir()
    store = RunStore(stocked.runs)
    wanted = {stocked.kinds[kind] for kind in SHOWN}
    wanted |= {cell for cell in store.get(stocked.kinds["sweep"]).meta.cells or () if cell}
    for run_id in sorted(wanted):
        shutil.copytree(stocked.runs / run_id, runs / run_id)
    return runs, {kind: stocked.kinds[kind] for kind in SHOWN}


@pytest.fixture
def fresh(store_copy, tmp_path):
    """A store of those runs that a test may damage."""
    runs = tmp_path / "runs"
    shutil.copytree(store_copy[0], runs)
    return runs, store_copy[1]


def _answers(runs, path: str, run_id: str) -> list[tuple[int, str]]:
    """The page's layout for ``?run=`` and every callback of the page posted with the run
    chosen (its other inputs unset): each answer's status and text."""
    app = create_app(runs)
    assert app.server.test_client().get("/").status_code == 200  # registers the callbacks
    answers = [page(app, path, f"?run={run_id}")[:2]]
    prefix = path.strip("/")
    for key, spec in app.callback_map.items():
        if "callback" not in spec or not key.strip(".").startswith(prefix + "-"):
            continue
        values = {f"{i['id']}.{i['property']}": run_id for i in [*spec["inputs"],
                                                                 *spec["state"]]
                  if isinstance(i["id"], str) and i["id"] == f"{prefix}-run"}
        answers.append(post_callback(app, key, values)[:2])
    return answers


def _head_table(run) -> str:
    """The first table of ``run`` whose declaration bounds its head indices."""
    declared = tables.declared(run.experiment)
    for name in run.table_names():
        table = declared.get(name)
        if table is not None and {"layer", "head"} <= set(table.names) and \
                table.column("layer").range is not None:
            return name
    raise AssertionError(f"{run.experiment} declares no table of head indices")


@pytest.mark.parametrize("kind", sorted(PAGES))
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_page_shows_a_hostile_table_as_one_line(fresh, kind, mutation):
    runs, kinds = fresh
    run = RunStore(runs).get(kinds[kind])
    name = _head_table(run)
    _rewrite(run, name, MUTATIONS[mutation](run.table(name)))
    with pytest.raises(SchemaError) as info:
        tables.read(RunStore(runs).get(run.id), name)
    assert "\n" not in str(info.value) and run.id in str(info.value)
    for status, text in _answers(runs, PAGES[kind], run.id):
        assert status in (200, 204), text[-400:]
        assert "Traceback" not in text


WHOLE_RUN: dict[str, Mutation] = {
    "emptied": lambda f: f.iloc[:0],
    "every-row-twice": lambda f: pd.concat([f, f], ignore_index=True),
}
"""What every table of a run is changed to at once."""


@pytest.mark.parametrize("kind", sorted(SHOWN))
@pytest.mark.parametrize("change", sorted(WHOLE_RUN))
def test_a_page_answers_when_every_table_of_its_run_is_changed(fresh, kind, change):
    """Each callback of the page meets the first table it reads in that state: a table the
    run may leave empty is drawn empty, one it may not (or one with keys, twice) is refused
    in one line, and nothing indexes into a row that is not there."""
    runs, kinds = fresh
    run = RunStore(runs).get(kinds[kind])
    for name in run.table_names():
        _rewrite(run, name, WHOLE_RUN[change](run.table(name)))
    for status, text in _answers(runs, SHOWN[kind], run.id):
        assert status in (200, 204) and "Traceback" not in text, text[-400:]


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_verify_names_the_hostile_table(fresh, capsys, mutation):
    runs, kinds = fresh
    run = RunStore(runs).get(kinds["previous-token-heads"])
    name = _head_table(run)
    _rewrite(run, name, MUTATIONS[mutation](run.table(name)))
    status, out, err = cli(capsys, "verify", run.id, "--out", str(runs))
    assert status == 1 and "Traceback" not in err
    assert any("damaged" in line and name in line for line in out), out


def test_a_q_value_below_zero_is_not_counted_in_a_class(fresh, capsys):
    """The third round's case: ``show --classes --fdr 0.0001`` counted 3 heads whose
    stored q was -0.5; the Overview said "72 of 72" with every q at -1."""
    runs, kinds = fresh
    run = RunStore(runs).get(kinds["previous-token-heads"])
    frame = run.table("head_classes")
    frame.loc[frame.index[:3], "q"] = -0.5
    _rewrite(run, "head_classes", frame)
    status, out, err = cli(capsys, "show", run.id, "--classes", "--fdr", "0.0001", "--out",
                           str(runs))
    assert status == 2 and err.count("\n") == 1, err
    assert "column q holds np.float64(-0.5), outside 0 .. 1" in err
    assert not any(line.startswith("class ") for line in out)  # no count was printed
    app = create_app(runs)
    app.server.test_client().get("/")
    status, text, _ = page(app, "/overview", f"?run={run.id}")
    assert status == 200 and "of 72" not in text and "Traceback" not in text


def test_rows_that_disagree_with_run_json_are_refused_on_read(fresh):
    runs, kinds = fresh
    run = RunStore(runs).get(kinds["previous-token-heads"])
    meta = json.loads((run.path / "run.json").read_text())
    meta["tables"]["head_scores"]["rows"] = 5
    (run.path / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match=r"table head_scores holds \d+ rows; its run.json "
                                          r"says 5"):
        tables.read(RunStore(runs).get(run.id), "head_scores")


@pytest.mark.parametrize(("change", "said"), [
    ({"ended_at": "2000-01-01T00:00:00+00:00"}, "is before 'started_at'"),
    ({"seed": 12345}, "is not the config's seed"),
])
def test_facts_of_run_json_that_disagree_make_it_damaged(fresh, capsys, change, said):
    runs, kinds = fresh
    run = RunStore(runs).get(kinds["previous-token-heads"])
    meta = json.loads((run.path / "run.json").read_text())
    (run.path / "run.json").write_text(json.dumps({**meta, **change}))
    again = RunStore(runs).get(run.id)
    assert again.status == "damaged" and said in again.meta.error
    status, out, _ = cli(capsys, "verify", run.id, "--out", str(runs))
    assert status == 1 and any(said in line for line in out), out


# ---- generated tables --------------------------------------------------------------------

_VALUES = st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=True),
                    st.text(max_size=8), st.booleans(), st.none())


@st.composite
def _hostile(draw, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a few cells, columns or rows changed to drawn values."""
    out = frame.copy()
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["cell", "drop", "add", "dup", "empty", "type"]))
        if how == "cell" and len(out):
            column = draw(st.sampled_from(list(out.columns)))
            row = draw(st.integers(0, len(out) - 1))
            out[column] = out[column].astype(object)
            out.iloc[row, list(out.columns).index(column)] = draw(_VALUES)
        elif how == "drop" and len(out.columns) > 1:
            out = out.drop(columns=[draw(st.sampled_from(list(out.columns)))])
        elif how == "add":
            out = out.assign(**{draw(st.sampled_from(["extra", "x", "layer2"])): 1})
        elif how == "dup" and len(out):
            out = pd.concat([out, out.iloc[:1]], ignore_index=True)
        elif how == "empty":
            out = out.iloc[:0]
        elif how == "type" and len(out.columns):
            column = draw(st.sampled_from(list(out.columns)))
            out[column] = out[column].astype(str)
    return out


@given(data=st.data())
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_any_hostile_table_is_one_line_on_every_reader(store_copy, tmp_path_factory, capsys,
                                                      data):
    runs_src, kinds = store_copy
    runs = tmp_path_factory.mktemp("generated") / "runs"
    shutil.copytree(runs_src, runs)
    kind = data.draw(st.sampled_from(sorted(SHOWN)))
    run = RunStore(runs).get(kinds[kind])
    name = data.draw(st.sampled_from(run.table_names()))
    frame = data.draw(_hostile(run.table(name)))
    try:
        _rewrite(run, name, frame)
    except (ValueError, TypeError, OverflowError, ImportError):  # Parquet cannot hold it
        assume(False)
    run = RunStore(runs).get(run.id)
    try:
        tables.read(run, name)
    except WorkbenchError as exc:
        assert "\n" not in str(exc)
    for status, text in _answers(runs, SHOWN[kind], run.id):
        assert status in (200, 204) and "Traceback" not in text, text[-400:]
    for args in (("show", run.id, "--table", name), ("verify", run.id)):
        status, _, err = cli(capsys, *args, "--out", str(runs))
        assert "Traceback" not in err and status in (0, 1, 2), (args, err)
        assert status != 2 or err.count("\n") == 1, err  # a refusal is one line
