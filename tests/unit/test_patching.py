"""Activation and path patching on the tiny Llama, against references: patching every
position restores the clean metric exactly and patching nothing leaves the corrupted one;
the batched, replayed grid equals one plain hooked pass per cell; the MLP of the last layer
patched at the answer position is the hand-computed readout of the swapped stream; a path
patch changes a receiver's query by exactly the projected difference."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests import tiny
from tests.architectures.families import build
from workbench.core.errors import WorkbenchError
from workbench.inputs.batching import Batch
from workbench.interventions.patching import EVERY, NOTHING, Pair, patch_grid, site_hook
from workbench.interventions.paths import path_patched, path_removed, source_outputs
from workbench.models.norms import first_norm, normalise
from workbench.recording import hooks
from workbench.scores.logit_attribution import Contrast
from workbench.scores.stats import bootstrap_ratio_ci

N, T = 5, 9


@pytest.fixture(scope="module")
def pair():
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(10, 290, (N, T), generator=gen)
    clean[:, 0] = 0
    corrupted = clean.clone()
    corrupted[:, [2, 5]] = torch.randint(10, 290, (N, 2), generator=gen)
    contrast = Contrast(torch.randint(10, 290, (N,), generator=gen),
                        torch.randint(10, 290, (N,), generator=gen))
    return Pair(clean, corrupted, contrast, torch.tensor([8, 8, 7, 8, 6]))


@pytest.fixture(scope="module")
def grids(llama, pair):
    cells = [*range(T), EVERY, NOTHING]
    with torch.no_grad():
        return {site: patch_grid(llama, pair, site, cells=None if site == "z" else cells,
                                 max_batch_tokens=64)
                for site in ("resid_pre", "attn_out", "mlp_out", "z")}


def _diff(logits, pair):
    rows = torch.arange(N)
    at = logits[rows, pair.positions].double()
    return (at[rows, pair.contrast.answer] - at[rows, pair.contrast.other]).numpy()


def _plain(model, pair, site, layer, cell):
    """One plain hooked pass of the whole model (no batching of cells, no replay)."""
    name = site_hook(site, layer, model.info.n_layers)
    clean = hooks.capture(model, Batch.of(pair.clean), [name])[name]

    def hook(t, hook):
        t = t.clone()
        if cell == EVERY:
            t[:] = clean
        elif site == "z":
            t[:, :, cell] = clean[:, :, cell]
        elif cell != NOTHING:
            t[:, cell] = clean[:, cell]
        return t

    with torch.no_grad(), model.bridge.hooks(fwd_hooks=[(name, hook)]):
        return _diff(model.logits(pair.corrupted), pair)


def test_every_position_restores_the_clean_run_and_nothing_leaves_the_corrupted(llama, pair,
                                                                                 grids):
    with torch.no_grad():
        clean, corrupted = _diff(llama.logits(pair.clean), pair), _diff(
            llama.logits(pair.corrupted), pair)
    resid = grids["resid_pre"]
    np.testing.assert_allclose(resid.clean, clean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resid.corrupted, corrupted, rtol=1e-5, atol=1e-6)
    assert np.abs(clean.mean() - corrupted.mean()) > 1e-2  # the corruption matters
    every, nothing = resid.cells.index(EVERY), resid.cells.index(NOTHING)
    for grid in grids.values():
        norm = grid.normalised()
        if NOTHING in grid.cells:
            np.testing.assert_allclose(norm[:, grid.cells.index(NOTHING)], 0, atol=1e-5)
    np.testing.assert_allclose(resid.normalised()[:, every], 1, atol=1e-5)
    np.testing.assert_allclose(resid.values[:, :, every], clean[:, None].repeat(2, 1),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resid.values[:, :, nothing], corrupted[:, None].repeat(2, 1),
                               rtol=1e-5, atol=1e-6)
    # positions the corruption did not touch, before any block mixed them in, change nothing
    np.testing.assert_allclose(resid.normalised()[0, [0, 1, 3]], 0, atol=1e-5)
    # every head of a layer patched is its whole attention output patched
    heads = grids["z"]
    np.testing.assert_allclose(heads.values[:, :, heads.cells.index(EVERY)],
                               grids["attn_out"].values[:, :, every], rtol=1e-5, atol=1e-6)
    low, high = resid.interval(n_boot=200)
    np.testing.assert_allclose(low[:, every], 1, atol=1e-5)
    np.testing.assert_allclose(high[:, every], 1, atol=1e-5)
    assert np.all(low <= resid.normalised() + 1e-9) and np.all(resid.normalised() <= high + 1e-9)


@pytest.mark.parametrize("site", ["resid_pre", "attn_out", "mlp_out", "z"])
def test_the_batched_replayed_grid_is_one_plain_pass_per_cell(llama, pair, grids, site):
    grid = grids[site]
    for li, layer in enumerate(grid.layers):
        for ci, cell in enumerate(grid.cells):
            np.testing.assert_allclose(grid.values[:, li, ci], _plain(llama, pair, site, layer,
                                                                      cell),
                                       rtol=1e-5, atol=1e-5, err_msg=f"{site} L{layer} {cell}")


def test_the_last_mlp_patched_at_the_answer_is_the_readout_of_the_swapped_stream(llama, pair,
                                                                                  grids):
    n_layers = llama.info.n_layers
    names = [hooks.resid(n_layers, n_layers), hooks.mlp_out(n_layers - 1)]
    with torch.no_grad():
        clean = hooks.capture(llama, Batch.of(pair.clean), names)
        corrupted = hooks.capture(llama, Batch.of(pair.corrupted), names)
    rows = torch.arange(N)
    final = corrupted[names[0]].clone()
    final[rows, pair.positions] += (clean[names[1]] - corrupted[names[1]])[rows, pair.positions]
    with torch.no_grad():
        logits = llama.bridge.ln_final(final) @ llama.bridge.W_U + llama.bridge.b_U
    want = _diff(logits, pair)
    grid = grids["mlp_out"]
    got = grid.values[rows, -1, [grid.cells.index(int(p)) for p in pair.positions]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_token_budget_changes_nothing(llama, pair, grids):
    with torch.no_grad():
        one = patch_grid(llama, pair, "z", layers=[1], max_batch_tokens=1)
        wide = patch_grid(llama, pair, "z", layers=[1], max_batch_tokens=10_000)
    np.testing.assert_allclose(one.values, wide.values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one.values[:, 0], grids["z"].values[:, 1], rtol=1e-5, atol=1e-6)


def test_the_ratio_interval_resamples_prompts_together():
    num = np.array([[1.0], [2.0], [3.0]])
    low, high = bootstrap_ratio_ci(num, np.array([1.0, 2.0, 3.0]), n_boot=100)
    np.testing.assert_allclose([low[0], high[0]], [1.0, 1.0])  # the ratio is 1 in every resample
    low, high = bootstrap_ratio_ci(num, np.array([1.0, 1.0, 1.0]), n_boot=500)
    assert 1.0 <= low[0] < 2.0 < high[0] <= 3.0


def test_bad_pairs_and_cells_are_refused(llama, pair):
    with pytest.raises(WorkbenchError, match="one shape"):
        Pair(pair.clean, pair.corrupted[:, :-1], pair.contrast, pair.positions)
    with pytest.raises(WorkbenchError, match="answers and positions"):
        Pair(pair.clean, pair.corrupted, pair.contrast, pair.positions[:2])
    with pytest.raises(WorkbenchError, match="inside"):
        Pair(pair.clean, pair.corrupted, pair.contrast, torch.full((N,), T))
    with pytest.raises(WorkbenchError, match="heads"):
        patch_grid(llama, pair, "z", cells=[4])
    with pytest.raises(WorkbenchError, match="site must be"):
        patch_grid(llama, pair, "hook_q")
    with pytest.raises(WorkbenchError, match="layers"):
        patch_grid(llama, pair, "resid_pre", layers=[2])


def _q(model, ids, layer, fwd=()):
    kept, keep = hooks.caching_hooks([hooks.qkv(layer, "q"), hooks.norm_scale(layer)])
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=[*fwd, *keep]):
        model.bridge(ids, return_type=None)
    return kept[hooks.qkv(layer, "q")].double(), kept[hooks.norm_scale(layer)][..., 0].double()


def test_a_path_patch_moves_the_receivers_query_by_the_projected_difference(llama, pair):
    clean, corrupted = Batch.of(pair.clean), Batch.of(pair.corrupted)
    sources = ["L0H1", "L0MLP"]
    with torch.no_grad():
        own = source_outputs(llama, clean, sources)
        other = source_outputs(llama, corrupted, sources)
    q_clean, scale = _q(llama, pair.clean, 1)
    with path_patched(llama, sources, [(1, 3)], "q", own):  # its own outputs: nothing moves
        q_same, _ = _q(llama, pair.clean, 1)
    torch.testing.assert_close(q_same, q_clean, rtol=1e-6, atol=1e-6)
    with path_patched(llama, sources, [(1, 3)], "q", other):
        q, _ = _q(llama, pair.clean, 1)
    diff = sum(other[s].double() - own[s].double() for s in sources)
    w_q = llama.bridge.W_Q[1, 3].detach().double()
    by_hand = normalise(diff, scale, first_norm(llama, 1)) @ w_q
    torch.testing.assert_close(q[:, :, 3] - q_clean[:, :, 3], by_hand, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(q[:, :, :3], q_clean[:, :, :3])  # the other heads' queries
    with pytest.raises(WorkbenchError, match="no output on the other input"), \
            path_patched(llama, ["L0H2"], [(1, 3)], "q", other):
        pass


def test_every_source_removed_from_a_query_leaves_its_bias_through_an_output_norm(tokenizer):
    """On a tiny Gemma 3 the heads reach the stream through ``ln1_post``: removing every
    part of the stream from a layer-1 query must leave nothing (no q bias)."""
    gemma = tiny.wrap(copy.deepcopy(build("gemma-3", len(tokenizer))), tokenizer, "tiny-gemma3")
    ids = torch.tensor([[0, *range(10, 19)]])
    sources = ["embed", *(f"L0H{h}" for h in range(4)), "L0MLP"]
    q_clean, _ = _q(gemma, ids, 1)
    with path_removed(gemma, sources, [(1, 0)], "q"):
        q, _ = _q(gemma, ids, 1)
    assert q_clean[:, :, 0].abs().max() > 1e-2
    assert q[:, :, 0].abs().max() <= 1e-5 * q_clean[:, :, 0].abs().max()
