"""Every dashboard callback, posted arbitrary JSON for each of its inputs and states.

The callbacks are found in ``app.callback_map`` (a new one is fuzzed without a line here),
Dash's page router among them, and fuzzed page by page: each example draws one callback of
its page, then its values (one test per callback would post 60 x 76 requests in the ``ci``
profile, over a minute and a half on two cores). Since a page's draws need not reach each
of its callbacks, every input of every callback is also posted each class of crafted
value once, the others left unset. Each example posts one request to Dash's endpoint
(``/_dash-update-component``) as a browser would, over a store with a complete run of every
kind the pages show beside damaged, wrong-kind and symlinked runs and a secret run outside
it (:mod:`tests.dashboard_runs`). A value is drawn from what the page itself offers (its
runs, the names in their tables, small indices, clicks and zooms of the right shape) or
from anything JSON holds: null, bools, huge integers, NaN and the infinities as Python's
JSON writes them, strings with control characters, markup or paths leading out of the
store, lists and objects. The ids the client says changed are drawn too.

Every answer must be: HTTP 200, or Dash's 204 where nothing changes; no traceback; nothing
of the run outside the store, whose files are not even opened (an audit hook watches every
``open``); every message on one line and, in a figure, without markup; and every value a
callback refused (``safe`` logs each refusal) said in the page.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import dash
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from dashboards.app import create_app
from dashboards.components.exports import table_choice
from dashboards.components.messages import ERROR_COLOUR
from dashboards.components.values import ZOOM_KEYS
from tests.dashboard_runs import messages_in, names_in, post_callback, request_body
from tests.robustness.test_dashboard_paths import MARKER, crafted

# ---- the callbacks ---------------------------------------------------------------------


def _discovered() -> list[str]:
    """Every callback the server runs (clientside ones have no server side)."""
    app = create_app(Path("/nonexistent-runs"))  # registering needs no store
    app.server.test_client().get("/")
    return sorted(k for k, spec in app.callback_map.items() if "callback" in spec)


CALLBACKS = _discovered()
PREFIXES = sorted((page["module"].split(".")[-1].replace("_", "-")
                   for page in dash.page_registry.values()), key=len, reverse=True)
"""Each page's id prefix (its module's name), longest first."""
ROUTER = "router"


def _short(key: str) -> str:
    """A callback's name in a test id: its first output, ``id.property``."""
    return key.strip(".").split("...")[0].split("@")[0]


def _page_of(key: str) -> str:
    """The page whose ids the callback's first output carries (Dash's router: ``router``)."""
    return next((p for p in PREFIXES if _short(key).startswith(p + "-")), ROUTER)


PAGES: dict[str, list[str]] = {}
for _key in CALLBACKS:
    PAGES.setdefault(_page_of(_key), []).append(_key)


def _prefix(component_id: str) -> str:
    """The page prefix of a component id (``long-context-run``: ``long-context``)."""
    return component_id.rsplit("-", 1)[0]


def _page_kinds(prefix: str) -> list[str] | None:
    """The run kinds the page with id prefix ``prefix`` shows (``None``: any, the Runs
    page)."""
    for page in dash.page_registry.values():
        if page["module"].split(".")[-1].replace("_", "-") == prefix and prefix != "runs":
            return list(page.get("experiments", []))
    return None


# ---- values -----------------------------------------------------------------------------

CRAFTED_TEXT = ["", " ", "\x00", "a\nb", "\u2028", "<br>two lines", "<a href='x'>x</a>",
                "&amp;", "../", "../../etc/passwd", "/etc/hostname", "NaN", "Infinity", "null",
                "true", "-1", "0", "1.5", "1e999", "L0H1", "L99H99", "L-1H0", "max", "sum",
                "grid", "top", "running", "binned", "complete", "damaged", "x" * 300,
                '{"a": 1}', "[0, 1]", "é" * 10]
HUGE = [2**31, 2**53 + 1, 2**63, 2**70, -(2**63), 10**30]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 12), st.sampled_from(HUGE),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(CRAFTED_TEXT))
KEYS = st.sampled_from(["", "a", "points", "x", "y", "row", "column", "layer", "head",
                        "run", "xaxis.range[0]"])
ANY_JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)), max_leaves=5)
SMALL = st.integers(0, 12)
COORDINATE = st.one_of(SMALL, st.floats(-2, 20, allow_nan=False),
                       st.sampled_from(["3", "2 'tok'", "1: L1 step 4", "x"]), ANY_JSON)
CLICK = st.fixed_dictionaries({"points": st.lists(st.fixed_dictionaries(
    {"x": COORDINATE, "y": COORDINATE}), min_size=1, max_size=2)})
ZOOM = st.fixed_dictionaries(dict.fromkeys(ZOOM_KEYS, COORDINATE))
HEAD = st.fixed_dictionaries({"layer": SMALL, "head": SMALL})
CELL = st.fixed_dictionaries({"row": SMALL, "column": SMALL})


class Pools:
    """What the store offers to post: run ids (by page), names and table choices."""

    def __init__(self, stocked) -> None:
        self.stocked = stocked
        hostile = stocked.hostile
        troubled = [hostile.secret, hostile.heads, hostile.linked, hostile.garbage,
                    hostile.checksum, hostile.damaged, hostile.interrupted]
        self.crafted_ids = [value for value, _ in crafted(hostile).values()] + troubled
        self.names = names_in(stocked)
        self.tables = [table_choice(run_id, name) for run_id in stocked.kinds.values()
                       for name in ("head_scores", "scores", "nope", "../run.json")]

    @staticmethod
    def holds_run(component_id: str) -> bool:
        """Whether the component holds a run id (a run dropdown, the Runs page's stores)."""
        return component_id.endswith(("-run", "-compare")) or component_id in (
            "runs-selected", "runs-requested")

    def _mine(self, component_id: str) -> list[str]:
        kinds = _page_kinds(_prefix(component_id))
        return [rid for kind, rid in self.stocked.kinds.items() if kinds is None or kind in kinds]

    def first_run(self, component_id: str) -> str:
        """A complete run of a kind the component's page shows."""
        return self._mine(component_id)[0]

    def run_ids(self, component_id: str) -> st.SearchStrategy:
        """A run id for the page's run input: mostly of a kind it shows, else one the
        store lists in trouble or one crafted to lead out of it."""
        mine = self._mine(component_id)
        return st.one_of(st.sampled_from(mine), st.sampled_from(mine),
                         st.sampled_from(self.crafted_ids))

    def value(self, item: dict, odd: bool | None = None) -> st.SearchStrategy:
        """A value for one input or state of a callback, by what it holds.

        Args:
            item: the input, as the callback map names it.
            odd: anything JSON holds (``True``), what the page offers (``False``), or
                either (``None``).
        """
        if str(item["id"]).startswith("{"):  # a pattern input: its components and values
            return st.lists(st.tuples(st.one_of(st.sampled_from(self.names), ANY_JSON),
                                      st.one_of(SMALL, ANY_JSON)), max_size=3)
        plausible = self._plausible(item)
        if odd is None:
            return st.one_of(plausible, plausible, ANY_JSON)
        return ANY_JSON if odd else plausible

    def _plausible(self, item: dict) -> st.SearchStrategy:
        component, prop = str(item["id"]), item["property"]
        if self.holds_run(component):
            return self.run_ids(component)
        by_prop = {"clickData": CLICK, "relayoutData": ZOOM, "active_cell": CELL,
                   "selected_rows": st.lists(SMALL, max_size=2), "n_clicks": SMALL,
                   "derived_viewport_data": st.lists(HEAD, max_size=3),
                   "pathname": st.sampled_from(["/", "/heads", "/sweeps", "/nowhere"]),
                   "search": st.sampled_from([f"?run={r}" for r in self.crafted_ids
                                              if isinstance(r, str)])}
        if component == "runs-table" and prop == "data":
            plausible = st.lists(st.fixed_dictionaries({"run": self.run_ids("runs-run")}),
                                 max_size=3)
        elif component == "heads-selected":
            plausible = HEAD
        elif component.endswith("-download-table"):
            plausible = st.sampled_from(self.tables)
        else:
            plausible = by_prop.get(prop, st.one_of(
                st.sampled_from(self.names), SMALL, st.sampled_from([0.25, 0.5, 1])))
        return plausible


def _changed(spec: dict) -> st.SearchStrategy:
    """The ids the client says changed: the first input (``None``), another input, or
    text that names none (a pattern id that is not JSON too)."""
    named = [f"{i['id']}.{i['property']}" for i in spec["inputs"]]
    return st.one_of(st.none(), st.lists(st.sampled_from(named), min_size=1, max_size=2),
                     st.lists(st.sampled_from(["{not json.n_clicks", "nowhere.value",
                                               '{"type":"x"}.n_clicks', "."]), max_size=1))


# ---- fixtures ---------------------------------------------------------------------------

class Refusals(logging.Handler):
    """The refusals and read failures ``safe`` (and the router's guard) log."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage().split(": ", 1)[-1])


class Opened:
    """The files opened under a folder while it is watched, symlinks resolved: an audit
    hook sees every ``open`` of the process, whichever code makes it."""

    def __init__(self) -> None:
        self.watched: str | None = None
        self.found: list[str] = []

    def __call__(self, event: str, args: tuple) -> None:
        if self.watched is None or event != "open" or not args:
            return
        try:
            real = os.path.realpath(os.fsdecode(args[0]))
        except (TypeError, ValueError):  # a file descriptor, not a path
            return
        if real.startswith(self.watched):
            self.found.append(real)


OPENED = Opened()
sys.addaudithook(OPENED)  # idle until a test sets what it watches; a hook cannot be removed


@pytest.fixture(scope="module")
def outside(stocked) -> Iterator[Opened]:
    OPENED.watched = os.path.realpath(stocked.hostile.outside) + os.sep
    yield OPENED
    OPENED.watched = None


@pytest.fixture(scope="module")
def app(stocked):
    app = create_app(stocked.runs)
    assert app.server.test_client().get("/").status_code == 200
    assert sorted(k for k, s in app.callback_map.items() if "callback" in s) == CALLBACKS
    return app


@pytest.fixture(scope="module")
def pools(stocked) -> Pools:
    return Pools(stocked)


@pytest.fixture(scope="module")
def refusals() -> Iterator[Refusals]:
    handler = Refusals()
    loggers = [logging.getLogger(n) for n in ("dashboards.components.messages",
                                              "dashboards.app")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


# ---- the properties ---------------------------------------------------------------------

def _message_titles(response: object) -> list[str]:
    """The title of every figure in a response that is a message, as sent."""
    if isinstance(response, dict):
        layout = response.get("layout")
        title = layout.get("title") if isinstance(layout, dict) else None
        found = ([str(title.get("text"))] if isinstance(title, dict)
                 and title.get("font", {}).get("color") == ERROR_COLOUR else [])
        return found + [t for v in response.values() for t in _message_titles(v)]
    if isinstance(response, list):
        return [t for v in response for t in _message_titles(v)]
    return []


def check_answer(status: int, text: str, payload: dict, refused: list[str],
                 opened: list[str]) -> None:
    """The properties every answer has (see the module's docstring)."""
    assert status in (200, 204), text[:400]
    assert "Traceback" not in text and 'File "' not in text, text[:400]
    assert MARKER not in text
    assert opened == [], "opened outside the store"
    shown = [str(m) for m in messages_in(payload)]
    for line in shown:
        assert "\n" not in line and "\r" not in line, line
    for title in _message_titles(payload):
        assert "<" not in title, title  # a message quoting the client is not markup
    for line in refused:
        assert status == 200, f"refused but shown nowhere: {line}"
        assert line in shown, (line, shown)


@pytest.mark.parametrize("page", sorted(PAGES))
@given(data=st.data())
def test_any_values_posted_to_a_pages_callbacks_get_a_page_not_an_error(app, pools, refusals,
                                                                        outside, page, data):
    key = data.draw(st.sampled_from(PAGES[page]), label="callback")
    spec = app.callback_map[key]
    items = {f"{i['id']}.{i['property']}": i for i in spec["inputs"] + spec["state"]}
    # half the time one input is odd and the others are what the page offers, so a crafted
    # value also reaches the code past the checks of the others
    odd = data.draw(st.one_of(st.none(), st.sampled_from(list(items))), label="odd input")
    values = {name: data.draw(pools.value(i, None if odd is None else name == odd), label=name)
              for name, i in items.items()}
    changed = data.draw(_changed(spec), label="changedPropIds")
    refusals.lines.clear()
    outside.found.clear()
    status, text, payload = post_callback(app, key, values, changed)
    # the statistics (--hypothesis-show-statistics) say how many examples went how deep
    event("refused or unreadable" if refusals.lines else f"answered {status}")
    check_answer(status, text, payload, list(refusals.lines), list(outside.found))


CLASSES = [None, "x", "x" * 300, "a\nb<br>", math.nan, math.inf, -math.inf, True, 1.5,
           -1, 2**70, [0], [[]], {"a": {"b": 1}}, {"points": [{"x": "1", "y": None}]}]
"""One value of each crafted class (NaN and the infinities as Python's JSON writes them)."""


@pytest.mark.parametrize("key", CALLBACKS, ids=_short)
def test_every_input_of_every_callback_answers_each_crafted_class(app, pools, refusals,
                                                                   outside, key):
    spec = app.callback_map[key]
    items = [i for i in spec["inputs"] + spec["state"] if not str(i["id"]).startswith("{")]
    runs = {f"{i['id']}.{i['property']}": pools.first_run(str(i["id"])) for i in items
            if pools.holds_run(str(i["id"]))}
    for item in items:
        for value in CLASSES:
            refusals.lines.clear()
            outside.found.clear()
            values = {**runs, f"{item['id']}.{item['property']}": value}
            status, text, payload = post_callback(app, key, values)
            check_answer(status, text, payload, list(refusals.lines), list(outside.found))


def test_every_callback_is_fuzzed_and_declares_its_inputs(app):
    """Each callback the pages define checks its values (``safe`` read its declarations);
    only Dash's page router, guarded in ``create_app``, is not one of them."""
    undeclared = []
    for key in CALLBACKS:
        fn = app.callback_map[key]["callback"]
        while not hasattr(fn, "declared") and hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        if not hasattr(fn, "declared"):
            undeclared.append(key)
    assert undeclared == PAGES[ROUTER] == [".._pages_content.children..._pages_store.data.."]
    assert sum(map(len, PAGES.values())) == len(CALLBACKS) >= 70
    assert set(PAGES) == {*PREFIXES, ROUTER}  # every page has callbacks, and all are fuzzed


def test_a_request_body_names_every_input_the_callback_has(app):
    """The harness itself: each body carries one entry per input and state."""
    for key in CALLBACKS:
        spec = app.callback_map[key]
        body = request_body(app, key, {})
        assert len(body["inputs"]) == len(spec["inputs"])
        assert len(body["state"]) == len(spec["state"])


def test_the_watch_on_the_outside_sees_a_file_opened_there(outside, stocked):
    """The control for the property above: opening the secret run's file, directly or
    through the symlink inside the store, is seen."""
    hostile = stocked.hostile
    outside.found.clear()
    (hostile.outside / hostile.secret / "run.json").read_bytes()
    (hostile.runs / hostile.secret / "run.json").read_bytes()
    assert len(outside.found) == 2
    outside.found.clear()
