"""The figure helpers every view shares (:mod:`workbench.views.style`): colour scales, discrete
colours, wrapped titles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go
import pytest

from workbench.views import style


def _position_of(stops: list[list], level: float) -> float:
    """Where along 0..1 of the z range the scale puts the colour of ``level``."""
    colour = plotly.colors.sample_colorscale("Blues", [level])[0]
    return next(at for at, c in stops if c == colour)


def test_the_log_scale_puts_each_decade_an_equal_share_of_the_colours():
    stops = style.colour_stops("log")
    assert stops[0][0] == 0 and stops[-1][0] == pytest.approx(1)
    # four decades over the colours 0..1: 1e-2 of the range gets the middle colour
    assert _position_of(stops, 0.5) == pytest.approx(1e-2)
    assert _position_of(stops, 0.8) == pytest.approx(10 ** -0.8)
    assert [at for at, _ in stops] == sorted(at for at, _ in stops)


def test_the_power_scale_puts_the_middle_colour_at_a_quarter():
    assert _position_of(style.colour_stops("power"), 0.5) == pytest.approx(0.25)
    assert _position_of(style.colour_stops("linear"), 0.5) == pytest.approx(0.5)


def test_an_unknown_scale_names_the_known_ones():
    with pytest.raises(ValueError, match="linear, log, power"):
        style.colour_stops("sqrt")


def test_whole_numbers_get_one_band_a_level():
    assert style.discrete_levels(np.array([[0.0, 1.0], [1.0, np.nan]])) == [0, 1]
    assert style.discrete_levels(np.array([0.0, 0.5])) is None
    assert style.discrete_levels(np.arange(40.0)) is None  # too many levels
    stops = style.discrete_colours([0, 1, 2])
    assert [at for at, _ in stops] == pytest.approx([0, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 1])
    assert stops[0][1] == stops[1][1] != stops[2][1]


def test_a_mask_heatmap_is_drawn_in_two_colours_centred_on_its_values():
    scores = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "metric": "keep",
                           "score": [1.0, 0.0, 1.0, 1.0]})
    heat = style.head_heatmap(scores, "keep", zmin=0, zmax=1).data[0]
    assert (heat.zmin, heat.zmax) == (-0.5, 1.5)
    assert list(heat.colorbar.tickvals) == [0, 1]


def test_titles_wrap_at_word_boundaries_and_keep_their_breaks():
    title = "word " * 30 + "<br>second line"
    text = style.wrapped(title, width=40)
    lines = text.split("<br>")
    assert all(len(line) <= 40 for line in lines) and lines[-1] == "second line"
    assert " ".join(lines[:-1]).split() == title.split("<br>")[0].split()
    fig = style.set_title(go.Figure(), title, width=40)
    assert fig.layout.margin.t >= 30 + 14 * len(lines)
