"""Figures that travel: each Plotly figure a notebook shows can also carry a static PNG and
SVG image, so that an executed notebook shows its figures where no Plotly runs (nbconvert's
HTML, the documentation site, a notebook viewer).

The images are drawn by kaleido with the Chromium the system has (Debian's ``chromium``), in
one browser kept open for the kernel's life, so nothing is downloaded and a figure costs
about half a second more. Example, in a notebook's first cell::

    import workbench
    workbench.static_figures()     # every figure shown from here on carries PNG and SVG
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["RENDERER", "static_figures"]

log = logging.getLogger(__name__)

RENDERER = "plotly_mimetype+png+svg"
"""The Plotly renderer that :func:`static_figures` makes the default: the interactive
figure (``application/vnd.plotly.v1+json``, which JupyterLab draws), a PNG and an SVG."""

_INTERACTIVE = "plotly_mimetype"


def static_figures(enable: bool = True) -> bool:
    """Make every Plotly figure displayed from now on carry a static PNG and SVG beside
    its interactive form (``enable=False``: the interactive form alone again).

    Returns:
        Whether figures now carry static images: ``False``, with one warning that says
        what is missing, where kaleido cannot start a Chromium.
    """
    import plotly.io as pio

    if not enable:
        pio.renderers.default = _INTERACTIVE
        return False
    try:
        _start_browser()
    except Exception as exc:  # kaleido missing, or no Chromium it can start
        warnings.warn(f"figures keep their interactive form only: no static images "
                      f"({type(exc).__name__}: {exc}); install kaleido and Chromium "
                      "(Debian: apt-get install chromium)", RuntimeWarning, stacklevel=2)
        pio.renderers.default = _INTERACTIVE
        return False
    pio.renderers.default = RENDERER
    return True


def _start_browser() -> None:
    """Start kaleido's browser once, and draw an empty figure to prove it works."""
    import kaleido
    import plotly.graph_objects as go
    import plotly.io as pio

    with warnings.catch_warnings():  # kaleido's server takes no per-call browser options
        warnings.filterwarnings("ignore", message="The kopts argument is ignored")
        try:
            kaleido.start_sync_server(silence_warnings=True)
        except RuntimeError as exc:  # already started in this kernel
            log.debug("kaleido's server: %s", exc)
        pio.to_image(go.Figure(), format="png")
    warnings.filterwarnings("ignore", message="The kopts argument is ignored")
