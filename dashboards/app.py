"""Build the Dash app (the pages in ``pages/`` register themselves) and serve it safely."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

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
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""The names a request may give the server by, whatever ``--host`` and ``--allowed-hosts``."""
CLOSE_WAIT = 30.0
"""Seconds a shutting-down server gives the Live page's running job to stop and be stored
as failed."""


def create_app(runs_dir: str | Path, *, live: bool = False, host: str = "127.0.0.1",
               device: str = "cpu", allowed_hosts: Sequence[str] = (),
               live_models: Sequence[str] = ()) -> Dash:
    """The dashboard over the run store in ``runs_dir``.

    Every request must name the server by an allowed host (:func:`allowed_names`), and a
    request from a page (it has an ``Origin``) must come from the dashboard's own origin:
    a page elsewhere, or one that rebinds its own name to this machine's address, is
    answered 403 before anything runs.

    Args:
        runs_dir: the run store.
        live: serve the Live page's recordings (:func:`live_allowed` says when the command
            does); off, the page says why.
        host: where the app is served, for the Live page's word on why it is off, and
            an allowed name of the server.
        device: the torch device the Live page's models load on (checked by the caller:
            :func:`workbench.core.devices.check_device`).
        allowed_hosts: more names the server may be reached by (``--allowed-hosts``: a
            name a proxy or the network gives it).
        live_models: models the Live page offers beside the bundled ones
            (``--live-model``; checked by the caller: :func:`workbench.harness.live.known_models`).

    Example:
        >>> serve(create_app("data/runs", live=True), "127.0.0.1", 8050)   # doctest: +SKIP
    """
    app = Dash(__name__, use_pages=True, pages_folder=str(PAGES), title="workbench",
               suppress_callback_exceptions=True)
    app.server.config["WORKBENCH_RUNS_DIR"] = str(runs_dir)
    app.server.config["WORKBENCH_LIVE_OFF"] = None if live else live_off(host)
    app.server.config["WORKBENCH_LIVE_DEVICE"] = device
    app.server.config["WORKBENCH_ALLOWED_HOSTS"] = allowed_names(host, allowed_hosts)
    app.server.config["WORKBENCH_PROXY_HOSTS"] = frozenset(map(_name, allowed_hosts))
    if live:
        from workbench.harness.live import LiveQueue

        offered = [*live_models]
        app.server.extensions["workbench_live"] = LiveQueue(
            runs_dir, models=lambda: known_models(offered))
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
    app.server.before_request(_refuse_foreign_requests)  # first: before anything reads one
    app.server.before_request(lambda: _refuse_bad_address(app))
    return app


def known_models(extra: Sequence[str]) -> list[str]:
    from workbench.harness.live import known_models as known

    return known(extra)


def _name(host: str) -> str:
    """A host name as compared: lower case, without a trailing dot or IPv6 brackets."""
    return host.strip().lower().rstrip(".").strip("[]")


def allowed_names(host: str, extra: Sequence[str] = ()) -> frozenset[str]:
    """The names a request's ``Host`` may give the server: the loopback names, ``host``
    itself when it is one address (not ``0.0.0.0`` or ``::``, every interface), and
    ``extra`` (``--allowed-hosts``)."""
    names = {*LOOPBACK_NAMES, *map(_name, extra)}
    if _name(host) not in ("", "0.0.0.0", "::"):
        names.add(_name(host))
    return frozenset(names)


def _host_of(netloc: str) -> str | None:
    """The host name of ``host[:port]`` (``None``: not one)."""
    try:
        return urlsplit(f"//{netloc}").hostname
    except ValueError:
        return None


def _allowed(name: str | None, allowed: frozenset[str]) -> bool:
    if name is None:
        return False
    if _name(name) in allowed:
        return True
    try:  # any 127.x.x.x: only this machine reaches it, and no page can rebind it
        return ipaddress.ip_address(_name(name)).is_loopback
    except ValueError:
        return False


def foreign_request_problem(host: str, origin: str | None, allowed: frozenset[str],
                            proxies: frozenset[str] = frozenset(),
                            scheme: str = "http") -> str | None:
    """Why a request is refused (``None``: it is not).

    Args:
        host: its ``Host`` header (``name[:port]``).
        origin: its ``Origin`` header, which a browser sends with a page's requests.
        allowed: the names the server may be reached by (:func:`allowed_names`).
        proxies: the names given by ``--allowed-hosts``, whose pages may send requests
            whose ``Host`` a proxy rewrote.
        scheme: the request's scheme (an origin differs by scheme, host or port).
    """
    name = _host_of(host)
    if not _allowed(name, allowed):
        return (f"the server is not reached as {shown(name or host)}; it answers to "
                f"{', '.join(sorted(allowed))} (--allowed-hosts adds a name)")
    if origin is None:
        return None
    source = urlsplit(origin) if origin != "null" else None
    from_name = source.hostname if source is not None else None
    if (source is not None and from_name and source.scheme == scheme
            and source.netloc.lower() == host.lower()):
        return None  # the dashboard's own pages
    if from_name is not None and _name(from_name) in proxies:
        return None
    return f"a request from the page {shown(origin)}, not from this dashboard, is refused"


def _refuse_foreign_requests() -> flask.Response | None:
    """Answer 403 to a request that names the server by a name it does not answer to (a
    page that rebound its own name to this machine), or that a page of another origin
    sent, before Dash or a page reads it."""
    config = flask.current_app.config
    request = flask.request
    problem = foreign_request_problem(request.host, request.headers.get("Origin"),
                                      config["WORKBENCH_ALLOWED_HOSTS"],
                                      config["WORKBENCH_PROXY_HOSTS"], request.scheme)
    if problem is None:
        return None
    log.warning("refused %s %s: %s", request.method, request.path, problem)
    return flask.Response(f"refused: {problem}\n", status=403, mimetype="text/plain")


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
    try:
        if debug:
            app.run(host=host, port=port, debug=True)
            return
        without_debugger(app)
        app.run(host=host, port=port, debug=False, **DEV_TOOLS_OFF,
                use_reloader=False, use_debugger=False, use_evalex=False)
    finally:  # Ctrl-C, SIGTERM or an error: the Live page's jobs end, their runs say why
        close_live(app)


def close_live(app: Dash, timeout: float = CLOSE_WAIT) -> None:
    """Close the Live page's queue, if the app serves one: waiting jobs are dropped, a
    running one stops at its next layer and its run is stored as failed, saying the
    dashboard was shut down."""
    queue = app.server.extensions.get("workbench_live")
    if queue is not None and not queue.close(timeout, "the dashboard was shut down"):
        log.warning("a Live job did not stop within %g s; its run is left running", timeout)


def without_debugger(app: Dash) -> None:
    """Make ``app`` answer an unhandled error with Flask's plain 500 page: no debugger,
    no traceback, whatever ``FLASK_DEBUG`` or ``DASH_DEBUG`` say."""
    app.server.debug = False
    app.server.config.update(DEBUG=False, PROPAGATE_EXCEPTIONS=False,
                             TRAP_HTTP_EXCEPTIONS=False, TRAP_BAD_REQUEST_ERRORS=False)
