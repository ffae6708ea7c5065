"""``workbench dashboard``: serves the Dash app. The one module of the library that imports
``dashboards`` (an exception listed in pyproject's import-linter contract), and only when the
command runs."""

from __future__ import annotations

import argparse

from workbench.cli.render import _out
from workbench.core import paths
from workbench.core.devices import chosen_device


def cmd_dashboard(args: argparse.Namespace) -> None:
    from dashboards.app import check_host, create_app, known_models, live_allowed, serve

    check_host(args.host, args.debug)  # refuses --debug off loopback before anything is built
    device = chosen_device(args.device)  # refused before anything is built or loaded
    live_models = args.live_model or []
    known_models(live_models)  # a --live-model that is not a model: refused before serving
    runs = paths.runs_dir(args.runs)
    app = create_app(runs, live=live_allowed(args.host, args.allow_live), host=args.host,
                     device=device, allowed_hosts=args.allowed_hosts or [],
                     live_models=live_models)
    _out(f"serving runs from {runs} at http://{args.host}:{args.port}/  (Ctrl-C stops)")
    # warns when the host is not loopback, and what --allow-live means there
    serve(app, args.host, args.port, args.debug, allow_live=args.allow_live)
