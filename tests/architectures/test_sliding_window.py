"""Sliding-window layers in the experiments, on a tiny random Gemma 3 (layer 0 slides over 8
keys, layer 1 is global) and on hand-built patterns.

References: plain Hugging Face eager attention of the same model (``output_attentions``),
the definitions written out here, and patterns built by hand whose answers are worked out
in the test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.attention_sinks import Config as SinksConfig
from experiments.attention_sinks import checks as sinks_checks
from experiments.attention_sinks import window_edge
from experiments.attention_sinks.summary import uniform_alpha
from tests import tiny
from tests.architectures.families import build
from workbench.harness.experiment import run_experiment
from workbench.recording.reductions import PatternContext

WINDOW, N = 8, 4
SINKS = {"n_prompts": 4, "seq_len": 16, "stream_tokens": 40, "window": 12, "n_sinks": 2,
         "sink_sweep": (1,), "chunk": 16, "recompute_stride": 8, "n_massive_prompts": 2,
         "n_boot": 50, "edge_prompts": 3, "edge_queries": N}


@pytest.fixture(scope="module")
def gemma3(tokenizer):
    return tiny.wrap(build("gemma-3", len(tokenizer)), tokenizer, "tiny-gemma3")


@pytest.fixture(scope="module")
def sinks_run(gemma3, tmp_path_factory):
    return run_experiment("attention-sinks", gemma3, SINKS, runs_dir=tmp_path_factory.mktemp("r"))


# ---- the window edge on hand-built patterns ----------------------------------------------

def edge_pattern(kind: str, n: int = 12) -> torch.Tensor:
    """One sliding head over ``n`` queries and a window of 8: in reach, 0.6 on position 0
    and 0.4 spread over the other keys; out of reach, the 0.6 goes to the window's first
    key (``edge``), to the query itself (``diagonal``), or every window key gets 1/8
    (``spread``)."""
    a = torch.zeros(n, n)
    for t in range(n):
        if t < WINDOW:
            a[t, 0] = 0.6 if t else 1.0
            if t:
                a[t, 1:t + 1] = 0.4 / t
        elif kind == "spread":
            a[t, t - WINDOW + 1:t + 1] = 1 / WINDOW
        else:
            a[t, t - WINDOW + 1:t + 1] = 0.4 / WINDOW
            a[t, t - WINDOW + 1 if kind == "edge" else t] += 0.6
    assert torch.allclose(a.sum(-1), torch.ones(n))
    return a


def test_where_the_lost_first_token_mass_goes_by_hand():
    pattern = torch.stack([edge_pattern(k) for k in ("edge", "diagonal", "spread")])[None]
    n = pattern.shape[-1]
    ctx = PatternContext(torch.zeros(1, n, dtype=torch.long), torch.tensor([n]),
                         torch.ones(1, n, dtype=torch.bool), layer=0, causal=True)
    values = {m: fn(pattern, ctx)[0] for m, fn in window_edge.edge_reductions(WINDOW, N).items()}
    diag_in = np.mean([0.4 / t for t in range(WINDOW - N, WINDOW)])  # 0.4 / t in reach
    np.testing.assert_allclose(values["first_in"], 0.6, atol=1e-6)
    np.testing.assert_allclose(values["first_out"], 0.0, atol=0)
    np.testing.assert_allclose(values["diagonal_in"], diag_in, atol=1e-6)
    np.testing.assert_allclose(values["edge_out"], [0.65, 0.05, 0.125], atol=1e-6)
    np.testing.assert_allclose(values["neighbour_out"], [0.05, 0.05, 0.125], atol=1e-6)
    np.testing.assert_allclose(values["diagonal_out"], [0.05, 0.65, 0.125], atol=1e-6)
    table = pd.DataFrame([{"layer": 0, "head": h, "layer_type": "sliding", "measure": m,
                           "score": float(v[h])} for m, v in values.items() for h in range(3)])
    out = window_edge.destinations(table, eps=0.3)
    assert list(out.destination) == ["edge", "diagonal", "spread"]
    np.testing.assert_allclose(out.to_edge, [1.0, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(out.to_diagonal, (np.array([0.05, 0.65, 0.125]) - diag_in) / 0.6,
                               atol=1e-6)
    np.testing.assert_allclose(out.spread, 1 - out.to_edge - out.to_diagonal)
    # a head below eps in reach is no sink, and a global head keeps its first token
    assert list(window_edge.destinations(table, eps=0.7).destination) == ["no sink"] * 3
    assert set(window_edge.destinations(table.assign(layer_type="global"), 0.3).destination) == {
        "kept"}


def test_uniform_alpha_by_hand():
    assert uniform_alpha(4, True, None) == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)
    # past a window of 2 the first token is out of reach: only queries 0 and 1 count
    assert uniform_alpha(4, True, 2) == pytest.approx((1 + 1 / 2) / 4)
    assert uniform_alpha(5, False, None) == pytest.approx(1 / 5)


# ---- attention-sinks on the tiny Gemma 3 ---------------------------------------------------

def test_sink_rates_are_given_per_layer_type(sinks_run):
    rates = sinks_run.table("sink_rates")
    natural = rates[rates.input == "natural"].set_index("layers")
    assert list(natural.index) == ["all", "sliding", "global"]
    assert list(natural.n_heads) == [8, 4, 4]
    alpha = sinks_run.table("sink_per_prompt")
    alpha = alpha[alpha.input == "natural"]
    assert set(zip(alpha.layer, alpha.layer_type, strict=True)) == {(0, "sliding"),
                                                                    (1, "global")}
    eps = 0.3
    for group, heads in (("all", alpha), ("sliding", alpha[alpha.layer == 0]),
                         ("global", alpha[alpha.layer == 1])):
        by_hand = np.mean([100 * (g.score > eps).mean() for _, g in heads.groupby("prompt")])
        assert natural.loc[group, "sink_rate"] == pytest.approx(by_hand)
    # uniform attention over T = 16 tokens: alpha_1 = H_16 / 16 globally and H_8 / 16 in a
    # window of 8, both under 0.3, so the null rate is 0
    assert (rates.null_rate == 0).all()
    summary = "\n".join(sinks_run.meta.summary)
    assert "sink rate by layer type (natural): sliding layers" in summary
    assert "uniform null 0.0%" in summary and "window edge (3 documents" in summary
    assert "goes, weighted by it:" in summary
    # one 4-D mask would replace the sliding layer's own window: no streaming part
    skipped = sinks_run.table("skipped").set_index("part").reason
    assert "replaces a sliding layer's own window" in skipped["streaming"]
    assert "streaming_perplexity" not in sinks_run.table_names()


def test_window_edge_matches_hugging_face_eager(sinks_run, gemma3, tokenizer):
    """The window_edge measures recomputed from plain Hugging Face attention on the same
    documents; a sliding layer's weight on position 0 past the window is exactly 0."""
    cfg = SinksConfig(**SINKS)
    prompts = window_edge.edge_inputs(gemma3, cfg)
    hf = build("gemma-3", len(tokenizer))
    per_doc = []
    for prompt in prompts:
        ids = torch.tensor([prompt.token_ids])
        assert ids.shape[1] == WINDOW + N
        with torch.no_grad():
            att = torch.stack(hf(ids, output_attentions=True).attentions)[:, 0].double()
        inside, after = range(WINDOW - N, WINDOW), range(WINDOW, WINDOW + N)
        per_doc.append({
            "first_in": np.mean([att[:, :, t, 0].numpy() for t in inside], 0),
            "first_out": np.mean([att[:, :, t, 0].numpy() for t in after], 0),
            "diagonal_in": np.mean([att[:, :, t, t].numpy() for t in inside], 0),
            "diagonal_out": np.mean([att[:, :, t, t].numpy() for t in after], 0),
            "edge_out": np.mean([att[:, :, t, t - WINDOW + 1].numpy() for t in after], 0),
            "neighbour_out": np.mean([att[:, :, t, t - WINDOW + 2].numpy() for t in after], 0),
            "beyond_out": np.mean([att[:, :, t, :t - WINDOW + 1].sum(-1).numpy()
                                   for t in after], 0)})
    table = sinks_run.table("window_edge")
    assert set(zip(table.layer, table.layer_type, strict=True)) == {(0, "sliding"),
                                                                    (1, "global")}
    for measure, want in ((m, np.mean([d[m] for d in per_doc], 0)) for m in per_doc[0]):
        got = table[table.measure == measure].sort_values(["layer", "head"]).score
        np.testing.assert_allclose(got.to_numpy().reshape(2, 4), want, atol=1e-6,
                                   err_msg=measure)
    for measure in ("first_out", "beyond_out"):  # exactly 0 past a sliding window
        values = table[(table.measure == measure)].set_index("layer").score
        assert (values.loc[0] == 0).all() and (values.loc[1] > 0).all()
    dest = sinks_run.table("edge_destinations")
    assert list(dest[dest.layer == 1].destination) == ["kept"] * 4
    assert dest.lost[dest.layer == 0].to_numpy() == pytest.approx(
        dest.first_in[dest.layer == 0].to_numpy())  # all of it is lost in a sliding layer


def test_sink_claim_checks_read_layer_groups(sinks_run):
    got = sinks_checks.sink_rate_above_null(sinks_run, input="natural", margin=0.0,
                                            layers="global")
    row = sinks_run.table("sink_rates").set_index(["input", "layers"]).loc[
        ("natural", "global")]
    assert got.value == pytest.approx(row.sink_rate - row.null_rate)
    assert "(global layers)" in got.measured and "uniform attention" in got.measured
    assert sinks_checks.sink_rate_at_most(sinks_run, input="natural", threshold=100,
                                          layers="sliding").outcome == "pass"
    zero = sinks_checks.sliding_zero_beyond_window(sinks_run)
    assert zero.outcome == "pass" and zero.value == 0 and "global heads" in zero.measured
    with pytest.raises(Exception, match="over sliding layers"):
        sinks_checks.sink_rate_at_least(sinks_run, input="natural_x", threshold=1,
                                        layers="sliding")


# ---- permutation-equivariance: the window as a mask ---------------------------------------

def test_shuffling_beyond_the_window_changes_nothing_a_sliding_layer_sees(gemma3, tmp_path):
    """Positions 0..i-1 shuffled: a sliding layer's queries whose 8-key window holds none of
    them are unchanged under the layer's window mask (exactly: the moved keys carry zero
    weight), and change under the plain causal mask (the control)."""
    run = run_experiment("permutation-equivariance", gemma3,
                         {"n_prompts": 2, "max_tokens": 24, "seeds": (0, 1, 2),
                          "shifts": (1,)}, runs_dir=tmp_path)
    cases = run.table("equivariance")
    window = cases[cases.condition == "sliding window, far-past permutation"]
    control = cases[cases.condition == "causal mask, far-past permutation (control)"]
    assert set(window.layer) == set(control.layer) == {0}  # the sliding layer only
    assert len(window) == len(control) == 6 and (window.prefix >= 2).all()
    assert (window.n_tokens >= window.prefix + 8 + 1).all()  # a query past the moved ones
    assert (window.max_rel_error == 0).all() and (window.verdict == "pass").all()
    assert (control.max_rel_error > 1e-3).all() and (control.verdict == "pass").all()
    verdicts = run.table("verdicts").set_index("condition")
    assert verdicts.loc["sliding window, far-past permutation", "verdict"] == "pass"


def test_the_window_conditions_say_why_when_they_cannot_run(gemma3, llama, tmp_path):
    short = run_experiment("permutation-equivariance", gemma3,
                           {"n_prompts": 1, "max_tokens": 9, "seeds": (0,), "shifts": (1,)},
                           runs_dir=tmp_path)
    verdicts = short.table("verdicts").set_index("condition")
    row = verdicts.loc["sliding window, far-past permutation"]
    assert row.verdict == "n/a" and "does not reach 2 tokens past the 8-key window" in row.note
    flat = run_experiment("permutation-equivariance", llama,
                          {"n_prompts": 1, "max_tokens": 12, "seeds": (0,), "shifts": (1,)},
                          runs_dir=tmp_path).table("verdicts").set_index("condition")
    assert "has no sliding-window layer" in flat.loc["sliding window, far-past permutation",
                                                     "note"]


# ---- the Long context page marks the window edge ------------------------------------------

def test_window_edge_segment_by_hand():
    from workbench.views.patterns import edge_segment

    assert edge_segment(None, (0, 20, 0, 20)) is None  # a global layer
    # window 8: query q sees keys q - 7 .. q; the edge runs from (q 7, k 0) to (q 19, k 12)
    assert edge_segment(8, (0, 20, 0, 20)) == (7, 0, 19, 12)
    assert edge_segment(8, (10, 14, 0, 20)) == (10, 3, 13, 6)  # cut to the view's queries
    assert edge_segment(8, (0, 5, 0, 5)) is None  # every query of the view sees key 0


def test_the_long_context_heatmaps_mark_a_sliding_layers_edge(gemma3, tmp_path):
    import plotly.graph_objects as go

    from workbench.inputs.prompts import Prompt
    from workbench.recording.writer import record
    from workbench.views.patterns import mark_edge

    rec = record(gemma3, [Prompt(token_ids=tuple(range(10, 30)))], tmp_path / "rec",
                 store_dtype="float32", include_resid=False)
    for layer, marked in ((0, True), (1, False)):
        pooled = rec.pooled(0, layer, 0, max_cells=512, how="max")
        fig = go.Figure()
        note = mark_edge(fig, rec.model.window(layer), pooled)
        assert bool(fig.layout.shapes) == marked and ("last 8 keys" in note) == marked
        if marked:
            line = fig.layout.shapes[0]
            assert (line.x0, line.y0, line.x1, line.y1) == (-0.5, 7, 11.5, 19)
            grid = rec.pattern(0, layer, 0)
            assert grid[19, :12].max() == 0 and grid[19, 12] > 0  # left of the line: 0


# ---- induction at distance: a sliding layer stops at its window ---------------------------

def test_the_distance_curve_of_a_16_token_window_drops_to_zero_beyond_it(tokenizer, tmp_path):
    from tests.architectures.families import gemma3_config, instantiate

    model = tiny.wrap(instantiate("Gemma3ForCausalLM", gemma3_config(len(tokenizer),
                                                                     sliding_window=16)),
                      tokenizer, "tiny-gemma3-w16")
    assert model.info.sliding_window == 16 and model.info.layer_types == ("sliding", "global")
    run = run_experiment("induction-distance", model,
                         {"n_prompts": 2, "seq_len": 4, "distances": (4, 16, 17, 40),
                          "n_boot": 20}, runs_dir=tmp_path)
    scores = run.table("distance_scores")
    local, far = scores[scores.layer_type == "sliding"], scores[scores.layer_type == "global"]
    assert (local[local.distance <= 16].score > 0).all()  # the target is the window's first key
    assert (local[local.distance > 16][["score", "null"]] == 0).all().all()
    assert (far.score > 0).all()
    assert any(line.startswith("beyond the 16-token window: sliding layers' largest score "
                               "0.000") for line in run.meta.summary)


def test_head_score_nulls_of_a_sliding_layer_cover_only_its_window(gemma3):
    """The uniform null of a sliding layer spreads over the window the layer's mask allows:
    a first-token weight of 1/(q+1) while position 0 is within the window, 0 beyond it."""
    from workbench.inputs.prompts import Prompt
    from workbench.scores import metrics
    from workbench.scores.heads import score_heads

    texts = ["one two three four five six seven eight nine ten eleven twelve thirteen",
             "the cat sat on the mat and then the dog sat on the cat again and again"]
    prompts = [Prompt(text=t) for t in texts]
    table = score_heads(gemma3, prompts, metrics.reductions("first_token"), inputs="text",
                        n_boot=10)
    lengths = [len(gemma3.encode(p)[0]) for p in prompts]
    assert min(lengths) > WINDOW
    by_hand = {
        "global": np.mean([np.mean(1 / np.arange(1, n + 1)) for n in lengths]),
        "sliding": np.mean([np.mean([1 / (q + 1) if q < WINDOW else 0.0 for q in range(n)])
                            for n in lengths]),
    }
    for layer, kind in enumerate(gemma3.info.layer_types):
        null = table[table.layer == layer].null
        assert null.to_numpy() == pytest.approx(by_hand[kind], abs=1e-6)
    assert by_hand["sliding"] < by_hand["global"]


def test_a_prompt_within_the_window_has_one_null_on_both_layer_types(gemma3):
    from workbench.inputs.prompts import Prompt
    from workbench.recording.reductions import layer_nulls
    from workbench.scores import metrics

    prompts = [Prompt(text="a b c")]
    assert len(gemma3.encode(prompts[0])[0]) <= WINDOW
    nulls = layer_nulls(gemma3, prompts, metrics.reductions("previous_token", "first_token"))
    wide = nulls.pivot(index="metric", columns="layer", values="score")
    assert (wide[0] == wide[1]).all()
