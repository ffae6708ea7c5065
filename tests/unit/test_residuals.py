"""Residual-stream scans against Hugging Face's own hidden states, and their reductions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.inputs.prompts import Prompt
from workbench.recording.residuals import (
    MASSIVE_MAGNITUDE,
    MASSIVE_RATIO,
    is_massive,
    massive_by_boundary,
    scan_residuals,
    spread_by_boundary,
)


def reference_rows(h: torch.Tensor, top_k: int = 3) -> list[tuple]:
    """(rank, magnitude, position, dim, median, spread) of one [pos, d_model] state."""
    flat = h.abs().reshape(-1)
    order = flat.argsort(descending=True)[:top_k]
    median, spread = float(h.abs().median()), float((h - h[0]).abs().max())
    return [(rank + 1, float(flat[i]), int(i) // h.shape[1], int(i) % h.shape[1], median,
             spread) for rank, i in enumerate(order)]


def test_scan_matches_the_hidden_states_of_huggingface(llama, llama_hf):
    ids = torch.randint(6, 300, (2, 11), generator=torch.Generator().manual_seed(0))
    prompts = [Prompt(token_ids=tuple(row.tolist())) for row in ids]
    scan = scan_residuals(llama, prompts)
    n_layers = llama.info.n_layers
    assert len(scan) == 2 * (n_layers + 1) * 3
    with torch.inference_mode():
        states = llama_hf(ids, output_hidden_states=True).hidden_states
    # hidden_states[l] is the input of block l; the last one is after the final norm,
    # where boundary n_layers is before it
    for boundary in range(n_layers):
        for prompt in range(2):
            got = scan[(scan.prompt == prompt) & (scan.layer == boundary)]
            want = reference_rows(states[boundary][prompt])
            for row, (rank, magnitude, position, dim, median, spread) in zip(
                    got.itertuples(), want, strict=True):
                assert (row.rank, row.position, row.dim) == (rank, position, dim)
                assert row.magnitude == pytest.approx(magnitude, rel=1e-5)
                assert abs(row.value) == pytest.approx(magnitude, rel=1e-5)
                assert row.median_abs == pytest.approx(median, rel=1e-5)
                assert row.spread == pytest.approx(spread, rel=1e-4)
                assert row.max_abs == pytest.approx(want[0][1], rel=1e-5)


def test_padding_changes_nothing(llama):
    short, long = Prompt(token_ids=(0, 263, 19)), Prompt(token_ids=(0, *range(20, 40)))
    together = scan_residuals(llama, [short, long], max_batch_tokens=4096, top_k=2)
    alone = [scan_residuals(llama, [p], top_k=2) for p in (short, long)]
    for i, single in enumerate(alone):
        mine = together[together.prompt == i].drop(columns="prompt").reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, single.drop(columns="prompt"), rtol=1e-5)
    assert together[together.prompt == 0].position.max() <= 2  # never a padded position


def test_repeated_token_property_on_the_tiny_rotary_llama(llama):
    repeated = Prompt(token_ids=(263,) * 24)
    with_bos = Prompt(token_ids=(0, *(263,) * 23))
    table = scan_residuals(llama, [repeated, with_bos])
    same = spread_by_boundary(table[table.prompt == 0])
    assert list(same.layer) == list(range(llama.info.n_layers + 1))
    assert (same.relative_deviation <= 1e-5).all()
    # a different first token breaks the symmetry (the check can fail)
    differ = spread_by_boundary(table[table.prompt == 1])
    assert (differ.relative_deviation[differ.layer > 0] > 1e-3).all()


def test_massive_is_strict_on_both_bounds():
    assert (MASSIVE_MAGNITUDE, MASSIVE_RATIO) == (100, 1000)  # Sun et al. 2024, section 2
    assert not is_massive(100.0, 5000.0) and not is_massive(500.0, 1000.0)
    assert is_massive(100.5, 1000.5)
    got = is_massive(pd.Series([50.0, 200.0, 200.0]), pd.Series([2000.0, 2000.0, 10.0]),
                     min_magnitude=40, min_ratio=20)
    assert got.tolist() == [True, True, False]


def test_massive_by_boundary_by_hand():
    # three prompts at one boundary: (rank, magnitude, position, dim, median_abs)
    rows = [(0, 1, 9.0, 0, 5, 1.0), (0, 2, 4.0, 3, 5, 1.0),
            (1, 1, 30.0, 0, 7, 2.0), (1, 2, 3.0, 1, 5, 2.0),
            (2, 1, 12.0, 2, 5, 4.0), (2, 2, 2.0, 0, 1, 4.0)]
    scan = pd.DataFrame(rows, columns=["prompt", "rank", "magnitude", "position", "dim",
                                       "median_abs"]).assign(layer=0, input="a")
    scan = pd.concat([scan, scan.assign(input="b", magnitude=scan.magnitude * 10)])
    out = massive_by_boundary(scan, by=["input"])
    assert list(out.columns) == ["input", "layer", "top1", "top2", "median_abs", "ratio",
                                 "top1_position", "top1_position_share", "top1_dim",
                                 "top1_dim_share", "n_prompts"]
    a = out.iloc[0]
    assert (a.input, a.top1, a.top2, a.median_abs) == ("a", 12.0, 3.0, 2.0)
    assert a.ratio == pytest.approx(np.median([9 / 1, 30 / 2, 12 / 4]))
    assert (a.top1_position, a.top1_position_share) == (0, pytest.approx(2 / 3))
    assert (a.top1_dim, a.top1_dim_share) == (5, pytest.approx(2 / 3))
    assert a.n_prompts == 3
    assert out.iloc[1].input == "b" and out.iloc[1].top1 == 120.0
