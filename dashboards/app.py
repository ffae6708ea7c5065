"""Build the Dash app (the pages in ``pages/`` register themselves) and serve it safely."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import dash
import flask
from dash import Dash, dcc, html
from plotly.io.json import to_json_plotly

from dashboards.components.messages import refused
from dashboards.components.values import MAX_CHARS, Refused, Text, shown
from workbench.core.errors import WorkbenchError

log = logging.getLogger(__name__)

PAGES = Path(__file__).parent / "pages"

DEBUG_REFUSED = ("--debug serves an interactive debugger; it is refused on a non-loopback "
                 "host")
# Dash's debug mode turns all of these on; each is named off so no DASH_* variable of the
# environment turns one back on behind a server that is not in debug mode.
DEV_TOOLS_OFF = {"dev_tools_ui": False, "dev_tools_props_check": False,
                 "dev_tools_serve_dev_bundles": False, "dev_tools_hot_reload": False,
                 "dev_tools_prune_errors": False}
ROUTER = ".._pages_content.children..._pages_store.data.."
"""The callback of Dash's pages that answers an address with its page's layout."""
ADDRESS = Text(max_chars=10 * MAX_CHARS)
"""The router's address and query: text, as a browser's location always is."""


def create_app(runs_dir: str | Path, *, live: bool = False, host: str = "127.0.0.1",
               device: str = "cpu") -> Dash:
    """The dashboard over the run store in ``runs_dir``.

    Args:
        runs_dir: the run store.
        live: serve the Live page's recordings (:func:`live_allowed` says when the command
            does); off, the page says why.
        host: where the app is served, for the Live page's word on why it is off.
        device: the torch device the Live page's models load on (checked by the caller:
            :func:`workbench.core.devices.check_device`).

    Example:
        >>> serve(create_app("data/runs", live=True), "127.0.0.1", 8050)   # doctest: +SKIP
    """
    app = Dash(__name__, use_pages=True, pages_folder=str(PAGES), title="workbench",
               suppress_callback_exceptions=True)
    app.server.config["WORKBENCH_RUNS_DIR"] = str(runs_dir)
    app.server.config["WORKBENCH_LIVE_OFF"] = None if live else live_off(host)
    app.server.config["WORKBENCH_LIVE_DEVICE"] = device
    if live:
        from workbench.harness.live import LiveQueue

        app.server.extensions["workbench_live"] = LiveQueue(runs_dir)
    app.layout = html.Div(className="wb", children=[
        html.Header(className="wb-nav", children=[
            html.Span("workbench", className="wb-brand"),
            html.Nav([dcc.Link(page["name"], href=page["relative_path"], className="wb-link",
                               id=f"nav-{page['module'].split('.')[-1]}")
                      for page in dash.page_registry.values()]),
            html.Span(str(runs_dir), className="wb-runs-dir"),
        ]),
        html.Main(dash.page_container),
    ])
    app.server.before_request(lambda: _refuse_bad_address(app))
    return app


def _address_problem(app: Dash, body: object) -> str | None:
    """Why the router's request ``body`` names no address (``None``: it names one, or it
    is not a request to the router)."""
    if not isinstance(body, dict) or body.get("output") != ROUTER:
        return None
    prefix = app.config.requests_pathname_prefix
    for item in body.get("inputs") or []:
        if not isinstance(item, dict):
            continue  # not a request Dash can read at all: it answers it itself
        label = "query" if item.get("property") == "search" else "address"
        try:
            value = ADDRESS.check(label, item.get("value"))
        except Refused as exc:
            return str(exc)
        if label == "address" and value is not None and not value.startswith(prefix):
            return f"address: expected a path under {prefix}, got {shown(value)}"
    return None


def _refuse_bad_address(app: Dash) -> flask.Response | None:
    """Answer a request to the page router whose address is not text under the app's
    path (Dash's router raises on one) with a page that says so, before Dash reads it.

    The pages' own callbacks check their values themselves (:mod:`.components.values`);
    the router is Dash's.
    """
    request = flask.request
    if request.path != app.config.routes_pathname_prefix + "_dash-update-component":
        return None
    problem = _address_problem(app, request.get_json(silent=True))
    if problem is None:
        return None
    log.warning("page router: %s", problem)
    answer = {"multi": True, "response": {
        "_pages_content": {"children": refused(app.title, problem)},
        "_pages_store": {"data": {"title": app.title}}}}
    return flask.Response(to_json_plotly(answer), mimetype="application/json")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only: ``localhost``, 127.0.0.0/8 or
    ``::1``. Any other name, and ``0.0.0.0`` or ``""`` (every interface), is not."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def live_allowed(host: str, allow_live: bool) -> bool:
    """Whether the Live page records prompts: on a loopback host, or with ``--allow-live``
    (it runs a model for whoever reaches the server)."""
    return allow_live or is_loopback(host)


def live_off(host: str) -> str:
    """Why the Live page is off on ``host``, as the page says it."""
    if is_loopback(host):
        return "the Live page is off in this app (create_app(..., live=True) serves it)"
    return (f"the Live page is off: this dashboard is served on {host}, which is not a "
            "loopback address, and the page lets anyone who reaches the server run a model "
            "on this machine; start it with `workbench dashboard --allow-live` to serve it "
            "anyway")


def check_host(host: str, debug: bool, allow_live: bool = False) -> str | None:
    """Whether the dashboard may be served on ``host``, before anything is built.

    Returns:
        ``None`` for a loopback host, else the warning to show: the runs become readable
        to the network, and with ``allow_live`` anyone who reaches it runs models here
        (without it the Live page is off).

    Raises:
        WorkbenchError: ``debug`` with a host that is not loopback (the debugger runs code
            for whoever reaches it).
    """
    if is_loopback(host):
        return None
    if debug:
        raise WorkbenchError(f"{DEBUG_REFUSED} (--host {host}); use --host 127.0.0.1")
    live = ("--allow-live: anyone who reaches it can also run models on this machine "
            "(the Live page)" if allow_live else
            "the Live page is off (--allow-live serves it)")
    return (f"--host {host} is not a loopback address: every run in the store becomes "
            f"readable to anyone on the network who can reach this port; {live}")


def serve(app: Dash, host: str, port: int, debug: bool = False,
          allow_live: bool = False) -> None:
    """Serve ``app`` until interrupted.

    The Werkzeug debugger and Dash's dev tools are on only with ``debug`` on a loopback
    host; otherwise a callback that fails answers a bare HTTP 500 (its traceback goes to
    the log, not to the client). A host that is not loopback is logged as a warning.

    Raises:
        WorkbenchError: ``debug`` on a host that is not loopback, or a port outside
            1..65535.
    """
    warning = check_host(host, debug, allow_live)
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise WorkbenchError(f"--port {port} is not a port; expected 1..65535")
    if warning:
        log.warning("%s", warning)
    if debug:
        app.run(host=host, port=port, debug=True)
        return
    without_debugger(app)
    app.run(host=host, port=port, debug=False, **DEV_TOOLS_OFF,
            use_reloader=False, use_debugger=False, use_evalex=False)


def without_debugger(app: Dash) -> None:
    """Make ``app`` answer an unhandled error with Flask's plain 500 page: no debugger,
    no traceback, whatever ``FLASK_DEBUG`` or ``DASH_DEBUG`` say."""
    app.server.debug = False
    app.server.config.update(DEBUG=False, PROPAGATE_EXCEPTIONS=False,
                             TRAP_HTTP_EXCEPTIONS=False, TRAP_BAD_REQUEST_ERRORS=False)
