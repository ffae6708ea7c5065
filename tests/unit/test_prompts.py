"""Prompt sets: files in data/prompts, generated sets, batching."""

from __future__ import annotations

import pytest

from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.inputs.batching import make_batches
from workbench.inputs.prompts import (
    load_prompt_set,
    prompt_set_names,
    prompts_from_text,
    read_prompt_file,
)


def test_bundled_prompt_sets_are_listed_and_readable():
    assert {"natural", "sentence-pairs", "repeated-random"} <= set(prompt_set_names())
    natural = load_prompt_set("natural")
    assert len(natural) >= 10 and all(p.text and p.pair is None for p in natural)
    pairs = load_prompt_set("sentence-pairs")
    assert all(p.text and p.pair for p in pairs)


def test_unknown_prompt_set_lists_known_ones():
    with pytest.raises(UnknownNameError, match=r"known prompt sets: .*natural"):
        load_prompt_set("poetry")


def test_text_and_tsv_parsing(tmp_path):
    assert [p.text for p in prompts_from_text("one\ntwo\n\n\nthree ")] == ["one two", "three"]
    with pytest.raises(WorkbenchError, match="empty"):
        prompts_from_text(" \n\n ")
    bad = tmp_path / "bad.tsv"
    bad.write_text("no tab here\n")
    with pytest.raises(WorkbenchError, match="line 1"):
        read_prompt_file(bad)


def test_repeated_random_tokens(llama):
    prompts = load_prompt_set("repeated-random", llama, n_prompts=3, seq_len=10, repeats=3,
                              seed=5)
    special = set(llama.tokenizer.all_special_ids)
    for p in prompts:
        ids = list(p.token_ids)
        assert ids[0] == llama.info.bos_token_id and len(ids) == 31
        body = ids[1:]
        assert body[:10] == body[10:20] == body[20:]
        assert not special & set(body)
    again = load_prompt_set("repeated-random", llama, n_prompts=3, seq_len=10, repeats=3, seed=5)
    assert again == prompts
    assert load_prompt_set("repeated-random", llama, n_prompts=3, seq_len=10, seed=6) != prompts


def test_paired_batches_keep_each_length_in_twos():
    # lengths 3 x1, 4 x2, 6 x5, 9 x2: a budget that fits one 9-token prompt alone
    lengths = [6, 4, 9, 6, 3, 6, 4, 9, 6, 6]
    encoded = [([1] * n, None) for n in lengths]
    unpaired = list(make_batches(encoded, pad_id=0, max_tokens=9))
    assert any(len(b.indices) == 1 and b.lengths == [9] for b in unpaired)
    batches = list(make_batches(encoded, pad_id=0, max_tokens=9, paired=True))
    assert sorted(i for b in batches for i in b.indices) == list(range(10))
    for b in batches:
        counts = {n: b.lengths.count(n) for n in b.lengths}
        # every length but the lone 3 has a partner in its batch
        assert all(c >= 2 for n, c in counts.items() if n != 3), b.lengths
        assert b.attention_mask.sum(1).tolist() == b.lengths
        # over the budget only where one unit of two (or three) is
        assert b.input_ids.numel() <= 9 or len(set(b.lengths)) == 1, b.lengths
    # five prompts of 6 tokens: a two and a three, never a one
    sixes = sorted(b.lengths.count(6) for b in batches if 6 in b.lengths)
    assert sum(sixes) == 5 and min(sixes) >= 2


def test_batches_cover_every_prompt_once_and_respect_the_budget():
    encoded = [([1] * n, None) for n in (5, 1, 9, 3, 9, 2)]
    batches = list(make_batches(encoded, pad_id=0, max_tokens=18))
    assert sorted(i for b in batches for i in b.indices) == list(range(6))
    for b in batches:
        assert b.input_ids.numel() <= 18 or len(b.indices) == 1
        assert b.attention_mask.sum(1).tolist() == b.lengths
