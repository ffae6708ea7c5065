"""``workbench.static_figures``: figures that carry a PNG and an SVG beside their Plotly form,
so that they show where no Plotly runs, and a clear warning where they cannot."""

from __future__ import annotations

import base64

import plotly.graph_objects as go
import plotly.io as pio
import pytest

import workbench
from workbench.views import static

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def renderer():
    before = pio.renderers.default
    yield
    pio.renderers.default = before


def test_a_figure_carries_a_png_and_an_svg_of_itself(renderer):
    assert workbench.static_figures() is True
    fig = go.Figure(go.Heatmap(z=[[0.0, 1.0], [2.0, 3.0]]), layout={"title": "L3H1"})
    bundle = fig._repr_mimebundle_({}, {})
    assert bundle["application/vnd.plotly.v1+json"]["data"][0]["z"] == [[0.0, 1.0], [2.0, 3.0]]
    assert base64.b64decode(bundle["image/png"]).startswith(PNG_MAGIC)
    assert bundle["image/svg+xml"].lstrip().startswith("<svg") and "L3H1" in bundle["image/svg+xml"]
    assert workbench.static_figures(False) is False
    assert "image/png" not in go.Figure()._repr_mimebundle_({}, {})


def test_without_a_browser_it_warns_and_keeps_figures_interactive(renderer, monkeypatch):
    def no_browser():
        raise RuntimeError("no Chromium found")

    monkeypatch.setattr(static, "_start_browser", no_browser)
    with pytest.warns(RuntimeWarning, match="no static images.*no Chromium found"):
        assert workbench.static_figures() is False
    assert pio.renderers.default == "plotly_mimetype"
