"""The IOI class diagram against hand-built tables: which arrows, in which direction, how
wide; empty classes as labelled groups; candidates named, never drawn as the class."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.views import circuit


def _classes(rows):
    return pd.DataFrame([{"head_class": c, "layer": la, "head": h, "effect": e,
                          "ci_low": e - 0.05, "ci_high": e + 0.05, "attention": 0.5,
                          "claimed": True, "criterion": "stated", "n_prompts": 8}
                         for c, la, h, e in rows])


def _paths(rows):
    return pd.DataFrame([{"layer": la, "head": h, "receivers": "L9H9 L9H6", "path": "q",
                          "effect": e, "ci_low": e - 0.1, "ci_high": e + 0.1,
                          "attention_s2": 0.4, "n_prompts": 8} for la, h, e in rows])


def _upstream(rows):
    return pd.DataFrame([{"layer": la, "head": h, "receiver_kind": kind, "receivers": who,
                          "path": "kv" if kind.startswith("s-") else "k", "effect": e,
                          "ci_low": e - 0.1, "ci_high": e + 0.1, "attention_s2_s1": 0.3,
                          "attention_s2_s1p1": 0.3, "attention_s1p1_s1": 0.3,
                          "n_prompts": 8} for la, h, kind, who, e in rows])


CLASSES = _classes([("name mover", 9, 9, 2.0), ("name mover", 9, 6, 1.0),
                    ("negative name mover", 10, 7, -1.5), ("s-inhibition", 8, 6, -0.3),
                    ("s-inhibition", 7, 3, -0.15), ("induction", 5, 5, -0.2),
                    ("duplicate-token", 3, 0, -0.1)])
PATHS = _paths([(8, 6, -0.3), (7, 3, -0.15), (6, 0, -0.5)])  # L6H0 is in no class
UPSTREAM = _upstream([(5, 5, "s-inhibition", "L8H6 L7H3", -0.2),
                      (3, 0, "s-inhibition", "L8H6 L7H3", -0.1),
                      (4, 4, "s-inhibition", "L8H6 L7H3", -0.9),   # in no class
                      (2, 2, "induction", "L5H5", -0.4)])           # in no class

# widths by hand: 1 + 7 x |effect| / the largest |effect| of its unit among the arrows
# (logits: 2.0; relative changes: 0.3, those of heads in no class left out)
WANT = {("L9H9", "logits"): 8.0, ("L9H6", "logits"): 4.5, ("L10H7", "logits"): 6.25,
        ("L8H6", "name mover"): 8.0, ("L7H3", "name mover"): 4.5,
        ("L5H5", "s-inhibition"): 1 + 7 * 0.2 / 0.3, ("L3H0", "s-inhibition"): 1 + 7 / 3}


def test_the_arrows_are_the_classes_heads_into_what_they_were_measured_through():
    got = {(a.sender, a.receiver): a.width for a in circuit.arrows(CLASSES, PATHS, UPSTREAM)}
    assert got.keys() == WANT.keys()
    for key, width in WANT.items():
        assert got[key] == pytest.approx(width), key


def test_the_figure_draws_each_arrow_from_its_head_to_its_group():
    fig = circuit.circuit_figure(CLASSES, PATHS, UPSTREAM)
    heads = fig.data[0]
    at = {(text, c): (x, y) for text, x, y, c in zip(heads.text, heads.x, heads.y,
                                                     CLASSES.head_class, strict=True)}
    drawn = [a for a in fig.layout.annotations if a.showarrow]
    assert len(drawn) == len(WANT)
    column = {cls: col for cls, col, _ in circuit.GROUPS} | {"logits": circuit.LOGITS_COLUMN}
    sender_class = dict(zip(CLASSES.apply(lambda r: f"L{r.layer}H{r['head']}", axis=1),
                            CLASSES.head_class, strict=True))
    for a in drawn:
        sender, receiver = a.name.split(" (")[0], a.name.split("-> ")[1]
        assert a.arrowwidth == pytest.approx(WANT[(sender, receiver)])
        # the tail at the sender's node, the head at the receiving group's left edge,
        # one column to the right or more: information flows left to right
        x, y = at[(sender, sender_class[sender])]
        assert (a.ax, a.ay) == pytest.approx((x + 0.12, y))
        assert a.x == pytest.approx(column[receiver] - circuit.HALF_WIDTH)
        assert column[receiver] > x
    labels = dict(zip(fig.data[1].hovertext, fig.data[1].text, strict=True))
    mover = next(h for h in labels if h.startswith("L9H9"))
    assert labels[mover] == "+2.00" and "[+1.950, +2.050] logits" in mover
    inhibition = next(h for h in labels if h.startswith("L8H6"))
    assert labels[inhibition] == "-30%" and "[-0.400, -0.200]" in inhibition


def test_a_class_without_heads_is_an_empty_labelled_group_naming_its_candidates():
    classes = CLASSES[CLASSES.head_class.isin(["name mover", "negative name mover"])]
    upstream = _upstream([(5, 5, "s-inhibition candidates", "L8H6 L7H3", -0.2)])
    fig = circuit.circuit_figure(classes, PATHS, upstream)
    notes = {a.name: a.text for a in fig.layout.annotations if not a.showarrow}
    for cls in ("previous-token", "induction", "duplicate-token", "s-inhibition"):
        assert notes[f"group {cls}"] == f"<b>{cls} (0)</b>"
        assert notes[f"empty {cls}"].startswith(circuit.NO_HEAD)
    assert "candidates L8H6 L7H3" in notes["empty s-inhibition"]
    assert "candidates" not in notes["empty induction"]
    assert "empty name mover" not in notes
    # only the name movers' arrows: the candidates' senders are in no class
    assert {a.name.split(" (")[0] for a in fig.layout.annotations if a.showarrow} == {
        "L9H9", "L9H6", "L10H7"}
    dashed = [s for s in fig.layout.shapes if s.line.dash == "dash"]
    assert len(dashed) == 4


def test_a_run_without_upstream_tables_or_classes_still_draws():
    fig = circuit.circuit_figure(_classes([]).iloc[0:0], _paths([]).iloc[0:0], None)
    assert not [a for a in fig.layout.annotations if a.showarrow]
    assert len([a for a in fig.layout.annotations if (a.name or "").startswith("empty")]) == 6
