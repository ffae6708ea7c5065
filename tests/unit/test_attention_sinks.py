"""Attention sinks on hand-built patterns, streaming masks against a plain Hugging Face
forward pass, and the whole experiment on the tiny random models."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from experiments.attention_sinks import Config, checks, scans
from experiments.attention_sinks.summary import sink_rates
from workbench.core.errors import ConfigError, WorkbenchError
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import run_experiment
from workbench.inputs.prompts import Prompt
from workbench.inputs.token_types import TOKEN_TYPES, TokenTyper, model_token_types
from workbench.recording.reductions import PatternContext
from workbench.scores.losses import token_losses
from workbench.scores.streaming import (
    Visibility,
    recompute_losses,
    windowed_losses,
    windowed_losses_batched,
)

SMALL = {"n_prompts": 4, "seq_len": 16, "stream_tokens": 80, "window": 24, "n_sinks": 4,
         "sink_sweep": (1,), "chunk": 16, "recompute_stride": 8, "n_massive_prompts": 2,
         "n_boot": 50}


def ctx_for(ids: list[list[int]]) -> PatternContext:
    input_ids = torch.tensor(ids)
    n = input_ids.shape[1]
    return PatternContext(input_ids, torch.full((len(ids),), n), torch.ones_like(input_ids,
                          dtype=torch.bool), layer=0, causal=True)


def hand_patterns() -> torch.Tensor:
    """[1 prompt, 3 heads, 4 queries, 4 keys] with alpha_1 worked out in the test."""
    half = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.5, 0.25, 0.25, 0],
                         [0.5, 0.2, 0.2, 0.1]])
    uniform = torch.tril(torch.ones(4, 4))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    return torch.stack([half, uniform, torch.eye(4)])[None]


def test_alpha_1_by_hand(llama):
    metrics = scans.sink_reductions(TokenTyper.for_model(llama), ["other"])
    alpha = metrics["first_token"](hand_patterns(), ctx_for([[0, 263, 263, 263]]))[0]
    # head 0: (1 + 0.5 * 3) / 4; head 1: (1 + 1/2 + 1/3 + 1/4) / 4; head 2: (1 + 0 + 0 + 0) / 4
    expected = [2.5 / 4, (1 + 1 / 2 + 1 / 3 + 1 / 4) / 4, 0.25]
    np.testing.assert_allclose(alpha.numpy(), expected, rtol=1e-6)


def test_sink_rate_by_hand():
    # two sequences x (1 layer, 3 heads); eps = 0.3
    alpha = {(0, 0): 0.625, (0, 1): 0.52, (0, 2): 0.25,
             (1, 0): 0.9, (1, 1): 0.05, (1, 2): 0.31}
    per_prompt = pd.DataFrame([{"input": "natural", "prompt": p, "layer": 0, "head": h,
                                "metric": "first_token", "score": a}
                               for (p, h), a in alpha.items()])
    cfg = Config(n_prompts=2, eps=0.3, n_boot=50)
    row = sink_rates(per_prompt, cfg).iloc[0]
    # sequence 0: 2 of 3 heads above 0.3; sequence 1: 2 of 3 -> (2/3 + 2/3) / 2
    assert row.sink_rate == pytest.approx(100 * 2 / 3)
    # on alpha averaged over sequences: 0.7625, 0.285, 0.28 -> 1 of 3 heads
    assert row.sink_rate_mean_alpha == pytest.approx(100 / 3)
    assert row.ci_low <= row.sink_rate <= row.ci_high
    assert (row.n_prompts, row.n_heads) == (2, 3)


def test_token_type_shares_and_top_receivers_by_hand(llama):
    # <bos> the . \n the : bos, first content, punctuation, newline, other
    ids = [[0, 263, 19, 204, 263]]
    types = model_token_types(llama)
    metrics = scans.sink_reductions(TokenTyper.for_model(llama), types)
    uniform = torch.tril(torch.ones(5, 5))
    pattern = (uniform / uniform.sum(-1, keepdim=True))[None, None]
    ctx = ctx_for(ids)
    # r_j = (1/5) sum_{t >= j} 1/(t+1)
    r = [sum(1 / (t + 1) for t in range(j, 5)) / 5 for j in range(5)]
    for j, name in enumerate(["bos", "first_content", "punctuation", "newline", "other"]):
        assert metrics[f"share_{name}"](pattern, ctx).item() == pytest.approx(r[j])
    assert sum(metrics[f"share_{t}"](pattern, ctx).item() for t in types) == pytest.approx(1)
    assert metrics["top1_share"](pattern, ctx).item() == pytest.approx(r[0])
    assert metrics["top2_position"](pattern, ctx).item() == 1
    assert TOKEN_TYPES[int(metrics["top3_type"](pattern, ctx).item())] == "punctuation"


def test_padded_keys_and_queries_are_not_counted(llama):
    metrics = scans.sink_reductions(TokenTyper.for_model(llama), ["bos", "other"])
    pattern = hand_patterns()[:, :1]  # head 0, four positions
    ids = torch.tensor([[0, 263, 263, 3]])
    ctx = PatternContext(ids, torch.tensor([3]), torch.tensor([[True, True, True, False]]),
                         layer=0, causal=True)
    # (1 + .5 + .5) / 3
    assert metrics["first_token"](pattern, ctx).item() == pytest.approx(2.0 / 3)
    assert metrics["share_bos"](pattern, ctx).item() == pytest.approx(2.0 / 3)


def test_visibility_masks_by_hand():
    pos = torch.arange(6)
    window = Visibility(n_sinks=0, window=3).mask(pos, pos).int()
    sink = Visibility(n_sinks=1, window=3).mask(pos, pos).int()
    assert window.tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                               [0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]
    assert sink.tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                             [1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 1, 0], [1, 0, 0, 0, 1, 1]]
    assert Visibility().mask(pos, pos).equal(torch.ones(6, 6, dtype=torch.bool).tril())
    assert (Visibility(1, 3).label, Visibility(0, 256).label) == ("1+2", "0+256")
    assert Visibility(1, 3).still_needed(pos, 4).tolist() == [True, False, False, True,
                                                               True, True]
    with pytest.raises(WorkbenchError, match="larger than n_sinks"):
        Visibility(4, 4)


def hf_masked_nll(hf_model, ids: torch.Tensor, vis: Visibility) -> torch.Tensor:
    """Reference: one forward pass of the plain Hugging Face model with a full 4D mask."""
    pos = torch.arange(len(ids))
    additive = torch.zeros(len(ids), len(ids)).masked_fill(~vis.mask(pos, pos),
                                                            torch.finfo(torch.float32).min)
    with torch.inference_mode():
        logits = hf_model(ids[None], attention_mask=additive[None, None]).logits[0]
    return F.cross_entropy(logits[:-1], ids[1:], reduction="none")


@pytest.mark.parametrize("vis", [Visibility(), Visibility(0, 8), Visibility(2, 8)])
def test_windowed_losses_equal_one_masked_forward_pass(llama, llama_hf, vis):
    ids = torch.randint(6, 300, (41,), generator=torch.Generator().manual_seed(0))
    got = windowed_losses(llama, ids, vis, chunk=7)
    torch.testing.assert_close(got, hf_masked_nll(llama_hf, ids, vis), atol=1e-5, rtol=1e-5)


def test_batched_windows_equal_each_one_masked_forward_pass(llama, llama_hf):
    # rows with different sinks and windows share one cache (the union of their keys);
    # each row must still equal its own full-mask forward pass of plain Hugging Face
    ids = torch.randint(6, 300, (41,), generator=torch.Generator().manual_seed(3))
    visibilities = [Visibility(0, 8), Visibility(1, 8), Visibility(4, 8), Visibility(2, 12)]
    got = windowed_losses_batched(llama, ids, visibilities, chunk=7)
    assert got.shape == (len(visibilities), len(ids) - 1)
    for row, vis in zip(got, visibilities, strict=True):
        torch.testing.assert_close(row, hf_masked_nll(llama_hf, ids, vis), atol=1e-5,
                                   rtol=1e-5)


def test_dense_streaming_equals_token_losses_and_windows_matter(llama):
    ids = torch.randint(6, 300, (40,), generator=torch.Generator().manual_seed(1))
    dense = windowed_losses(llama, ids, Visibility(), chunk=9)
    reference = token_losses(llama, [Prompt(token_ids=tuple(ids.tolist()))])[0]
    torch.testing.assert_close(dense, reference, atol=1e-5, rtol=1e-5)
    window = windowed_losses(llama, ids, Visibility(0, 8), chunk=9)
    torch.testing.assert_close(window[:8], dense[:8], atol=1e-5, rtol=1e-5)  # before eviction
    assert not torch.allclose(window[8:], dense[8:], atol=1e-3)


def test_recompute_equals_a_fresh_forward_over_the_window(llama, llama_hf):
    ids = torch.randint(6, 300, (30,), generator=torch.Generator().manual_seed(2))
    positions = [7, 12, 28]
    got = recompute_losses(llama, ids, 8, positions, max_batch_tokens=16)
    with torch.inference_mode():
        for value, t in zip(got, positions, strict=True):
            logits = llama_hf(ids[None, t - 7: t + 1]).logits[0, -1]
            assert value.item() == pytest.approx(F.cross_entropy(logits, ids[t + 1]).item(),
                                                 abs=1e-5)
    with pytest.raises(WorkbenchError, match="query positions"):
        recompute_losses(llama, ids, 8, [6])


def test_skips_say_what_does_not_apply(llama, bert):
    # rotary, BOS, trained head: everything but the window edge of a sliding layer
    assert set(scans.skips(llama, Config(stream_tokens=400))) == {"window_edge"}
    assert "no sliding-window layer" in scans.skips(llama, Config())["window_edge"]
    assert set(scans.skips(llama, Config(streaming=False, compare_bos=False))) == {
        "bos", "streaming", "window_edge"}
    encoder = scans.skips(bert, Config())
    assert set(encoder) == {"bos", "streaming", "repeated", "window_edge"}
    assert "learned absolute position" in encoder["repeated"]


def test_config_validation():
    with pytest.raises(ValueError, match="sink count"):
        Config(n_sinks=256, window=256)
    with pytest.raises(ValueError, match="stream_tokens"):
        Config(stream_tokens=200, window=256)
    with pytest.raises(ConfigError, match="eps: expected at most 1"):
        apply_overrides(Config, {"eps": 1.5})
    with pytest.raises(ConfigError, match="sink_sweep: expected at least 1"):
        apply_overrides(Config, ["sink_sweep=1,0"])
    with pytest.raises(ConfigError, match="sink count"):
        apply_overrides(Config, {"n_sinks": 8, "window": 8})


@pytest.fixture(scope="module")
def tiny_runs(llama, bert, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    return (run_experiment("attention-sinks", llama, SMALL, runs_dir=runs),
            run_experiment("attention-sinks", bert, SMALL, runs_dir=runs))


def test_run_on_the_tiny_llama(tiny_runs):
    run = tiny_runs[0]
    scores = run.table("input_scores")
    shares = scores[scores.metric.str.startswith("share_")]
    totals = shares.groupby(["input", "layer", "head"]).score.sum()
    np.testing.assert_allclose(totals, 1.0, atol=1e-5)  # exclusive types cover every key
    no_bos = scores[scores.input == "natural_no_bos"].set_index(["layer", "head", "metric"])
    np.testing.assert_allclose(no_bos.xs("first_token", level="metric").score,
                               no_bos.xs("share_first_content", level="metric").score,
                               atol=1e-6)  # without BOS, position 0 is the first content token
    assert set(run.table("sink_rates").input) == {
        "natural", "natural_no_bos", "random", "random_no_bos", "repeated", "repeated_no_bos"}
    stream = run.table("streaming_perplexity").set_index("label")
    assert list(stream.index) == ["dense", "0+24", "1+23", "4+20", "recompute 24"]
    assert stream.loc["recompute 24", "n_matched"] == len(range(24, 79, 8))
    assert run.table("repeated_token_check").relative_deviation.max() < 1e-5
    head = run.table("head_scores")
    assert {"layer", "head", "metric", "score", "ci_low", "ci_high", "n_prompts"} <= set(head)
    assert [line for line in run.meta.summary if "skipped" in line] == [
        "window edge: skipped (tiny-llama has no sliding-window layer: the first token is "
        "always in reach)"]
    assert list(run.table("skipped").part) == ["window_edge"]
    assert set(run.table("sink_rates").layers) == {"all"}  # one layer type: no groups
    assert set(head.layer_type) == {"global"}


def test_encoder_run_skips_what_does_not_apply(tiny_runs):
    run = tiny_runs[1]
    summary = "\n".join(run.meta.summary)
    assert "with/without BOS: skipped" in summary and "streaming perplexity: skipped" in summary
    assert "repeated-token property: skipped" in summary  # BERT has learned positions
    assert "streaming_perplexity" not in run.table_names()
    skipped = run.table("skipped").set_index("part").reason
    assert set(skipped.index) == {"bos", "streaming", "repeated", "window_edge"}
    assert "no next-token perplexity" in skipped["streaming"]
    assert set(run.table("sink_rates").input) == {"natural", "random", "repeated"}
    scores = run.table("head_scores").set_index(["layer", "head", "metric"])
    np.testing.assert_allclose(scores.xs("first_token", level="metric").score,
                               scores.xs("share_cls", level="metric").score, atol=1e-6)
    assert "[CLS]/[SEP]/punctuation" in summary
    assert "bound method" not in summary and "broadest head L" in summary


def test_claim_checks_on_tiny_runs(tiny_runs):
    llama_run, bert_run = tiny_runs
    rate = checks.sink_rate_at_most(llama_run, input="natural", threshold=100)
    assert rate.outcome == "pass" and "Sink_1^0.3 on natural" in rate.measured
    row = llama_run.table("sink_rates").set_index("input").loc["natural"]
    assert (rate.ci_low, rate.ci_high, rate.threshold) == (row.ci_low, row.ci_high, 100)
    ratio = checks.streaming_ratio(llama_run, numerator="window", denominator="sinks:4",
                                   at_least=0.0)
    table = llama_run.table("streaming_perplexity").set_index("label")
    assert ratio.value == pytest.approx(table.loc["0+24", "ppl_matched"]
                                        / table.loc["4+20", "ppl_matched"])
    assert ratio.ci_low <= ratio.value <= ratio.ci_high and ratio.outcome == "pass"
    same = checks.streaming_ratio(llama_run, numerator="window", denominator="window",
                                  at_least=0.9, at_most=1.1)  # ratio 1, on both sides
    assert (same.value, same.ci_low, same.ci_high, same.outcome) == (1.0, 1.0, 1.0, "pass")
    assert checks.repeated_states_identical(llama_run, tolerance=1e-4).outcome == "pass"
    with pytest.raises(WorkbenchError, match=r"no streaming perplexity .*no next-token"):
        checks.streaming_ratio(bert_run, numerator="window", denominator="dense")
    with pytest.raises(WorkbenchError, match=r"no repeated-token check .*learned absolute"):
        checks.repeated_states_identical(bert_run, tolerance=1e-4)
    sep = checks.layer_share_at_least(bert_run, token_type="sep", threshold=2.0)
    assert sep.outcome == "fail" and "layer" in sep.measured and sep.ci_high < 2.0
    # a random model has no massive activations; with no bounds every boundary qualifies
    sun = {"min_magnitude": 100, "min_ratio": 1000, "min_fraction": 0.9}
    massive = checks.massive_at_start_or_delimiter(llama_run, **sun)
    assert massive.outcome == "fail" and "no boundary qualifies" in massive.measured
    anything = checks.massive_at_start_or_delimiter(llama_run, min_magnitude=0, min_ratio=0,
                                                    min_fraction=0)
    n_boundaries = llama_run.table("massive_activations").layer.nunique()
    assert anything.outcome == "pass"
    assert f"boundaries 0..{n_boundaries - 1} qualify" in anything.measured


def test_ratio_interval_is_paired_over_positions():
    # a constant gap of log 2 nats per position: perplexity ratio exactly 2 at every resample
    num = pd.Series([1.0, 3.0, 2.0, 5.0]) + np.log(2)
    ratio, low, high = checks.ratio_interval(num, pd.Series([1.0, 3.0, 2.0, 5.0]))
    assert (ratio, low, high) == pytest.approx((2.0, 2.0, 2.0))
    # gaps of 0 and log 4: the geometric mean 2, inside an interval within [1, 4]
    ratio, low, high = checks.ratio_interval(pd.Series([0.0, np.log(4)] * 10),
                                             pd.Series([0.0] * 20))
    assert ratio == pytest.approx(2.0) and 1.0 <= low < 2.0 < high <= 4.0
    assert np.isnan(checks.ratio_interval(pd.Series([], dtype=float),
                                          pd.Series([], dtype=float))[0])
