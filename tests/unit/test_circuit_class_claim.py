"""The circuit claim about another run's head classes: ``class_in_circuit`` on stored fake
runs (an ioi run's classes, a circuit run's edges and faithfulness grid), whose nested
circuits are written by hand, judged against the faithfulness intervals."""

from __future__ import annotations

import math

import pandas as pd
import pytest

import experiments.ioi  # noqa: F401 (registers the ioi experiment, whose tables are read)
from experiments.circuit.checks import class_in_circuit
from experiments.circuit.measure import circuit_heads
from experiments.circuit.tables import TABLES as CIRCUIT_TABLES
from experiments.ioi.tables import TABLES as IOI_TABLES
from tests import tiny
from workbench.store.runs import RunStore

INFO = tiny.fake_info("fake", n_layers=2, n_heads=4)  # 8 heads

# by rank: the circuit of the top 1 edge has L1H2; of 2, L0H1 too (a q input); of 3, L0H3
# (the embedding into its q); the MLP edge adds no head; of 5, L0H0
EDGES = pd.DataFrame({
    "sender": ["L1H2", "L0H1", "embed", "L0MLP", "L0H0"],
    "receiver": ["logits", "L1H2.q", "L0H3.q", "L1MLP.in", "logits"],
    "sender_layer": [1, 0, -1, 0, 0], "receiver_layer": [2, 1, 0, 1, 2],
    "receiver_input": ["logits", "q", "q", "mlp", "logits"],
    "score": [5.0, -4.0, 3.0, 2.0, 1.0], "rank": [1, 2, 3, 4, 5], "exact": math.nan})
HEADS_AT = {1: ["L1H2"], 2: ["L0H1", "L1H2"], 3: ["L0H1", "L0H3", "L1H2"],
            4: ["L0H1", "L0H3", "L1H2"], 5: ["L0H0", "L0H1", "L0H3", "L1H2"]}
# the smallest circuit whose interval reaches 0.8 has 2 edges, whose point reaches it 2,
# whose whole interval is at or above it 3
CURVE = pd.DataFrame({"fraction": [0.2, 0.4, 0.6, 1.0], "n_edges": [1, 2, 3, 5],
                      "faithfulness": [0.5, 0.85, 0.9, 1.0],
                      "ci_low": [0.3, 0.78, 0.85, 1.0], "ci_high": [0.7, 0.95, 0.95, 1.0]})


def _ioi_run(store: RunStore, movers: list[str], claimed: bool = True,
             head_class: str = "name mover") -> str:
    rows = pd.DataFrame({
        "head_class": head_class, "layer": [int(h[1]) for h in movers],
        "head": [int(h[3]) for h in movers], "effect": 0.5, "ci_low": 0.1, "ci_high": 0.9,
        "attention": 0.4, "claimed": claimed, "criterion": "by hand", "n_prompts": 8})
    with store.start("ioi", INFO, {"n_prompts": 8},
                     tables={"classes": IOI_TABLES["classes"]}) as run:
        run.save_table("classes", rows)
    return run.final.name


def _circuit_run(store: RunStore, source: str, curve: pd.DataFrame = CURVE):
    names = ("edges", "faithfulness")
    with store.start("circuit", INFO, {"classes_from": source, "ablation": "corrupted"},
                     tables={n: CIRCUIT_TABLES[n] for n in names}) as run:
        run.save_table("edges", EDGES)
        run.save_table("faithfulness", curve)
    return store.get(run.final.name)


def test_circuit_heads_are_nested_prefixes_of_the_edges():
    for n, heads in HEADS_AT.items():
        assert circuit_heads(EDGES, n) == heads


@pytest.mark.parametrize("movers, verdict, low, high", [
    (["L1H2", "L0H1"], "pass", 1.0, 1.0),      # both in the 2-edge circuit
    (["L1H2", "L0H3"], "undecided", 0.5, 1.0),  # L0H3 only from 3 edges
    (["L1H2", "L0H0"], "fail", 0.5, 0.5),       # L0H0 not even in the 3-edge circuit
])
def test_name_movers_judged_on_the_faithfulness_intervals(runs_dir, movers, verdict, low,
                                                           high):
    store = RunStore(runs_dir)
    run = _circuit_run(store, _ioi_run(store, movers))
    measured = class_in_circuit(run, head_class="name mover", level=0.8)
    assert measured.outcome == verdict
    assert (measured.ci_low, measured.ci_high, measured.threshold) == (low, high, 1.0)
    assert measured.value == low  # the point estimate reaches 0.8 with the 2-edge circuit
    assert "2 edges (0.4), f = 0.850 [0.780, 0.950]: 2 of 8 heads" in measured.measured
    assert "3 edges (0.6)" in measured.measured


def test_a_class_the_ioi_run_does_not_claim_is_undecided(runs_dir):
    store = RunStore(runs_dir)
    unclaimed = _circuit_run(store, _ioi_run(store, ["L1H2"], claimed=False))
    measured = class_in_circuit(unclaimed, head_class="name mover")
    assert measured.outcome == "undecided" and "claims no name mover" in measured.measured
    empty = _circuit_run(store, _ioi_run(store, ["L1H2"], head_class="negative name mover"))
    measured = class_in_circuit(empty, head_class="name mover")
    assert measured.outcome == "undecided"
    assert "puts no head in the name mover class" in measured.measured


def test_no_circuit_reaching_the_level_is_undecided(runs_dir):
    store = RunStore(runs_dir)
    low = CURVE.assign(faithfulness=0.5, ci_low=0.4, ci_high=0.6)
    run = _circuit_run(store, _ioi_run(store, ["L1H2"]), low)
    measured = class_in_circuit(run, head_class="name mover", level=0.8)
    assert measured.outcome == "undecided" and "no circuit of the grid" in measured.measured
    # a grid whose intervals reach the level without one lying wholly above it cannot fail
    reach = CURVE.assign(ci_low=[0.3, 0.7, 0.7, 0.7])
    run = _circuit_run(store, _ioi_run(store, ["L1H2", "L0H0"]), reach)
    measured = class_in_circuit(run, head_class="name mover", level=0.8)
    assert (measured.outcome, measured.ci_low, measured.ci_high) == ("undecided", 0.5, 1.0)
