"""Crafted values in every numeric, index and choice input of every page are refused with
one specific line in the page and HTTP 200, over a store with a real run of every kind.

Each case posts one callback through Dash's endpoint (``/_dash-update-component``) as a
browser would, with the page's other inputs valid and one value crafted: a string where a
number belongs, NaN, Infinity, a bool, a float where a whole number belongs, a number out
of range or beyond the run's data, an over-long string, a nested object, a list where a
scalar belongs. The message is compared whole: it names the input, what it expects and
what came. The values a browser does send (``null`` before a control is set) keep working.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from dashboards.app import create_app
from dashboards.components.values import MAX_INDEX
from tests.dashboard_runs import callback_key, messages_in, post_callback
from tests.robustness.test_dashboard_paths import MARKER
from workbench.store.runs import RunStore

WHOLE = f"a whole number 0..{MAX_INDEX}"
TEXT = "text of at most 200 characters on one line"
LONG = "x" * 500
NAN, INF = math.nan, math.inf

# the page's valid values, one of which a case replaces
BASE: dict[str, dict[str, Any]] = {
    "recording": {"recording-prompt.value": 0, "recording-layer.value": 0,
                  "recording-head.value": 0},
    "long-context": {"long-context-prompt.value": 0, "long-context-layer.value": 0,
                     "long-context-head.value": 0, "long-context-pooling.value": "max",
                     "long-context-q0.value": 0, "long-context-k0.value": 0,
                     "long-context-span.value": 4, "long-context-query.value": 2},
    "residual": {"residual-prompt.value": 0},
    "heads": {"heads-metric.value": "induction", "heads-k.value": 5},
    "sinks": {"sinks-input.value": "natural", "sinks-metric.value": "first_token",
              "sinks-curve.value": "running"},
    "pruning": {"pruning-kind.value": "importance_gradient", "pruning-budget.value": 0.5,
                "pruning-order.value": "gradient"},
    "formation": {"formation-model.value": "L1", "formation-head.value": "L0H0",
                  "formation-step.value": 1},
    "equivariance": {"equivariance-condition.value": "no positions, no mask",
                     "equivariance-prompt.value": 0, "equivariance-seed.value": 0,
                     "equivariance-layer.value": 0, "equivariance-head.value": 0},
    "why": {"why-head.value": "L0H1", "why-prompt.value": 0, "why-query-pos.value": 9},
    "sweeps": {"sweeps-metric.value": "previous-token-heads|previous_token",
               "sweeps-columns.value": "grid", "sweeps-k.value": 3},
    "patching": {"patching-group.value": "T0 ABBA", "patching-site.value": "resid_pre"},
    "lens": {"lens-prompt.value": 0},
    "runs": {},
}
KIND = {"recording": "record", "long-context": "record", "residual": "record",
        "heads": "induction-heads", "sinks": "attention-sinks", "pruning": "head-pruning",
        "formation": "induction-formation", "equivariance": "permutation-equivariance",
        "why": "qk-attribution", "sweeps": "sweep", "patching": "ioi", "lens": "logit-lens",
        "runs": "record"}
"""The kind of run each page's run dropdown holds."""


@dataclass(frozen=True)
class Case:
    """One crafted value: the callback (named by one of its outputs), the page, the value
    replacing the page's valid one, where the message shows, and the message."""

    output: str
    crafted: dict[str, Any]
    where: str
    message: str
    changed: list[str] | None = field(default=None)

    @property
    def page(self) -> str:
        return next(p for p in BASE if self.output.startswith(p + "-"))


def case(name: str, output: str, crafted: dict[str, Any], where: str, message: str,
         changed: list[str] | None = None):
    return pytest.param(Case(output, crafted, where, message, changed), id=name)


GRID_CLICK = "a click on a cell of a layer x head grid"
CASES = [
    # ---- Recording (2 prompts, 2 layers, 4 heads) ----
    case("recording-prompt-string", "recording-pattern.figure",
         {"recording-prompt.value": "0"}, "recording-pattern.figure",
         f'prompt: expected {WHOLE}, got "0"'),
    case("recording-layer-float", "recording-pattern.figure", {"recording-layer.value": 1.0},
         "recording-pattern.figure", f"layer: expected {WHOLE}, got 1.0"),
    case("recording-head-bool", "recording-pattern.figure", {"recording-head.value": True},
         "recording-pattern.figure", f"head: expected {WHOLE}, got true"),
    case("recording-layer-nan", "recording-pattern.figure", {"recording-layer.value": NAN},
         "recording-pattern.figure", f"layer: expected {WHOLE}, got NaN"),
    case("recording-prompt-infinity", "recording-pattern.figure",
         {"recording-prompt.value": INF}, "recording-pattern.figure",
         f"prompt: expected {WHOLE}, got Infinity"),
    case("recording-head-list", "recording-pattern.figure", {"recording-head.value": [0]},
         "recording-pattern.figure", f"head: expected {WHOLE}, got [0]"),
    case("recording-layer-beyond-the-model", "recording-pattern.figure",
         {"recording-layer.value": 2}, "recording-pattern.figure",
         "layer: expected 0..1 (2 layers in the recording), got 2"),
    case("recording-prompt-beyond-the-recording", "recording-pattern.figure",
         {"recording-prompt.value": 5}, "recording-pattern.figure",
         "prompt: expected 0..1 (2 prompts in the recording), got 5"),
    case("recording-grid-prompt-object", "recording-grid.figure",
         {"recording-prompt.value": {"$gt": 0}}, "recording-grid.figure",
         f'prompt: expected {WHOLE}, got {{"$gt": 0}}'),
    case("recording-click-not-a-number", "recording-layer.value",
         {"recording-grid.clickData": {"points": [{"x": "1", "y": 0}]}},
         "recording-error.children", f'click: expected {GRID_CLICK}, got {{"points": '
         '[{"x": "1", "y": 0}]}'),
    case("recording-click-beyond-the-heads", "recording-layer.value",
         {"recording-grid.clickData": {"points": [{"x": 7.5, "y": 0.5}]}},
         "recording-error.children", "head: expected 0..3 (4 heads in each layer), got 7"),
    case("recording-run-over-long", "recording-pattern.figure",
         {"recording-run.value": LONG}, "recording-pattern.figure",
         f'run id: expected {TEXT}, got "{"x" * 58}…'),
    # ---- Long context (prompt 0 has 9 tokens) ----
    case("long-context-pooling-unknown", "long-context-overview.figure",
         {"long-context-pooling.value": "mean"}, "long-context-overview.figure",
         "pooling: expected one of 'max', 'sum', got \"mean\""),
    case("long-context-pooling-missing", "long-context-window.figure",
         {"long-context-pooling.value": None}, "long-context-window.figure",
         "pooling: expected one of 'max', 'sum', got null"),
    case("long-context-span-negative", "long-context-window.figure",
         {"long-context-span.value": -1}, "long-context-window.figure",
         f"span: expected {WHOLE}, got -1"),
    case("long-context-first-query-huge", "long-context-window.figure",
         {"long-context-q0.value": 2**40}, "long-context-window.figure",
         f"first query: expected {WHOLE}, got 1099511627776"),
    case("long-context-first-key-string", "long-context-window.figure",
         {"long-context-k0.value": "1e3"}, "long-context-window.figure",
         f'first key: expected {WHOLE}, got "1e3"'),
    case("long-context-head-beyond", "long-context-overview.figure",
         {"long-context-head.value": 4}, "long-context-overview.figure",
         "head: expected 0..3 (4 heads in each layer), got 4"),
    case("long-context-query-beyond-the-prompt", "long-context-topk.children",
         {"long-context-query.value": 9}, "long-context-topk.children",
         "query: expected 0..8 (9 positions in the prompt), got 9"),
    case("long-context-zoom-not-numbers", "long-context-q0.value",
         {"long-context-overview.relayoutData": {
             "xaxis.range[0]": "a", "xaxis.range[1]": 2, "yaxis.range[0]": 0,
             "yaxis.range[1]": 2}}, "long-context-error.children",
         "zoom: expected an object of layout changes whose axis ranges are numbers, got "
         '{"xaxis.range[0]": "a", "xaxis.range[1]": 2, "yaxis.range[0…'),
    case("long-context-zoom-a-list", "long-context-q0.value",
         {"long-context-overview.relayoutData": [1, 2]}, "long-context-error.children",
         "zoom: expected an object of layout changes whose axis ranges are numbers, got "
         "[1, 2]"),
    case("long-context-click-on-nothing", "long-context-query.value",
         {"long-context-window.clickData": {"points": [{"y": "abc"}]}},
         "long-context-error.children",
         'query: expected a click on a cell of the window, got {"points": [{"y": "abc"}]}'),
    # ---- Residual stream ----
    case("residual-prompt-string", "residual-heatmap.figure", {"residual-prompt.value": "1"},
         "residual-heatmap.figure", f'prompt: expected {WHOLE}, got "1"'),
    case("residual-prompt-negative", "residual-heatmap.figure", {"residual-prompt.value": -1},
         "residual-stats.children", f"prompt: expected {WHOLE}, got -1"),
    case("residual-prompt-beyond", "residual-lines.figure", {"residual-prompt.value": 7},
         "residual-lines.figure", "prompt: expected 0..1 (2 prompts in the recording), got 7"),
    # ---- Heads: top k, the metric, compare, the picked head ----
    case("heads-top-k-string", "heads-heatmap.figure", {"heads-k.value": "10"},
         "heads-heatmap.figure", 'top k: expected a whole number 1..500, got "10"'),
    case("heads-top-k-zero", "heads-heatmap.figure", {"heads-k.value": 0},
         "heads-heatmap.figure", "top k: expected a whole number 1..500, got 0"),
    case("heads-top-k-above-max", "heads-heatmap.figure", {"heads-k.value": 501},
         "heads-heatmap.figure", "top k: expected a whole number 1..500, got 501"),
    case("heads-top-k-fraction", "heads-heatmap.figure", {"heads-k.value": 2.5},
         "heads-heatmap.figure", "top k: expected a whole number 1..500, got 2.5"),
    case("heads-top-k-infinity", "heads-heatmap.figure", {"heads-k.value": INF},
         "heads-heatmap.figure", "top k: expected a whole number 1..500, got Infinity"),
    case("heads-metric-not-in-the-run", "heads-heatmap.figure", {"heads-metric.value": "nope"},
         "heads-heatmap.figure", "metric: expected one of the run's metrics (\"induction\", "
         "\"induction_pooled\", \"copying\", \"previous_token\"), got \"nope\""),
    case("heads-compare-a-number", "heads-compare-note.children", {"heads-compare.value": 5},
         "heads-compare-note.children", f"compare id: expected {TEXT}, got 5"),
    case("heads-compare-an-object", "heads-heatmap.figure",
         {"heads-compare.value": {"run": "x"}}, "heads-heatmap.figure",
         f'compare id: expected {TEXT}, got {{"run": "x"}}'),
    case("heads-table-cell-row-string", "heads-selected.data",
         {"heads-table.active_cell": {"row": "0", "column": 0}}, "heads-error.children",
         "cell: expected an object {row: a whole number 0..2147483647}, got "
         '{"column": 0, "row": "0"}', changed=["heads-table.active_cell"]),
    case("heads-picked-head-beyond", "heads-example.figure",
         {"heads-selected.data": {"layer": 9, "head": 0}}, "heads-example.figure",
         "layer: expected 0..1 (2 layers in the run's model), got 9"),
    # ---- Sinks ----
    case("sinks-input-unknown", "sinks-heatmap.figure", {"sinks-input.value": "nope"},
         "sinks-heatmap.figure", "input name: expected one of the run's inputs (\"natural\", "
         "\"natural_no_bos\", \"random\", \"random_no_bos\", \"repeated\", "
         "\"repeated_no_bos\"), got \"nope\""),
    case("sinks-metric-a-number", "sinks-heatmap.figure", {"sinks-metric.value": 3},
         "sinks-heatmap.figure", f"metric: expected {TEXT}, got 3"),
    case("sinks-curve-unknown", "sinks-streaming.figure", {"sinks-curve.value": "log"},
         "sinks-streaming.figure", "curve: expected one of 'running', 'binned', got \"log\""),
    case("sinks-input-control-characters", "sinks-mass.figure",
         {"sinks-input.value": "natural\n\x00"}, "sinks-mass.figure",
         f'input name: expected {TEXT}, got "natural\\n\\u0000"'),
    # ---- Pruning (budgets 0.25 and 0.5) ----
    case("pruning-budget-string", "pruning-mask.figure", {"pruning-budget.value": "0.5"},
         "pruning-mask.figure", 'budget: expected a number from 0 to 1, got "0.5"'),
    case("pruning-budget-nan", "pruning-mask.figure", {"pruning-budget.value": NAN},
         "pruning-mask.figure", "budget: expected a number from 0 to 1, got NaN"),
    case("pruning-budget-bool", "pruning-mask.figure", {"pruning-budget.value": True},
         "pruning-mask.figure", "budget: expected a number from 0 to 1, got true"),
    case("pruning-budget-not-in-the-run", "pruning-mask.figure", {"pruning-budget.value": 0.3},
         "pruning-mask.figure",
         "budget: expected one of the run's budgets (0.25, 0.5), got 0.3"),
    case("pruning-order-a-list", "pruning-survival.figure",
         {"pruning-order.value": ["gradient"]}, "pruning-survival.figure",
         f'order: expected {TEXT}, got ["gradient"]'),
    case("pruning-click-beyond-the-heads", "pruning-head.children",
         {"pruning-survival.clickData": {"points": [{"x": 40, "y": 0}]}},
         "pruning-head.children", "head: expected 0..3 (4 heads in each layer), got 40",
         changed=["pruning-survival.clickData"]),
    case("pruning-kind-unknown", "pruning-importance.figure", {"pruning-kind.value": "x"},
         "pruning-importance.figure", "importance: expected one of the run's importances "
         "(\"importance_ablation\", \"importance_gradient\", \"importance_gradient_raw\"), "
         "got \"x\""),
    # ---- Formation: the checkpoint slider, the head, the model ----
    case("formation-slider-fraction", "formation-pattern.figure",
         {"formation-step.value": 1.5}, "formation-pattern.figure",
         f"checkpoint: expected {WHOLE}, got 1.5"),
    case("formation-slider-beyond", "formation-pattern.figure", {"formation-step.value": 3},
         "formation-pattern.figure", "checkpoint: expected 0..2 (3 checkpoints of L1), got 3"),
    case("formation-head-beyond", "formation-pattern.figure", {"formation-head.value": "L9H9"},
         "formation-pattern.figure",
         "head: expected one of the heads of L1 (\"L0H0\", \"L0H1\"), got \"L9H9\""),
    case("formation-head-malformed", "formation-pattern.figure",
         {"formation-head.value": "H1L0"}, "formation-pattern.figure",
         "head: expected a head such as 'L0H1', got \"H1L0\""),
    case("formation-model-unknown", "formation-head.options", {"formation-model.value": "L7"},
         "formation-error.children",
         "model: expected one of the run's models (\"L1\", \"L2\"), got \"L7\""),
    # ---- Equivariance (prompts 0-1, seeds 0-1, 2 layers, 4 heads) ----
    case("equivariance-seed-negative", "equivariance-before.figure",
         {"equivariance-seed.value": -1}, "equivariance-before.figure",
         f"seed: expected {WHOLE}, got -1"),
    case("equivariance-layer-huge-float", "equivariance-after.figure",
         {"equivariance-layer.value": 1e300}, "equivariance-after.figure",
         f"layer: expected {WHOLE}, got 1e+300"),
    case("equivariance-condition-unknown", "equivariance-permutation.children",
         {"equivariance-condition.value": "nope"}, "equivariance-permutation.children",
         "condition: expected one of the run's conditions (\"no positions, no mask\", "
         "\"no positions, causal mask\", \"RoPE, no mask\"), got \"nope\""),
    case("equivariance-prompt-beyond", "equivariance-back.figure",
         {"equivariance-prompt.value": 9}, "equivariance-back.figure",
         "prompt: expected one of the run's prompts (0, 1), got 9"),
    case("equivariance-head-beyond", "equivariance-view-stats.children",
         {"equivariance-head.value": 4}, "equivariance-view-stats.children",
         "head: expected one of the run's heads (0, 1, 2, 3), got 4"),
    # ---- Why (heads L0H1 and one more, chosen by the run; prompts 0-2; queries 9..16) ----
    case("why-query-string", "why-strip.figure", {"why-query-pos.value": "9"},
         "why-strip.figure", f'query: expected {WHOLE}, got "9"'),
    case("why-head-not-explained", "why-key.figure", {"why-head.value": "L1H0"},
         "why-key.figure",
         "head: expected one of the run's heads (<why heads>), got \"L1H0\""),
    case("why-query-not-explained", "why-pairs.figure", {"why-query-pos.value": 3},
         "why-pairs.figure", "query: expected one of the queries of L0H1 on prompt 0 "
         "(9, 10, 11, 12, 13, 14, 15, 16), got 3"),
    case("why-prompt-bool", "why-query-pos.options", {"why-prompt.value": False},
         "why-error.children", f"prompt: expected {WHOLE}, got false"),
    case("why-head-an-object", "why-aggregate.figure", {"why-head.value": {"layer": 0}},
         "why-aggregate.figure", 'head: expected a head such as \'L0H1\', got {"layer": 0}'),
    # ---- Sweeps: k, the metric, the columns, a click ----
    case("sweeps-k-string", "sweeps-mosaic.figure", {"sweeps-k.value": "5"},
         "sweeps-mosaic.figure", 'k: expected a whole number 1..50, got "5"'),
    case("sweeps-k-above-max", "sweeps-mosaic.figure", {"sweeps-k.value": 51},
         "sweeps-mosaic.figure", "k: expected a whole number 1..50, got 51"),
    case("sweeps-k-bool", "sweeps-mosaic.figure", {"sweeps-k.value": True},
         "sweeps-mosaic.figure", "k: expected a whole number 1..50, got true"),
    case("sweeps-columns-unknown", "sweeps-mosaic.figure", {"sweeps-columns.value": "diag"},
         "sweeps-mosaic.figure", "columns: expected one of 'grid', 'top', got \"diag\""),
    case("sweeps-metric-not-swept", "sweeps-lines.figure",
         {"sweeps-metric.value": "previous-token-heads|nope"}, "sweeps-lines.figure",
         "metric: expected one of the sweep's metrics (\"previous-token-heads|"
         "duplicate_token\", \"previous-token-heads|previous_token\"), got "
         "\"previous-token-heads|nope\""),
    case("sweeps-metric-a-number", "sweeps-mosaic.figure", {"sweeps-metric.value": 42},
         "sweeps-mosaic.figure", f"value: expected {TEXT}, got 42"),
    case("sweeps-click-not-a-row", "sweeps-open.children",
         {"sweeps-mosaic.clickData": {"points": [{"y": "x: a cell"}]}},
         "sweeps-open.children",
         'cell: expected a click on a row of the mosaic, got {"points": [{"y": "x: a cell"}]}'),
    # ---- Patching (groups T0 ABBA and T0 BABA; resid_pre; 2 layers, 4 heads) ----
    case("patching-group-unknown", "patching-positions.figure",
         {"patching-group.value": "T9 ABBA"}, "patching-positions.figure",
         "group: expected one of the run's groups (\"T0 ABBA\", \"T0 BABA\"), got \"T9 ABBA\""),
    case("patching-site-not-patched", "patching-positions.figure",
         {"patching-site.value": "mlp_out"}, "patching-positions.figure",
         "site: expected one of the run's sites (\"resid_pre\"), got \"mlp_out\""),
    case("patching-group-a-number", "patching-positions.figure", {"patching-group.value": 3},
         "patching-positions.figure", f"group: expected {TEXT}, got 3"),
    case("patching-click-not-a-cell", "patching-cell.children",
         {"patching-positions.clickData": {"points": [{"x": "IO", "y": 0}]}},
         "patching-cell.children", 'cell: expected a click on a cell of a layers x positions '
         'grid, got {"points": [{"x": "IO", "y": 0}]}',
         changed=["patching-positions.clickData"]),
    case("patching-click-beyond-the-layers", "patching-cell.children",
         {"patching-positions.clickData": {"points": [{"x": 1, "y": 7}]}},
         "patching-cell.children", "layer: expected 0..1 (2 layers patched), got 7",
         changed=["patching-positions.clickData"]),
    case("patching-click-beyond-the-heads", "patching-cell.children",
         {"patching-heads.clickData": {"points": [{"x": 9, "y": 0}]}},
         "patching-cell.children", "head: expected 0..3 (4 heads in each layer), got 9",
         changed=["patching-heads.clickData"]),
    # ---- Logit lens (prompts 0 and 1) ----
    case("lens-prompt-string", "lens-grid.figure", {"lens-prompt.value": "0"},
         "lens-grid.figure", f'prompt: expected {WHOLE}, got "0"'),
    case("lens-prompt-not-read", "lens-grid.figure", {"lens-prompt.value": 5},
         "lens-grid.figure", "prompt: expected one of the run's prompts (0, 1), got 5"),
    # ---- Runs: the filters and the selection ----
    case("runs-status-unknown", "runs-table.data", {"runs-status.value": "finished"},
         "runs-error.children", "status: expected one of 'running', 'complete', 'failed', "
         "'interrupted', 'damaged', got \"finished\""),
    case("runs-experiment-a-list", "runs-table.data", {"runs-experiment.value": ["record"]},
         "runs-error.children", f'experiment: expected {TEXT}, got ["record"]'),
    case("runs-model-an-object", "runs-table.data", {"runs-model.value": {"$ne": None}},
         "runs-error.children", f'model: expected {TEXT}, got {{"$ne": null}}'),
    case("runs-selected-row-beyond", "runs-detail.children",
         {"runs-table.selected_rows": [5], "runs-table.data": [{"run": "x"}]},
         "runs-detail.children", "selected row: expected 0..0 (1 rows in the table), got 5"),
    case("runs-selected-two-rows", "runs-detail.children",
         {"runs-table.selected_rows": [0, 1], "runs-table.data": [{"run": "x"}]},
         "runs-detail.children", "selected: expected a list of at most 1 of: a whole number "
         "0..2147483647, got [0, 1]"),
    # ---- a table download ----
    case("download-choice-not-json", "recording-download-file.data",
         {"recording-download-table.value": "not json"}, "recording-download-error.children",
         "choice: expected a JSON pair of texts such as '[\"run\", \"table\"]', got "
         "\"not json\"", changed=["recording-download-csv.n_clicks"]),
]


@pytest.fixture(scope="module")
def app(stocked):
    app = create_app(stocked.runs)
    assert app.server.test_client().get("/").status_code == 200  # registers the callbacks
    return app


def _message(payload: dict, where: str) -> list[str]:
    component, prop = where.rsplit(".", 1)
    return messages_in(payload.get(component, {}).get(prop))


def _values(stocked, c: Case) -> dict[str, Any]:
    values = {f"{c.page}-run.value": stocked.kinds[KIND[c.page]], **BASE[c.page], **c.crafted}
    if c.page == "runs":
        values.setdefault("runs-selected.data", stocked.kinds["record"])
    return values


def _explained_heads(stocked) -> str:
    """The heads the stocked qk-attribution run explains, quoted as the page lists them
    (which heads ``heads=auto`` picks depends on the store's induction-heads run)."""
    scores = RunStore(stocked.runs).get(stocked.kinds["qk-attribution"]).table("scores")
    heads = sorted({(int(r.layer), int(r.head)) for r in scores.itertuples()})
    return ", ".join(f'"L{layer}H{head}"' for layer, head in heads)


@pytest.mark.parametrize("c", CASES)
def test_a_crafted_value_is_refused_with_one_specific_line(app, stocked, c):
    status, text, payload = post_callback(app, callback_key(app, c.output), _values(stocked, c),
                                          c.changed)
    assert status == 200, text[:300]
    assert MARKER not in text and "Traceback" not in text
    shown = _message(payload, c.where)
    assert shown, f"no message in {c.where}: {json.dumps(payload)[:300]}"
    # a figure's title escapes markup; the message itself is the line the page shows
    assert shown[0] == c.message.replace("<why heads>", _explained_heads(stocked))
    assert "\n" not in shown[0]


def test_the_corpus_covers_every_page_with_inputs():
    assert len(CASES) >= 40
    covered = {c.values[0].page for c in CASES}
    assert covered == set(BASE)


@pytest.mark.parametrize("page", [p for p in BASE if p != "runs"])
def test_the_pages_valid_values_draw_without_a_message(app, stocked, page):
    """The control for the cases: with only the page's valid values, nothing is refused."""
    done = 0
    for c in (p.values[0] for p in CASES):
        if c.page != page:
            continue
        values = {f"{page}-run.value": stocked.kinds[KIND[page]], **BASE[page]}
        status, text, payload = post_callback(app, callback_key(app, c.output), values)
        assert status in (200, 204), text[:300]
        assert messages_in(payload) == [], (c.output, messages_in(payload))
        done += 1
    assert done


@pytest.mark.parametrize(("k", "rows"), [(None, 8), (1, 1), (3, 3)])
def test_what_a_browser_sends_for_a_number_input_is_accepted(app, stocked, k, rows):
    # an empty number input, or one failing its min, max or step, sends null (the default
    # top 10 of the tiny model's 8 heads); a valid one sends a JSON integer
    values = {"heads-run.value": stocked.kinds["induction-heads"], **BASE["heads"],
              "heads-k.value": k}
    status, _, payload = post_callback(app, callback_key(app, "heads-heatmap.figure"), values)
    assert status == 200 and messages_in(payload) == []
    assert len(payload["heads-table"]["data"]) == rows


@pytest.mark.parametrize(("pathname", "message"), [
    (5, f"address: expected {TEXT.replace('200', '2000')}, got 5"),
    ("heads", 'address: expected a path under /, got "heads"'),
    ("/heads", None),
])
def test_the_page_router_refuses_an_address_that_is_not_one(app, pathname, message):
    status, text, payload = post_callback(app, callback_key(app, "_pages_content.children"),
                                          {"_pages_location.pathname": pathname,
                                           "_pages_location.search": ""})
    assert status == 200, text[:300]
    shown = messages_in(payload["_pages_content"]["children"])
    assert shown == ([message] if message else [])
