"""Head scores on hand-built patterns with known answers, and against TransformerLens."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from transformer_lens.head_detector import detect_head

from experiments.induction_heads.measure import choose_ablation, icl_rows
from workbench.inputs.prompts import Prompt
from workbench.recording.reductions import (
    PatternContext,
    null_scores,
    reduce_patterns,
    uniform_pattern,
)
from workbench.scores import patterns
from workbench.scores.heads import copying_scores, top_heads
from workbench.scores.losses import repeat_losses

BOS = 0
A, B, C, D = 11, 12, 13, 14
REPEATED = [BOS, A, B, C, D, A, B, C, D]  # positions 0..8


def ctx_for(ids, lengths=None, causal=True):
    ids = torch.tensor([ids]) if isinstance(ids[0], int) else torch.tensor(ids)
    n = ids.shape[1]
    lengths = torch.tensor(lengths or [n] * ids.shape[0])
    mask = torch.arange(n)[None, :] < lengths[:, None]
    return PatternContext(ids, lengths, mask, layer=0, causal=causal)


def one_hot_pattern(targets, n):
    """A [1, 1, n, n] pattern where query i puts all its weight on key targets[i]."""
    pattern = torch.zeros(1, 1, n, n)
    for i, k in enumerate(targets):
        pattern[0, 0, i, k] = 1.0
    return pattern


def test_exact_induction_stripe_scores_one():
    # query at position p in the second repeat attends to the token after its first copy
    targets = [0, 0, 0, 0, 0, 2, 3, 4, 5]  # first-repeat queries attend to BOS (excluded)
    pattern = one_hot_pattern(targets, 9)
    ctx = ctx_for(REPEATED)
    assert patterns.induction(pattern, ctx).item() == pytest.approx(1.0)
    assert patterns.induction_pooled(pattern, ctx).item() == pytest.approx(1.0)
    # the unnormalised stripe divides the same total by all 9 queries
    assert patterns.induction_stripe_sum(pattern, ctx).item() == pytest.approx(4 / 9)


def test_previous_token_pattern_scores_zero_on_induction_and_one_on_previous():
    targets = [0, 0, 1, 2, 3, 4, 5, 6, 7]
    pattern = one_hot_pattern(targets, 9)
    ctx = ctx_for(REPEATED)
    assert patterns.induction(pattern, ctx).item() == pytest.approx(0.0)
    assert patterns.previous_token(pattern, ctx).item() == pytest.approx(1.0)
    assert patterns.duplicate_token(pattern, ctx).item() == pytest.approx(0.0)


def test_bos_column_never_counts():
    pattern = one_hot_pattern([0] * 9, 9)  # all weight on BOS
    ctx = ctx_for(REPEATED)
    assert patterns.induction(pattern, ctx).item() == 0.0
    assert patterns.duplicate_token(pattern, ctx).item() == 0.0
    assert not patterns.induction_targets(ctx)[0, :, 0].any()
    assert patterns.first_token(pattern, ctx).item() == pytest.approx(1.0)


def test_duplicate_and_next_token():
    dup = one_hot_pattern([0, 1, 2, 3, 4, 1, 2, 3, 4], 9)
    assert patterns.duplicate_token(dup, ctx_for(REPEATED)).item() == pytest.approx(1.0)
    # half the weight on the earlier copy: 0.5
    half = 0.5 * dup + 0.5 * one_hot_pattern(list(range(9)), 9)
    assert patterns.duplicate_token(half, ctx_for(REPEATED)).item() == pytest.approx(0.5)
    nxt = one_hot_pattern([1, 2, 3, 4, 5, 6, 7, 8, 8], 9)
    assert patterns.next_token(nxt, ctx_for(REPEATED, causal=False)).item() == pytest.approx(1.0)


def test_only_queries_with_an_earlier_occurrence_count():
    # second-repeat queries split their weight: 3/4 on the induction target, 1/4 on BOS
    pattern = one_hot_pattern([0] * 9, 9)
    for i, k in zip(range(5, 9), range(2, 6), strict=True):
        pattern[0, 0, i] = 0
        pattern[0, 0, i, k], pattern[0, 0, i, 0] = 0.75, 0.25
    assert patterns.induction(pattern, ctx_for(REPEATED)).item() == pytest.approx(0.75)


def test_padding_is_ignored():
    short = [BOS, A, B, A, B]
    ids = [REPEATED, short + [99] * 4]
    targets = [0, 0, 0, 0, 0, 2, 3, 4, 5]
    pattern = torch.cat([one_hot_pattern(targets, 9), one_hot_pattern(targets, 9)])
    pattern[1, 0, 3:5] = 0
    pattern[1, 0, 3, 2], pattern[1, 0, 4, 3] = 1.0, 1.0  # induction targets of the short one
    pattern[1, 0, 5:] = 1 / 9  # junk in the padded rows
    out = patterns.induction(pattern, ctx_for(ids, lengths=[9, 5]))
    assert out[:, 0].tolist() == pytest.approx([1.0, 1.0])


def random_causal_pattern(n, heads=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, heads, n, n, generator=gen)
    logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return logits.softmax(-1)


def second_repeat_reference(pattern, seq_len):
    """Olsson et al.'s score on [BOS] + seq * R, by hand: second-repeat query q attends to
    q - seq_len + 1, the token after its first occurrence."""
    queries = range(1 + seq_len, 1 + 2 * seq_len)
    return [float(np.mean([pattern[0, h, q, q - seq_len + 1].item() for q in queries]))
            for h in range(pattern.shape[1])]


def pooled_reference(pattern, seq_len, repeats):
    """Every query after the first repeat: total weight on all earlier successors."""
    n = 1 + seq_len * repeats
    out = []
    for h in range(pattern.shape[1]):
        per_query = [sum(pattern[0, h, q, j + 1].item() for j in range(q - seq_len, 0, -seq_len))
                     for q in range(1 + seq_len, n)]
        out.append(float(np.mean(per_query)))
    return out


@pytest.mark.parametrize("repeats", [2, 3, 4])
def test_induction_is_the_second_repeat_score_for_any_number_of_repeats(repeats):
    seq = [21, 22, 23, 24, 25]  # distinct tokens
    ids = [BOS] + seq * repeats
    pattern = random_causal_pattern(len(ids), seed=repeats)
    ctx = ctx_for(ids)
    got = patterns.induction(pattern, ctx)[0].tolist()
    assert got == pytest.approx(second_repeat_reference(pattern, len(seq)), abs=1e-6)
    pooled = patterns.induction_pooled(pattern, ctx)[0].tolist()
    assert pooled == pytest.approx(pooled_reference(pattern, len(seq), repeats), abs=1e-6)
    if repeats == 2:
        assert pooled == pytest.approx(got, abs=1e-6)
    else:  # later repeats are pooled in, and their queries have several successors
        assert max(abs(a - b) for a, b in zip(pooled, got, strict=True)) > 1e-3


def test_induction_skips_queries_with_several_earlier_occurrences():
    # A B A B A: the query at 3 (second A) sees one earlier A (-> B at 2); the query at 5
    # (third A) sees two and is left out of induction, counted in induction_pooled
    ids = [BOS, A, B, A, B, A]
    pattern = torch.zeros(1, 1, 6, 6)
    pattern[0, 0, :, 0] = 1.0
    pattern[0, 0, 3] = 0
    pattern[0, 0, 3, 2] = 1.0  # the one earlier successor of the second A
    pattern[0, 0, 4] = 0
    pattern[0, 0, 4, 3] = 0.5  # second B: its successor A at 3, half the weight
    pattern[0, 0, 4, 0] = 0.5
    pattern[0, 0, 5] = 0
    pattern[0, 0, 5, 2], pattern[0, 0, 5, 4] = 0.25, 0.75  # third A, both successors
    ctx = ctx_for(ids)
    assert patterns.induction(pattern, ctx).item() == pytest.approx((1.0 + 0.5) / 2)
    assert patterns.induction_pooled(pattern, ctx).item() == pytest.approx((1.0 + 0.5 + 1.0) / 3)


DISTINCT_TEXT = " a and bread cat dog fox made on over rug salt sat the"  # 26 distinct tokens


@pytest.mark.parametrize("repeats", [2, 3])
def test_induction_agrees_with_transformer_lens_detect_head(llama, repeats):
    text = DISTINCT_TEXT * repeats
    ids = llama.bridge.to_tokens(text)[0]
    seq_len = (len(ids) - 1) // repeats
    assert ids[1:].tolist() == ids[1:1 + seq_len].tolist() * repeats
    assert len(set(ids[1:1 + seq_len].tolist())) == seq_len  # the tokens are distinct
    n = len(ids)
    ours = reduce_patterns(llama, [Prompt(token_ids=tuple(ids.tolist()))],
                           {"induction": patterns.induction})
    ours = ours.set_index(["layer", "head"]).score.to_numpy()
    if repeats == 2:  # TransformerLens' own induction pattern marks exactly the second repeat
        detection = "induction_head"
    else:  # its pattern would pool the third repeat: mark the second repeat by hand
        detection = torch.zeros(n, n)
        for q in range(1 + seq_len, 1 + 2 * seq_len):
            detection[q, q - seq_len + 1] = 1.0
    tl = detect_head(llama.bridge, text, detection, error_measure="mul")  # [layer, head]
    # 'mul' divides the stripe by all n queries; Olsson's score by the seq_len of the stripe
    np.testing.assert_allclose(ours.reshape(tl.shape), tl.numpy() * n / seq_len, atol=1e-5)


def test_null_scores_are_uniform_pattern_scores(llama):
    prompt = Prompt(token_ids=tuple(REPEATED))
    null = null_scores(llama, [prompt], {"previous_token": patterns.previous_token,
                                         "first_token": patterns.first_token}).set_index("metric")
    n = len(REPEATED)
    assert null.score["previous_token"] == pytest.approx(np.mean([1 / (i + 1)
                                                                   for i in range(1, n)]))
    assert null.score["first_token"] == pytest.approx(np.mean([1 / (i + 1) for i in range(n)]))
    assert uniform_pattern(4, causal=False).sum(-1).tolist() == [[[1.0] * 4]]


def test_previous_token_and_induction_stripe_agree_with_transformer_lens(llama):
    text = "the cat sat on the mat and the dog sat on the rug the cat sat on the mat"
    ids = llama.bridge.to_tokens(text)[0]
    n = len(ids)
    ours = reduce_patterns(llama, [Prompt(token_ids=tuple(ids.tolist()))],
                           {"previous_token": patterns.previous_token,
                            "stripe": patterns.induction_stripe_sum})
    ours = ours.pivot_table(index=["layer", "head"], columns="metric", values="score")
    for name, metric, factor in (("previous_token_head", "previous_token", (n - 1) / n),
                                 ("induction_head", "stripe", 1.0)):
        tl = detect_head(llama.bridge, text, name, error_measure="mul")  # [layer, head]
        mine = ours[metric].to_numpy().reshape(tl.shape) * factor
        np.testing.assert_allclose(mine, tl.numpy(), atol=1e-5)


def test_copying_score_matches_a_direct_computation_from_hf_weights(llama):
    hf = llama.bridge.original_model
    tokens = torch.tensor([20, 40, 60, 80])
    got = copying_scores(llama, tokens)
    n_rep = llama.info.n_heads // llama.info.n_kv_heads
    d = llama.info.d_head
    with torch.no_grad():
        for layer in range(2):
            attn = hf.model.layers[layer].self_attn
            x = hf.model.layers[layer].input_layernorm(hf.model.embed_tokens.weight[tokens])
            v = (x @ attn.v_proj.weight.T).view(len(tokens), -1, d)
            for head in range(4):
                o = v[:, head // n_rep] @ attn.o_proj.weight[:, head * d:(head + 1) * d].T
                logits = hf.lm_head(hf.model.norm(o))
                own = logits[torch.arange(len(tokens)), tokens]
                z = (own - logits.mean(-1)) / logits.std(-1)
                torch.testing.assert_close(got[:, layer, head], z, atol=1e-4, rtol=1e-4)


def test_repeat_losses_index_the_right_tokens():
    seq_len, repeats = 3, 2
    # loss vector entry t is the loss on position t + 1; positions 1..3 repeat 1, 4..6 repeat 2
    loss = torch.tensor([9.0, 1.0, 2.0, 9.0, 3.0, 5.0])
    out = repeat_losses([loss], seq_len, repeats)
    assert out.tolist() == [[1.5, 4.0]]  # each repeat's first token is left out
    # without BOS the repeats hold positions 0..2 and 3..5
    assert repeat_losses([loss], seq_len, repeats, start=0).tolist() == [[5.0, 6.0]]


def test_icl_scores_read_positions_50_and_500():
    # the loss on the token at position t is t / 100 (entry t - 1 of each vector)
    losses = np.tile(np.arange(1, 512) / 100, (3, 1))
    losses[1, 500 - 1] += 3.0  # a spike at position 500 of one prompt
    rows = icl_rows(losses, 10, n_boot=50, seed=0).set_index("metric")
    assert rows.value["icl_score"] == pytest.approx(4.5 + 1.0)
    assert rows.value["icl_score_window"] == pytest.approx(4.5 + 1.0 / 21)
    assert rows.loss_at_50["icl_score"] == pytest.approx(0.5)


def test_ablation_choices():
    rows = [(0, h, "previous_token", s) for h, s in enumerate([0.9, 0.1, 0.2, 0.8])]
    rows += [(1, h, "previous_token", s) for h, s in enumerate([0.95, 0.1, 0.1, 0.1])]
    rows += [(1, 2, "induction", 0.9), (1, 0, "induction", 0.1)]
    table = pd.DataFrame(rows, columns=["layer", "head", "metric", "score"])
    tracked = top_heads(table, "induction", 1)
    assert tracked == [(1, 2)]
    chosen = choose_ablation(table, tracked, 2)
    assert chosen == [(0, 0), (0, 3)]  # only layers below the induction head's layer
