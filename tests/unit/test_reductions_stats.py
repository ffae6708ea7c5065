"""Pattern reductions on hand-built patterns, and against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.inputs.prompts import Prompt
from workbench.recording import reductions
from workbench.recording.writer import record
from workbench.scores import patterns
from workbench.scores.stats import bootstrap_mean_ci, summarize


def ctx(lengths, n_pos, causal=True):
    lengths = torch.tensor(lengths)
    mask = torch.arange(n_pos)[None, :] < lengths[:, None]
    return reductions.PatternContext(torch.zeros(len(lengths), n_pos, dtype=torch.long),
                                     lengths, mask, layer=0, causal=causal)


def causal_uniform(n):
    a = torch.tril(torch.ones(n, n))
    return a / a.sum(-1, keepdim=True)


def test_entropy_of_uniform_and_one_hot_patterns():
    n = 5
    uniform = causal_uniform(n)[None, None]  # [1, 1, 5, 5]
    expected = np.mean([math.log(q + 1) for q in range(n)])
    assert patterns.entropy(uniform, ctx([n], n)).item() == pytest.approx(expected)
    # uniform over the visible prefix has normalized entropy 1 (query 0 is left out)
    assert patterns.normalized_entropy(uniform, ctx([n], n)).item() == pytest.approx(1.0)
    one_hot = torch.eye(n)[None, None]
    assert patterns.entropy(one_hot, ctx([n], n)).item() == pytest.approx(0.0, abs=1e-6)
    assert patterns.self_attention(one_hot, ctx([n], n)).item() == pytest.approx(1.0)


def test_mean_distance_of_previous_token_pattern_is_one():
    n = 6
    prev = torch.zeros(n, n)
    prev[0, 0] = 1.0
    prev[torch.arange(1, n), torch.arange(n - 1)] = 1.0
    got = patterns.mean_distance(prev[None, None], ctx([n], n)).item()
    assert got == pytest.approx((n - 1) / n)  # query 0 can only attend to itself


def test_padded_queries_are_ignored():
    n = 4
    pattern = torch.eye(n).repeat(2, 1, 1, 1)  # [2, 1, 4, 4]
    pattern[1, 0, 2:] = 0.25  # padded rows of prompt 1 hold junk
    out = patterns.self_attention(pattern, ctx([4, 2], n))
    assert out[0, 0].item() == pytest.approx(1.0) and out[1, 0].item() == pytest.approx(1.0)


def test_reduce_patterns_matches_recorded_patterns(llama, tmp_path):
    prompts = [Prompt(text=t) for t in ["the cat sat on the mat", "bread is made", "a dog"]]
    got = reductions.reduce_patterns(llama, prompts, {"entropy": patterns.entropy,
                                                     "mean_distance": patterns.mean_distance})
    rec = record(llama, prompts, tmp_path / "rec", store_dtype="float32")
    for i in range(len(prompts)):
        for layer in range(llama.info.n_layers):
            a = rec.pattern(i, layer).astype(np.float64)  # [head, q, k]
            ent = -(a * np.log(np.clip(a, 1e-30, None))).sum(-1).mean(-1)
            q, k = np.indices(a.shape[1:])
            dist = (a * np.abs(q - k)).sum(-1).mean(-1)
            rows = got[(got.prompt == i) & (got.layer == layer)]
            for metric, ref in (("entropy", ent), ("mean_distance", dist)):
                mine = rows[rows.metric == metric].sort_values("head").score.to_numpy()
                np.testing.assert_allclose(mine, ref, atol=1e-5)


def test_bootstrap_interval_brackets_the_mean_and_collapses_for_constants():
    rng = np.random.default_rng(1)
    values = rng.normal(2.0, 1.0, size=(200, 3))
    low, high = bootstrap_mean_ci(values)
    mean = values.mean(0)
    assert np.all(low < mean) and np.all(mean < high)
    # width close to the normal-theory 95% interval, 2 * 1.96 * sd / sqrt(n)
    np.testing.assert_allclose(high - low, 2 * 1.96 / np.sqrt(200), rtol=0.25)
    low_c, high_c = bootstrap_mean_ci(np.full((10, 2), 0.3))
    np.testing.assert_allclose([low_c, high_c], 0.3)


def test_summarize_skips_missing_values():
    per_prompt = pd.DataFrame({
        "prompt": [0, 1, 2, 0, 1, 2], "layer": 0, "head": [0, 0, 0, 1, 1, 1], "metric": "m",
        "score": [1.0, 2.0, 3.0, 5.0, np.nan, 7.0],
    })
    out = summarize(per_prompt, n_boot=200)
    assert out.score.tolist() == [2.0, 6.0]
    assert out.n_prompts.tolist() == [3, 2]
    assert (out.ci_low <= out.score).all() and (out.score <= out.ci_high).all()
