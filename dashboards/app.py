"""Build the Dash app; the pages in ``pages/`` register themselves."""

from __future__ import annotations

from pathlib import Path

import dash
from dash import Dash, dcc, html

PAGES = Path(__file__).parent / "pages"


def create_app(runs_dir: str | Path) -> Dash:
    """The dashboard over the run store in ``runs_dir``.

    Example:
        >>> create_app("data/runs").run(port=8050)   # doctest: +SKIP
    """
    app = Dash(__name__, use_pages=True, pages_folder=str(PAGES), title="workbench",
               suppress_callback_exceptions=True)
    app.server.config["WORKBENCH_RUNS_DIR"] = str(runs_dir)
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
    return app
