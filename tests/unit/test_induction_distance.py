"""Induction at distance: the grid, the prompts, and every number against plain Hugging
Face eager attention and logits of the same tiny model, computed here from the definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from experiments import induction_distance as dist
from workbench.core.errors import WorkbenchError
from workbench.harness.experiment import run_experiment

CFG = {"n_prompts": 3, "seq_len": 5, "distances": (5, 9, 17), "n_boot": 50}


def test_the_default_grid_doubles_from_seq_len_and_ends_at_the_longest_fit():
    cfg = dist.Config(seq_len=32, max_tokens=1024)
    assert dist.grid(cfg, 1, 8192) == [32, 64, 128, 256, 512, 991]  # 1 + 991 + 32 = 1024
    assert dist.grid(dist.Config(seq_len=32), 1, 8192)[-1] == 8159  # the model's context
    assert dist.grid(dist.Config(seq_len=4, max_tokens=37), 1, 64) == [4, 8, 16, 32]
    assert dist.grid(dist.Config(seq_len=4, distances=(9, 5, 9)), 1, 64) == [5, 9]


@pytest.mark.parametrize(("changes", "message"), [
    ({"distances": (3,)}, "below seq_len 4"),
    ({"distances": (60,)}, "needs 65 tokens; the model's context is 64"),
    ({"max_tokens": 6}, "leaves no distance"),
])
def test_a_distance_that_cannot_be_measured_is_refused(changes, message):
    with pytest.raises(WorkbenchError, match=message):
        dist.grid(dist.Config(seq_len=4, **changes), 1, 64)


def test_a_prompt_holds_its_sequence_twice_with_its_own_filler_between(llama):
    cfg = dist.Config(**{k: v for k, v in CFG.items() if k != "distances"})
    seqs = dist.sequences(llama, cfg, 17)
    for i in range(cfg.n_prompts):
        seq, ids = seqs.random[i], list(seqs.prompt(llama, i, 9).token_ids)
        assert len(set(seq)) == len(seq) and not set(seq) & set(seqs.filler[i])
        assert ids == llama.frame([*seq, *seqs.filler[i][:4], *seq])
        longer = list(seqs.prompt(llama, i, 17).token_ids)
        assert longer[:1 + 9] == ids[:1 + 9]  # the shorter filler starts the longer one
    assert seqs.random[0] != seqs.random[1] and seqs.filler[0] != seqs.filler[1]


def test_scores_and_losses_equal_eager_attention_and_logits(llama, llama_hf, tmp_path):
    run = run_experiment("induction-distance", llama, CFG, runs_dir=tmp_path)
    scores, losses = run.table("distance_scores"), run.table("distance_losses")
    cfg = dist.Config(**CFG)
    seqs = dist.sequences(llama, cfg, max(CFG["distances"]))
    L, s = cfg.seq_len, 1  # after BOS
    for d in CFG["distances"]:
        want = np.zeros((llama.info.n_layers, llama.info.n_heads))
        first, second = [], []
        for i in range(cfg.n_prompts):
            ids = torch.tensor([seqs.prompt(llama, i, d).token_ids])
            with torch.no_grad():
                out = llama_hf(ids, output_attentions=True)
            q = torch.arange(s + d, s + d + L)
            for layer, a in enumerate(out.attentions):
                want[layer] += a[0][:, q, q - d + 1].mean(-1).numpy() / cfg.n_prompts
            nll = F.cross_entropy(out.logits[0, :-1], ids[0, 1:], reduction="none")
            first.append(nll[s:s + L - 1].mean().item())  # predicting tokens s+1 .. s+L-1
            second.append(nll[s + d:s + d + L - 1].mean().item())
        got = scores[scores.distance == d].sort_values(["layer", "head"]).score.to_numpy()
        np.testing.assert_allclose(got, want.reshape(-1), atol=1e-5)
        row = losses.set_index("distance").loc[d]
        np.testing.assert_allclose([row.first_loss, row.second_loss, row["drop"]],
                                   [np.mean(first), np.mean(second),
                                    np.mean(first) - np.mean(second)], atol=1e-4)
        assert row.ci_low <= row["drop"] <= row.ci_high


def test_the_null_is_uniform_attention_over_the_keys_each_query_sees(llama):
    # queries of the second occurrence at positions 1 + 9 + j (j < 5): keys 0 .. 10 + j
    want = np.mean([1 / (11 + j) for j in range(5)])
    assert dist.uniform_null(llama, 9, 5, 1) == pytest.approx([want] * llama.info.n_layers)
