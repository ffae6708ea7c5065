"""``workbench dashboard``: serves the Dash app. The one module of the library that imports
``dashboards`` (an exception listed in pyproject's import-linter contract), and only when the
command runs."""

from __future__ import annotations

import argparse

from workbench.cli.render import _out
from workbench.core import paths


def cmd_dashboard(args: argparse.Namespace) -> None:
    from dashboards.app import check_host, create_app, serve

    check_host(args.host, args.debug)  # refuses --debug off loopback before anything is built
    runs = paths.runs_dir(args.runs)
    app = create_app(runs)
    _out(f"serving runs from {runs} at http://{args.host}:{args.port}/  (Ctrl-C stops)")
    serve(app, args.host, args.port, args.debug)  # warns when the host is not loopback
