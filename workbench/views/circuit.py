"""The IOI class diagram: Wang et al.'s circuit figure (2022, figure 2) drawn from an ioi
run's tables.

Groups of heads by class, left to right in the order information flows: previous-token ->
induction and duplicate-token -> S-inhibition -> name movers and negative name movers ->
logits. A head is a node in its class's group (a head in two classes is in both); a class
with no head is an empty, dashed group that says "no head meets the criterion" (and, where
the run path-patched through that class's candidates, names them: candidates are never
drawn as the class). Each arrow goes from a head to the group it was measured into, read
from the stored tables: a name mover's direct effect into the logits (``classes``, in
logits), an S-inhibition head's path patch into the name movers' queries
(``path_patching``), a duplicate-token or induction head's into the S-inhibition heads'
keys and values and a previous-token head's into the induction heads' keys
(``upstream_paths``; relative changes of the logit difference). An arrow's width is its
effect over the largest of its kind (logits, relative change); its label is the effect;
hovering over the label shows the 95% interval.

Examples:
    >>> fig = circuit_figure(run.table("classes"), run.table("path_patching"),  # doctest: +SKIP
    ...                      run.table("upstream_paths"))
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

GROUPS = (("previous-token", 0, 0.5), ("induction", 1, 0.0), ("duplicate-token", 1, 1.0),
          ("s-inhibition", 2, 0.5), ("name mover", 3, 0.0), ("negative name mover", 3, 1.0))
"""Each class's group: its column (left to right) and row (0 upper, 1 lower, 0.5 centred)."""
LOGITS = "logits"
LOGITS_COLUMN = 4
INTO = {"name mover": LOGITS, "negative name mover": LOGITS, "s-inhibition": "name mover",
        "duplicate-token": "s-inhibition", "induction": "s-inhibition",
        "previous-token": "induction"}
"""The group each class's arrows go into."""
UPSTREAM_KIND = {"duplicate-token": "s-inhibition", "induction": "s-inhibition",
                 "previous-token": "induction"}
"""The ``upstream_paths.receiver_kind`` each upstream class was measured through."""
MIN_WIDTH, MAX_WIDTH = 1.0, 8.0
STEP = 0.5
"""Vertical distance between two heads of a group."""
HALF_WIDTH = 0.32
NO_HEAD = "no head meets the criterion"
COLOURS = {"negative name mover": "#dc2626"}
COLOUR = "#374151"


@dataclass(frozen=True)
class Arrow:
    """One arrow: a head of ``sender_class`` into the group ``receiver``."""

    sender: str
    sender_class: str
    receiver: str
    effect: float
    ci_low: float
    ci_high: float
    unit: str
    """``logits`` (a direct effect) or ``relative`` (a path patch's relative change)"""
    width: float = MIN_WIDTH

    @property
    def name(self) -> str:
        return f"{self.sender} ({self.sender_class}) -> {self.receiver}"

    def label(self) -> str:
        return f"{self.effect:+.2f}" if self.unit == "logits" else f"{self.effect:+.0%}"


def _head(row) -> str:
    return f"L{int(row.layer)}H{int(row.head)}"


def _measured(rows: pd.DataFrame, layer: int, head: int) -> pd.Series | None:
    mine = rows[(rows.layer == layer) & (rows["head"] == head)]
    return mine.iloc[0] if len(mine) else None


def arrows(classes: pd.DataFrame, paths: pd.DataFrame, upstream: pd.DataFrame | None
           ) -> list[Arrow]:
    """The diagram's arrows, each head of a class into the group it was measured into,
    with the effect stored for that measurement and its width (its effect over the largest
    of its unit, scaled between ``MIN_WIDTH`` and ``MAX_WIDTH``)."""
    upstream = upstream if upstream is not None else pd.DataFrame(columns=["receiver_kind"])
    found: list[Arrow] = []
    for r in classes.to_dict("records"):
        kind, layer, head = str(r["head_class"]), int(r["layer"]), int(r["head"])
        if kind not in INTO:
            continue
        source, unit = None, "relative"
        if kind in ("name mover", "negative name mover"):
            source, unit = pd.Series({"effect": r["effect"], "ci_low": r["ci_low"],
                                      "ci_high": r["ci_high"]}), "logits"
        elif kind == "s-inhibition":
            source = _measured(paths, layer, head)
        else:
            through = upstream[upstream.receiver_kind == UPSTREAM_KIND[kind]]
            source = _measured(through, layer, head)
        if source is not None:
            found.append(Arrow(f"L{layer}H{head}", kind, INTO[kind],
                               float(source.effect), float(source.ci_low),
                               float(source.ci_high), unit))
    largest = {unit: max(abs(a.effect) for a in found if a.unit == unit)
               for unit in {a.unit for a in found}}
    return [Arrow(**{**a.__dict__, "width": MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * (
        abs(a.effect) / largest[a.unit] if largest[a.unit] else 0.0)}) for a in found]


def _candidates(upstream: pd.DataFrame | None) -> dict[str, str]:
    """``{class: its candidates}`` of the classes the run path-patched through candidates."""
    if upstream is None or not len(upstream):
        return {}
    mine = upstream[upstream.receiver_kind.str.endswith(" candidates")]
    return {str(kind).removesuffix(" candidates"): str(rows.receivers.iloc[0])
            for kind, rows in mine.groupby("receiver_kind")}


def _layout_of(classes: pd.DataFrame) -> tuple[dict, dict]:
    """``{class: (x, y centre, half height, [heads])}`` and ``{(class, head): (x, y)}``."""
    heads = {cls: [_head(r) for r in classes[classes.head_class == cls].itertuples()]
             if len(classes) else [] for cls, _, _ in GROUPS}
    half = {cls: STEP * max(len(h) - 1, 0) / 2 + 0.35 for cls, h in heads.items()}
    spread = max(half.values()) + 0.25
    groups, nodes = {}, {}
    for cls, column, row in GROUPS:
        centre = spread * (1 - 2 * row)
        groups[cls] = (column, centre, half[cls], heads[cls])
        for i, head in enumerate(heads[cls]):
            nodes[(cls, head)] = (column, centre + STEP * ((len(heads[cls]) - 1) / 2 - i))
    groups[LOGITS] = (LOGITS_COLUMN, 0.0, 0.35, [])
    return groups, nodes


def _hover(r) -> str:
    unit = " logits" if r.head_class in ("name mover", "negative name mover") else ""
    return (f"L{int(r.layer)}H{int(r.head)}, {r.head_class}<br>effect {r.effect:+.3f} "
            f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]{unit}, attention {r.attention:.2f}"
            f"<br>{r.criterion}")


def _group_shapes(groups: dict, candidates: dict[str, str]) -> tuple[list, list]:
    shapes, notes = [], []
    for cls, (x, y, half, heads) in groups.items():
        empty = not heads and cls != LOGITS
        shapes.append({"type": "rect", "x0": x - HALF_WIDTH, "x1": x + HALF_WIDTH,
                       "y0": y - half, "y1": y + half, "layer": "below",
                       "line": {"color": "#9ca3af", "dash": "dash" if empty else "solid"},
                       "fillcolor": "#f9fafb" if empty else "#eef2ff"})
        title = cls if cls == LOGITS else f"{cls} ({len(heads)})"
        notes.append({"x": x, "y": y + half, "text": f"<b>{title}</b>", "showarrow": False,
                      "yanchor": "bottom", "name": f"group {cls}"})
        if empty:
            said = NO_HEAD + (f"<br>(path-patched through<br>candidates {candidates[cls]})"
                              if cls in candidates else "")
            notes.append({"x": x, "y": y, "text": said, "showarrow": False,
                          "font": {"size": 10, "color": "#6b7280"}, "name": f"empty {cls}"})
    return shapes, notes


def circuit_figure(classes: pd.DataFrame, paths: pd.DataFrame,
                   upstream: pd.DataFrame | None) -> go.Figure:
    """The class diagram of one ioi run (``upstream`` ``None`` for a run written before
    the upstream path patches)."""
    groups, nodes = _layout_of(classes)
    shapes, notes = _group_shapes(groups, _candidates(upstream))
    drawn = arrows(classes, paths, upstream)
    mid_x, mid_y, labels, hovers = [], [], [], []
    for a in drawn:
        x0, y0 = nodes[(a.sender_class, a.sender)]
        x1, y1, _, _ = groups[a.receiver]
        x1 -= HALF_WIDTH
        notes.append({"x": x1, "y": y1, "ax": x0 + 0.12, "ay": y0, "xref": "x", "yref": "y",
                      "axref": "x", "ayref": "y", "text": "", "showarrow": True,
                      "arrowhead": 2, "arrowwidth": a.width, "name": a.name,
                      "arrowcolor": COLOURS.get(a.sender_class, COLOUR), "opacity": 0.7})
        mid_x.append((x0 + x1) / 2 + 0.06)
        mid_y.append((y0 + y1) / 2)
        labels.append(a.label())
        unit = " logits" if a.unit == "logits" else " of the logit difference"
        hovers.append(f"{a.name}<br>{a.effect:+.3f} [{a.ci_low:+.3f}, {a.ci_high:+.3f}]{unit}"
                      "<br>95% bootstrap interval over prompts")
    members = classes[classes.head_class.isin(INTO)] if len(classes) else classes
    fig = go.Figure([
        go.Scatter(x=[nodes[(r.head_class, _head(r))][0] for r in members.itertuples()],
                   y=[nodes[(r.head_class, _head(r))][1] for r in members.itertuples()],
                   text=[_head(r) for r in members.itertuples()], name="heads",
                   hovertext=[_hover(r) for r in members.itertuples()], hoverinfo="text",
                   mode="markers+text", textposition="middle left", marker={"size": 10}),
        go.Scatter(x=mid_x, y=mid_y, text=labels, hovertext=hovers, hoverinfo="text",
                   mode="text", name="effects", textfont={"size": 10}),
        go.Scatter(x=[LOGITS_COLUMN], y=[0.0], text=["logit(IO) - logit(S)"], mode="text",
                   hoverinfo="skip", name=LOGITS, textposition="middle center")])
    fig.update_layout(
        shapes=shapes, annotations=notes, showlegend=False, height=560, plot_bgcolor="white",
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
        title="IOI circuit: the heads of each class and the path patches between them "
              "(arrow width: effect; hover a label for its interval)",
        xaxis={"visible": False, "range": [-0.6, LOGITS_COLUMN + 0.6]},
        yaxis={"visible": False})
    return fig
