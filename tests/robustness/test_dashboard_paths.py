"""The dashboard serves nothing from outside its store, survives damaged runs, and keeps
its debugger off the network (issue 11, classes 1, 5 and 10, the dashboard's side).

Requests go through Dash's own HTTP endpoint (``/_dash-update-component``) with Flask's
test client, exactly as a browser (or an attacker) would send them. Next to the store lies
a run folder whose prompt labels and summary carry a secret marker; no response may ever
contain it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dash._utils import split_callback_id

from dashboards.app import DEBUG_REFUSED, check_host, create_app, serve
from tests.tiny import fake_info
from workbench.core.errors import WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.recording.writer import record
from workbench.store.runs import RunStore
from workbench.views import patterns

MARKER = "SECRET-OUTSIDE-9c41"
ROUTER = ".._pages_content.children..._pages_store.data.."
LATER = "2999-01-01T00:00:00+00:00"


# ---- a store with every kind of trouble in it -----------------------------------------

@dataclass
class Hostile:
    """A run store, a secret run outside it, and the ids of its troubled runs."""

    runs: Path
    outside: Path
    healthy: str  # a complete recording
    secret: str  # the id of the run outside (also the name of a symlink inside)
    heads: str  # a complete induction-heads run (a wrong kind for the recording pages)
    linked: str  # a complete recording whose recording folder links to the secret's
    garbage: str  # a complete recording whose index.json is not JSON
    checksum: str  # a complete induction-heads run whose table lost its checksum
    damaged: str  # the newest record run: its run.json names /etc/hostname as a table
    interrupted: str  # under .incomplete/, claiming to be complete


def record_run(store: RunStore, model, label: str, **extra: Any) -> str:
    texts = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog"]
    with store.start("record", model.info, {"source": "test"}, extra=extra) as run:
        record(model, [Prompt(text=t, label=f"{label}-{i}") for i, t in enumerate(texts)],
               run.dir / "recording")
    return run.id


def run_id(label: str) -> str:
    """A run id of the store's own shape for a hand-made run named ``label``."""
    return f"20260101-000000-{label}-0000"


def _write_run(folder: Path, text: str | None = None, **meta: Any) -> str:
    """A hand-written run.json (``text`` verbatim, else a valid one updated by ``meta``)."""
    folder.mkdir(parents=True)
    base = {"run_id": folder.name, "experiment": "induction-heads", "status": "complete",
            "started_at": "2026-01-01T00:00:00+00:00", "config": {},
            "model": fake_info("tiny-llama").to_data(), "tables": {}}
    (folder / "run.json").write_text(text if text is not None else json.dumps({**base, **meta}))
    return folder.name


def hostile_store(root: Path, model) -> Hostile:
    """Build the store under ``root / "runs"`` and the secret run under ``root / "outside"``."""
    runs, outside = root / "runs", root / "outside"
    store = RunStore(runs)
    healthy = record_run(store, model, "healthy")
    secret = record_run(RunStore(outside), model, MARKER, summary=[MARKER])
    (runs / secret).symlink_to(outside / secret, target_is_directory=True)
    with store.start("record", model.info, {"source": "test"}) as run:
        (run.dir / "recording").symlink_to(outside / secret / "recording",
                                           target_is_directory=True)
    linked = run.id
    with store.start("record", model.info, {"source": "test"}) as run:
        (run.dir / "recording").mkdir()
        (run.dir / "recording" / "index.json").write_text("{not json")
    garbage = run.id
    with store.start("induction-heads", model.info, {}) as run:
        pass
    heads = run.id
    checksum, damaged, interrupted = damaged_runs(runs)
    _write_run(runs / run_id("missing-table"), tables={"head_scores": {
        "file": "gone.parquet", "rows": 1, "sha256": "0" * 64}})
    return Hostile(runs, outside, healthy, secret, heads, linked, garbage, checksum, damaged,
                   interrupted)


DAMAGED = {run_id("damaged-empty"): "no 'run_id'",
           run_id("damaged-list"): "expected an object, got []",
           run_id("damaged-not-json"): "not valid JSON",
           run_id("damaged-no-id"): "no 'run_id'",
           run_id("damaged-started-number"): "'started_at': expected a valid string",
           run_id("damaged-newest-record"): "expected a path inside its folder"}
"""The damaged runs :func:`damaged_runs` writes, and a fragment of each one's reason."""


def damaged_runs(runs: Path) -> tuple[str, str, str]:
    """Write the hand-made runs into store ``runs``: the :data:`DAMAGED` ones, a complete
    induction-heads run whose table fails its checksum, and a run under ``.incomplete/``
    that claims to be complete. Return the ids of the bad-checksum run, of the newest
    damaged run (a record run) and of the interrupted one."""
    checksum = _write_run(runs / run_id("bad-checksum"), tables={"head_scores": {
        "file": "head_scores.parquet", "rows": 1, "sha256": "0" * 64}})
    (runs / checksum / "head_scores.parquet").write_bytes(b"PAR1 not really")
    damaged = _write_run(runs / run_id("damaged-newest-record"), experiment="record",
                         started_at=LATER,
                         tables={"x": {"file": "/etc/hostname", "rows": 1,
                                       "sha256": "0" * 64}})
    _write_run(runs / run_id("damaged-empty"), "{}")
    _write_run(runs / run_id("damaged-list"), "[]")
    _write_run(runs / run_id("damaged-not-json"), "{oops")
    _write_run(runs / run_id("damaged-no-id"),
               json.dumps({"experiment": "record", "status": "complete"}))
    _write_run(runs / run_id("damaged-started-number"), started_at=5)
    interrupted = _write_run(runs / ".incomplete" / run_id("interrupted-complete"),
                             experiment="record",
                             started_at="2998-01-01T00:00:00+00:00")
    return checksum, damaged, interrupted


# ---- posting to Dash's endpoint ---------------------------------------------------------

@pytest.fixture(scope="module")
def hostile(tmp_path_factory, llama) -> Hostile:
    return hostile_store(tmp_path_factory.mktemp("hostile"), llama)


@pytest.fixture(scope="module")
def app(hostile):
    app = create_app(hostile.runs)
    client = app.server.test_client()
    assert client.get("/").status_code == 200  # registers the callbacks
    return app


def post(app, output: str, values: dict[str, Any]) -> tuple[int, str, dict]:
    """Call the callback whose outputs include ``output`` (``id.property``) as the browser
    would, with ``values`` for its inputs and states (``id.property``; others None)."""
    key = next(k for k in app.callback_map if output in k)
    spec = app.callback_map[key]
    inputs = [{**i, "value": values.get(f"{i['id']}.{i['property']}")} for i in spec["inputs"]]
    state = [{**s, "value": values.get(f"{s['id']}.{s['property']}")} for s in spec["state"]]
    body = {"output": key, "outputs": split_callback_id(key), "inputs": inputs, "state": state,
            "changedPropIds": [f"{inputs[0]['id']}.{inputs[0]['property']}"]}
    response = app.server.test_client().post("/_dash-update-component", json=body)
    text = response.get_data(as_text=True)
    payload = response.get_json(silent=True) or {}
    return response.status_code, text, payload.get("response", {})


def page(app, path: str, search: str = "") -> tuple[int, str, dict]:
    """The layout the router sends for ``path`` + ``search`` (e.g. ``?run=...``)."""
    return post(app, "_pages_content.children",
                {"_pages_location.pathname": path, "_pages_location.search": search})


def find(tree: Any, component_id: str) -> dict | None:
    """The props of the component ``component_id`` in a serialized layout."""
    if isinstance(tree, dict):
        props = tree.get("props")
        if isinstance(props, dict) and props.get("id") == component_id:
            return props
        return next((hit for v in tree.values() if (hit := find(v, component_id))), None)
    if isinstance(tree, list):
        return next((hit for v in tree if (hit := find(v, component_id))), None)
    return None


# ---- crafted run ids ------------------------------------------------------------------

def crafted(h: Hostile) -> dict[str, tuple[Any, str]]:
    """Name -> (run id as the client sends it, fragment of the message that must answer)."""
    secret = h.outside / h.secret
    return {
        "absolute-path": (str(secret), "no such run"),
        "absolute-path-of-a-stored-run": (str(h.runs / h.healthy), "no such run"),
        "relative-to-cwd": (os.path.relpath(secret), "no such run"),
        "dotdot-from-store": (f"../outside/{h.secret}", "no such run"),
        "dotdot-inside-id": (f"{h.healthy}/../../outside/{h.secret}", "no such run"),
        "symlink-leading-out": (h.secret, "no such run"),
        "id-prefix": (h.healthy[:12], "no such run"),
        "empty": ("", "no such run"),
        "not-a-string": ({"path": str(secret)}, "run id: expected text"),
        "damaged-run": (h.damaged, "is damaged"),
        "interrupted-run": (h.interrupted, "is interrupted"),
        "wrong-kind": (h.heads, "is an induction-heads run; this page shows record runs"),
        "recording-linked-out": (h.linked, "leads outside the run"),
        "recording-index-garbage": (h.garbage, "damaged"),
    }


CASES = ["absolute-path", "absolute-path-of-a-stored-run", "relative-to-cwd",
         "dotdot-from-store", "dotdot-inside-id", "symlink-leading-out", "id-prefix", "empty",
         "not-a-string", "damaged-run", "interrupted-run", "wrong-kind",
         "recording-linked-out", "recording-index-garbage"]

# (the output that names the callback, the input carrying the run id, where the message goes)
CALLBACKS = {
    "recording-choose-run": ("recording-prompt.options", "recording-run.value",
                             ("recording-error", "children")),
    "recording-grid": ("recording-grid.figure", "recording-run.value",
                       ("recording-grid", "figure")),
    "residual-choose-run": ("residual-prompt.options", "residual-run.value",
                            ("residual-error", "children")),
}


def _message(payload: dict, where: tuple[str, str]) -> str:
    value = payload[where[0]][where[1]]
    if where[1] == "figure":
        return value["layout"]["title"]["text"]
    return value["props"]["children"]


@pytest.mark.parametrize("callback", list(CALLBACKS))
@pytest.mark.parametrize("case", CASES)
def test_a_crafted_run_id_is_answered_with_a_message_and_nothing_from_outside(
        app, hostile, case, callback):
    value, fragment = crafted(hostile)[case]
    output, run_input, where = CALLBACKS[callback]
    status, text, payload = post(app, output, {run_input: value, "recording-prompt.value": 0})
    assert status == 200, text[:500]
    assert MARKER not in text
    assert fragment in _message(payload, where)
    assert "Traceback" not in text


def test_the_healthy_run_is_served_and_the_harness_sees_its_labels(app, hostile):
    status, text, payload = post(app, "recording-prompt.options",
                                 {"recording-run.value": hostile.healthy})
    assert status == 200
    assert "healthy-0" in text and payload["recording-error"]["children"] is None
    assert MARKER not in text


@pytest.mark.parametrize("case", ["absolute-path", "dotdot-from-store", "symlink-leading-out",
                                  "id-prefix", "damaged-run"])
def test_the_runs_page_opens_only_listed_runs(app, hostile, case):
    value, fragment = crafted(hostile)[case]
    status, text, payload = post(app, "runs-detail.children", {
        "runs-table.selected_rows": [0], "runs-table.data": [{"run": value}]})
    assert status == 200 and MARKER not in text
    detail = json.dumps(payload["runs-detail"]["children"])
    assert (fragment if case != "damaged-run" else "damaged: run.json") in detail


@pytest.mark.parametrize("case", ["symlink-leading-out", "dotdot-from-store", "absolute-path"])
def test_every_callback_that_takes_a_run_refuses_a_crafted_one(app, hostile, case):
    value, _ = crafted(hostile)[case]
    answered = 0
    for key, spec in app.callback_map.items():
        takes = [f"{i['id']}.{i['property']}" for i in spec["inputs"] + spec["state"]
                 if i["id"].endswith(("-run", "-compare"))]
        if not takes or key == ROUTER:
            continue
        status, text, _ = post(app, key, dict.fromkeys(takes, value))
        assert status in (200, 204), (key, text[:300])
        assert MARKER not in text, key
        answered += 1
    assert answered >= 25  # every page's callbacks were reached


@pytest.mark.parametrize(("run", "fragment"), [(run_id("bad-checksum"), "checksum mismatch"),
                                               (run_id("missing-table"), "is missing")])
def test_a_damaged_table_is_a_message_in_the_page(app, run, fragment):
    status, _, payload = post(app, "heads-metric.options", {"heads-run.value": run})
    assert status == 200
    assert fragment in payload["heads-error"]["children"]["props"]["children"]


@pytest.mark.parametrize("path", ["/recording", "/long-context", "/residual"])
@pytest.mark.parametrize("case", ["absolute-path", "relative-to-cwd", "dotdot-from-store",
                                  "symlink-leading-out", "id-prefix", "damaged-run",
                                  "interrupted-run", "wrong-kind"])
def test_a_bad_run_in_the_url_is_a_message_not_a_500(app, hostile, path, case):
    value, fragment = crafted(hostile)[case]
    status, text, payload = page(app, path, "?run=" + value)
    assert status == 200, text[:500]
    assert MARKER not in text
    content = payload["_pages_content"]["children"]
    assert fragment in json.dumps(content)
    assert find(content, path.strip("/") + "-run") is None  # nothing was opened


def test_a_bad_compare_run_in_the_url_drops_only_the_comparison(app, hostile):
    status, text, payload = page(app, "/heads", f"?compare={hostile.outside / hostile.secret}")
    assert status == 200 and MARKER not in text
    content = payload["_pages_content"]["children"]
    assert "compare: no such run" in json.dumps(content)
    assert find(content, "heads-run")["value"] == hostile.heads


@pytest.mark.parametrize("path", ["/recording", "/long-context", "/residual"])
def test_the_recording_pages_default_to_the_newest_complete_run(app, hostile, path):
    # the damaged and the interrupted record runs are newer than the healthy one
    status, _, payload = page(app, path)
    assert status == 200
    dropdown = find(payload["_pages_content"]["children"], path.strip("/") + "-run")
    complete = [hostile.healthy, hostile.linked, hostile.garbage]
    assert sorted(o["value"] for o in dropdown["options"]) == sorted(complete)
    assert dropdown["value"] == dropdown["options"][0]["value"]  # the newest of them


def test_the_runs_page_lists_damaged_runs_with_their_reason(app, hostile):
    status, _, payload = post(app, "runs-table.data", {})
    assert status == 200
    rows = {r["run"]: r for r in payload["runs-table"]["data"]}
    assert hostile.secret not in rows  # the symlink leading out is not one of the runs
    for name, reason in DAMAGED.items():
        assert rows[name]["status"] == "damaged" and reason in rows[name]["problem"], name
    assert rows[hostile.healthy]["problem"] == ""


PAGES = {"/": "Runs", "/recording": "Recording", "/long-context": "Long context",
         "/residual": "Residual stream",
         "/heads": "Heads", "/sinks": "Attention sinks", "/pruning": "Pruning",
         "/formation": "Formation", "/equivariance": "Equivariance"}


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_renders_over_a_store_with_damaged_runs(app, path):
    status, text, payload = page(app, path)
    assert status == 200, text[:500]
    assert MARKER not in text
    assert PAGES[path] in json.dumps(payload["_pages_content"]["children"])


# ---- serving ----------------------------------------------------------------------------

@pytest.fixture
def served(hostile, monkeypatch):
    """A fresh app whose Flask server records how it would have been started."""
    fresh = create_app(hostile.runs)
    calls: list[dict] = []
    monkeypatch.setattr(fresh.server, "run", lambda **kw: calls.append(kw))
    return fresh, calls


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.20", "example.com"])
def test_debug_is_refused_on_a_host_that_is_not_loopback(served, host):
    app, calls = served
    with pytest.raises(WorkbenchError, match=re.escape(DEBUG_REFUSED)):
        serve(app, host, 8050, debug=True)
    assert calls == []


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_debug_is_allowed_on_loopback(served, host, monkeypatch):
    app, calls = served
    monkeypatch.setenv("DASH_HOT_RELOAD", "false")  # no file-watching thread in the tests
    assert check_host(host, debug=True) is None
    serve(app, host, 8050, debug=True)
    assert calls[0]["debug"] is True and calls[0]["host"] == host


def test_a_host_that_is_not_loopback_warns_and_serves_without_debugger(served, caplog):
    app, calls = served
    with caplog.at_level(logging.WARNING, logger="dashboards.app"):
        serve(app, "0.0.0.0", 8050, debug=False)
    assert "readable to anyone on the network" in caplog.text
    assert "--host 0.0.0.0" in check_host("0.0.0.0", debug=False)
    (kw,) = calls
    assert kw["debug"] is False and kw["use_debugger"] is False and kw["use_evalex"] is False
    assert kw["use_reloader"] is False
    assert not app._dev_tools.ui and not app._dev_tools.prune_errors


def test_a_port_out_of_range_is_refused(served):
    app, calls = served
    expected = "--port 99999 is not a port; expected 1..65535"
    with pytest.raises(WorkbenchError, match=re.escape(expected)):
        serve(app, "127.0.0.1", 99999)
    assert calls == []


def _a_bug(monkeypatch) -> None:
    """Make drawing a pattern fail as a bug in the page would (not a refusal or a damaged
    run, which are messages): every value it is sent is valid."""
    def broken(*args: Any, **kwargs: Any):
        raise RuntimeError("a bug in a figure")

    # the Recording page draws through the library's figure, as a notebook does
    monkeypatch.setattr(patterns, "pattern_heatmap", broken)


def test_a_failing_callback_sends_no_traceback_when_debug_is_off(served, hostile, monkeypatch):
    app, _ = served
    monkeypatch.setenv("FLASK_DEBUG", "1")
    monkeypatch.setenv("DASH_DEBUG", "true")
    serve(app, "127.0.0.1", 8050, debug=False)
    app.server.test_client().get("/")
    _a_bug(monkeypatch)
    status, text, _ = post(app, "recording-pattern.figure", {
        "recording-run.value": hostile.healthy, "recording-prompt.value": 0,
        "recording-layer.value": 0, "recording-head.value": 0})
    assert status == 500
    assert "Traceback" not in text and "draw_pattern" not in text and ".py" not in text


def test_with_the_debugger_the_same_failure_would_send_its_source(hostile, monkeypatch):
    """The control for the test above: Dash's debug mode does send the traceback."""
    app = create_app(hostile.runs)
    app.enable_dev_tools(debug=True, dev_tools_hot_reload=False)
    app.server.test_client().get("/")
    _a_bug(monkeypatch)
    status, text, _ = post(app, "recording-pattern.figure", {
        "recording-run.value": hostile.healthy, "recording-prompt.value": 0,
        "recording-layer.value": 0, "recording-head.value": 0})
    assert status == 500 and "draw_pattern" in text
