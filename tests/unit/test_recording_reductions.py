"""Long prompts hand a reduction a few heads at a time; the scores do not change."""

from __future__ import annotations

import numpy as np
import torch

from workbench.inputs.prompts import Prompt
from workbench.recording import reductions
from workbench.scores import patterns

METRICS = {"entropy": patterns.entropy, "mean_distance": patterns.mean_distance,
           "induction": patterns.induction, "previous_token": patterns.previous_token,
           "first_token": patterns.first_token}


def test_heads_per_call_keeps_temporaries_within_budget():
    assert reductions.heads_per_call(torch.Size([4, 9, 128, 128])) == 9  # short: all heads
    # smollm2 at 8,192 tokens: 2**27 elements is two heads' [T, T]
    assert reductions.heads_per_call(torch.Size([1, 9, 8192, 8192])) == 2
    assert reductions.heads_per_call(torch.Size([1, 9, 2**15, 2**15])) == 1


def test_scores_are_the_same_one_head_at_a_time(llama, monkeypatch):
    prompts = [Prompt(text="the cat sat on the mat the cat sat on the mat"),
               Prompt(text="bread is made from flour")]
    together = reductions.reduce_patterns(llama, prompts, METRICS)
    monkeypatch.setattr(reductions, "TEMPORARY_ELEMENTS", 1)  # forces one head per call
    assert reductions.heads_per_call(torch.Size([2, 4, 12, 12])) == 1
    apart = reductions.reduce_patterns(llama, prompts, METRICS)
    assert together[["prompt", "layer", "head", "metric"]].equals(
        apart[["prompt", "layer", "head", "metric"]])
    np.testing.assert_allclose(apart["score"], together["score"], rtol=1e-6, equal_nan=True)
