"""What the induction-heads experiment reuses instead of measuring again.

References: the repeat losses of prompts cut after their second repeat against the whole
prompts' losses at the same positions (a causal model's loss on a token sees only the
tokens before it); the ablation's clean row against the clean model measured again.
"""

from __future__ import annotations

import pytest
import torch

from experiments.induction_heads import Config
from experiments.induction_heads.measure import (
    _measured,
    ablation_table,
    first_repeats,
    head_score_table,
)
from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import Prompt, load_prompt_set
from workbench.scores.heads import top_heads
from workbench.scores.losses import repeat_losses, token_losses

SEQ_LEN, REPEATS = 7, 3


def test_the_cut_prompts_keep_the_first_repeats_after_bos():
    prompts = [Prompt(token_ids=(1, *(list(range(10, 17)) * REPEATS)), label="a")]
    start, cut = first_repeats(prompts, SEQ_LEN, REPEATS, keep=2)
    assert start == 1
    assert cut[0].token_ids == (1, *range(10, 17), *range(10, 17))
    assert cut[0].label == "a"
    start, cut = first_repeats([Prompt(token_ids=tuple(range(10, 17)) * REPEATS)],
                               SEQ_LEN, REPEATS, keep=1)
    assert start == 0  # no BOS token
    assert cut[0].token_ids == tuple(range(10, 17))


def test_prompts_that_are_not_the_stated_repeats_are_refused():
    with pytest.raises(ValueError, match="prompt lengths \\[22, 23\\]"):
        first_repeats([Prompt(token_ids=(0,) * 22), Prompt(token_ids=(0,) * 23)],
                      SEQ_LEN, REPEATS, keep=2)
    with pytest.raises(ValueError, match="prompt lengths \\[30\\]"):
        first_repeats([Prompt(token_ids=(0,) * 30)], SEQ_LEN, REPEATS, keep=2)


def test_losses_of_the_cut_prompts_are_the_whole_prompts_losses(llama):
    prompts = load_prompt_set("repeated-random", llama, n_prompts=3, seq_len=SEQ_LEN,
                              repeats=REPEATS, seed=0)
    start, cut = first_repeats(prompts, SEQ_LEN, REPEATS, keep=2)
    whole = repeat_losses(token_losses(llama, prompts), SEQ_LEN, REPEATS, start=start)
    short = repeat_losses(token_losses(llama, cut), SEQ_LEN, 2, start=start)
    assert short.shape == (3, 2)
    torch.testing.assert_close(torch.from_numpy(short), torch.from_numpy(whole[:, :2]),
                               atol=1e-5, rtol=0)


def test_the_ablation_s_clean_row_is_the_clean_measurement(llama):
    """The clean row, read from the head scores and the repeat losses, equals measuring the
    clean model again."""
    cfg = Config(n_prompts=4, seq_len=SEQ_LEN, repeats=REPEATS, n_random=1, n_natural=4,
                 n_track=1, n_ablate=1,
                 copying_tokens=20, n_boot=50)
    repeated = load_prompt_set("repeated-random", llama, n_prompts=cfg.n_prompts,
                               seq_len=SEQ_LEN, repeats=REPEATS, seed=cfg.seed)
    natural = token_chunks(llama, python_docs(), n_chunks=cfg.n_natural, n_tokens=32,
                           label="docs")
    head_scores, _, _ = head_score_table(llama, repeated, natural, cfg)
    start, _ = first_repeats(repeated, SEQ_LEN, REPEATS, keep=REPEATS)
    losses = repeat_losses(token_losses(llama, repeated), SEQ_LEN, REPEATS, start=start)
    table = ablation_table(llama, repeated, head_scores, losses, cfg)
    tracked = top_heads(head_scores, "induction", cfg.n_track)
    measured = _measured(llama, repeated, [], tracked, cfg)
    (clean,) = table[table.condition == "clean"].to_dict("records")
    assert clean["heads"] == measured["heads"] == "-"
    for column in ("induction_tracked", "first_repeat_loss", "second_repeat_loss"):
        assert clean[column] == pytest.approx(measured[column], abs=1e-5), column
    assert len(table) == 1 + 2 * (1 + cfg.n_random)
