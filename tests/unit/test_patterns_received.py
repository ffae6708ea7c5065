"""The weight each key receives (patterns.received, received_by), on hand-built patterns."""

from __future__ import annotations

import pytest
import torch

from workbench.recording.reductions import PatternContext, uniform_pattern
from workbench.scores import patterns


def ctx_for(n: int, *, lengths: list[int] | None = None, causal: bool = True
            ) -> PatternContext:
    lengths = lengths or [n]
    mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return PatternContext(torch.zeros(len(lengths), n, dtype=torch.long),
                          torch.tensor(lengths), mask, layer=0, causal=causal)


def test_received_of_a_uniform_causal_pattern():
    n = 5
    r = patterns.received(uniform_pattern(n, causal=True), ctx_for(n))[0, 0]
    # query t spreads 1/(t+1) over keys 0..t, so key j receives (1/T) sum_{t >= j} 1/(t+1)
    expected = [sum(1 / (t + 1) for t in range(j, n)) / n for j in range(n)]
    torch.testing.assert_close(r, torch.tensor(expected))
    assert r.sum().item() == pytest.approx(1)


def test_received_at_position_0_is_alpha_1():
    torch.manual_seed(0)
    weights = torch.rand(2, 3, 6, 6) * torch.ones(6, 6).tril()
    pattern = weights / weights.sum(-1, keepdim=True)
    ctx = ctx_for(6, lengths=[6, 4])
    torch.testing.assert_close(patterns.received(pattern, ctx)[..., 0],
                               patterns.first_token(pattern, ctx))


def test_padded_queries_are_not_counted_and_padded_keys_receive_nothing():
    # 3 real tokens of 4; the padded query's row would add weight if it were counted
    pattern = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.5, 0.25, 0.25, 0],
                            [0.0, 0, 0, 1]])[None, None]
    r = patterns.received(pattern, ctx_for(4, lengths=[3]))[0, 0]
    torch.testing.assert_close(r, torch.tensor([2.0 / 3, 0.75 / 3, 0.25 / 3, 0.0]))


def test_received_of_a_uniform_encoder_pattern_is_flat():
    r = patterns.received(uniform_pattern(4, causal=False), ctx_for(4, causal=False))
    torch.testing.assert_close(r[0, 0], torch.full((4,), 0.25))


def test_received_by_sums_the_chosen_keys():
    r = patterns.received(uniform_pattern(4, causal=True), ctx_for(4))  # [1, 1, 4]
    keys = torch.tensor([[True, False, True, False]])
    share = patterns.received_by(r, keys)
    assert share.shape == (1, 1)
    assert share.item() == pytest.approx(r[0, 0, 0].item() + r[0, 0, 2].item())
    total = share + patterns.received_by(r, ~keys)
    assert total.item() == pytest.approx(1)
