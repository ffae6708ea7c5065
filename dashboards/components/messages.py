"""A value the client should not have sent, or a run that cannot be read, becomes a
one-line message in the page, never an HTTP 500.

:func:`safe` wraps every callback. It first checks each value the client sent against the
type its parameter declares (:mod:`.values`), then runs the callback; a value that does
not fit, a :class:`WorkbenchError` (a :class:`ChecksumError` too) or an ``OSError`` raised
while it reads a run becomes a one-line message, in the page's ``<page>-error`` banner if
the callback writes one, else in each of its outputs: a ``figure`` becomes an empty figure
titled with the message (no bare axes), a ``children`` a ``wb-error`` line. Other outputs
are left as they were. :func:`safe_layout` does the same for a page's ``layout``. Any other
exception is a bug and still raises.

A callback that draws one run (exactly one parameter typed ``RunId``) has the run's
interventions added to the title of every figure it returns
(:func:`workbench.views.style.with_interventions`), so no page can draw a head-masked run
as if it were clean.

Examples:
    >>> @callback(Output("x-graph", "figure"), Input("x-run", "value"))  # doctest: +SKIP
    ... @safe
    ... def draw(run_id: RunId):
    ...     return figure_of(data.get_run(run_id, shows=["x"]))
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import dash
import plotly.graph_objects as go
from dash import dcc, html, no_update

from dashboards.components import data, values
from workbench.core.errors import WorkbenchError
from workbench.views.style import with_interventions

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
ERROR_COLOUR = "#b91c1c"
"""The colour of a message's text in a figure's title (``wb-error`` lines use it too)."""
READ_ERRORS = (WorkbenchError, OSError)
"""What reading a run may raise for reasons outside the dashboard's code."""


def one_line(exc: BaseException) -> str:
    """The error as one line (an OSError without a message names its type)."""
    text = " ".join(str(exc).split())
    if isinstance(exc, OSError) and not isinstance(exc, WorkbenchError):
        text = f"cannot read the run's files ({text or type(exc).__name__})"
    return text or type(exc).__name__


def message(text: str) -> html.Div:
    """A one-line error shown in the page."""
    return html.Div(text, className="wb-error")


def _plain(text: str) -> str:
    """``text`` as Plotly shows it verbatim: its titles read ``<br>``, ``<a>`` and
    entities as markup, and a message may quote what the client sent."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def message_figure(text: str) -> go.Figure:
    """An empty figure that says why it is empty, instead of bare axes."""
    fig = go.Figure()
    fig.update_layout(title={"text": _plain(text), "font": {"color": ERROR_COLOUR, "size": 14}},
                      xaxis={"visible": False}, yaxis={"visible": False}, height=160,
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def _is_banner(spec: Any) -> bool:
    return isinstance(spec, dict) and str(spec["id"]).endswith("-error")


def _fill(spec: Any, text: str, banner: bool) -> Any:
    if isinstance(spec, list):  # a pattern-matching output: one spec per component
        return [_fill(s, text, banner) for s in spec]
    if banner and not _is_banner(spec):
        return no_update
    prop = str(spec["property"]).split("@", 1)[0]  # an allow_duplicate output is "prop@hash"
    if prop == "figure":
        return message_figure(text)
    if prop == "children":
        return message(text)
    return no_update


def failed(text: str) -> Any:
    """The return value of the current callback that shows ``text`` in its outputs: in its
    page's ``<page>-error`` banner if it writes one, else in each figure and text."""
    spec = dash.callback_context.outputs_list
    if isinstance(spec, dict):
        return _fill(spec, text, banner=False)
    banner = any(_is_banner(s) for s in spec)
    return tuple(_fill(s, text, banner) for s in spec)


def _guarded(fn: F, label: str, on_error: Callable[[str], Any],
             check: Callable[[tuple], Sequence[Any]] = tuple) -> F:
    """``fn`` with its arguments passed through ``check`` first, and a refused argument or
    a failure to read a run logged under ``label`` and answered by ``on_error(one line)``
    instead of raised."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*check(args), **kwargs)
        except READ_ERRORS as exc:
            text = one_line(exc)
            log.warning("%s: %s", label, text)
            return on_error(text)
    return cast(F, wrapper)


def _figures_marked(out: Any, interventions: str) -> Any:
    """``out`` (one output or a tuple of them) with ``interventions`` in each figure's
    title; other outputs as they are."""
    if isinstance(out, go.Figure):
        return with_interventions(out, interventions)
    if isinstance(out, tuple | list):
        return type(out)(_figures_marked(o, interventions) for o in out)
    return out


def _has_figure(out: Any) -> bool:
    if isinstance(out, tuple | list):
        return any(_has_figure(o) for o in out)
    return isinstance(out, go.Figure)


def _marked(fn: F, run_at: int) -> F:
    """``fn``, whose argument ``run_at`` names the run it draws, with that run's
    interventions in the title of every figure it returns (a callback that returns no
    figure, such as a dropdown's search, reads nothing more)."""
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        out = fn(*args)
        if not args[run_at] or not _has_figure(out):
            return out
        # the run is opened once a request (flask.g), so this costs no second read
        text = data.listed_run(args[run_at]).interventions_text
        return _figures_marked(out, text) if text else out
    return cast(F, wrapper)


def safe(fn: F) -> F:
    """Check the callback's arguments against the types its parameters declare
    (:mod:`.values`), and show a refused one, or a failure to read a run, in the
    callback's outputs instead of raising. A callback that draws one run has its
    interventions added to its figures' titles.

    Raises:
        TypeError: at import, a parameter of ``fn`` declares no type.
    """
    specs = values.declared(fn)
    runs = [i for i, (_, spec) in enumerate(specs) if isinstance(spec, values.RunText)]
    drawn = _marked(fn, runs[0]) if len(runs) == 1 else fn
    wrapper = _guarded(drawn, fn.__qualname__, failed,
                       lambda args: values.checked(specs, args))
    wrapper.declared = specs  # type: ignore[attr-defined]  # read by the tests
    return wrapper


def refused(title: str, text: str) -> html.Div:
    """A page that could not be built: its heading, why, and the way back to the runs."""
    return html.Div([
        html.H2(title), message(text),
        html.P(["Open the ", dcc.Link("Runs", href=dash.get_relative_path("/")),
                " page to choose another run."], className="wb-note"),
    ])


def safe_layout(title: str) -> Callable[[F], F]:
    """Show a failure to read the store (a bad ``?run=``, an unreadable store) as the
    page's content instead of raising."""
    def decorate(fn: F) -> F:
        return _guarded(fn, f"{title} page", lambda text: refused(title, text))
    return decorate
