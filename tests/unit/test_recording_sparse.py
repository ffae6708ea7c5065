"""Sparse (top-k) recordings keep the exact channels, every row's mass, and the scores that
read them; the pooled overview and windows read only the chunks they show."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.inputs.prompts import Prompt
from workbench.recording import zarr_store
from workbench.recording.reductions import PatternContext
from workbench.recording.writer import record
from workbench.scores import patterns

TEXTS = ["the cat sat on the mat and the dog sat on the rug " * 3,
         "a quick brown fox jumps over the lazy dog by the river", "bread"]
K = 4


@pytest.fixture(scope="module", params=["llama", "bert"])
def pair(request, tmp_path_factory):
    """The same prompts recorded dense (float32) and as top-4, on one tiny model."""
    model = request.getfixturevalue(request.param)
    prompts = [Prompt(text=t) for t in TEXTS]
    folder = tmp_path_factory.mktemp(request.param)
    dense = record(model, prompts, folder / "dense", patterns="dense", store_dtype="float32")
    topk = record(model, prompts, folder / "topk", patterns="topk", topk=K)
    return model, dense, topk


def test_exact_channels_equal_the_dense_weights(pair):
    _, dense, topk = pair
    for i in range(len(dense)):
        n = dense.length(i)
        q = np.arange(n)
        for layer in range(dense.n_layers):
            full = dense.pattern(i, layer)  # [head, query, key]
            rows = topk.pattern_sparse(i, layer)
            np.testing.assert_allclose(rows.first, full[:, :, 0], atol=1e-6)
            np.testing.assert_allclose(rows.diagonal, full[:, q, q], atol=1e-6)
            np.testing.assert_allclose(rows.previous[:, 1:], full[:, q[1:], q[1:] - 1],
                                       atol=1e-6)
            kept = np.take_along_axis(full, np.minimum(rows.keys, n - 1).astype(int), -1)
            real = rows.keys != rows.sentinel
            np.testing.assert_allclose(rows.weights[real], kept[real], atol=1e-6)
            # the kept weights are the k largest of each row
            largest = -np.sort(-full, axis=-1)[..., :K]
            np.testing.assert_allclose(np.sort(rows.weights, -1)[..., ::-1][..., :n],
                                       largest[..., : min(K, n)], atol=1e-6)


def test_kept_plus_left_out_mass_is_one_per_row(pair):
    _, dense, topk = pair
    for i in range(len(topk)):
        for layer in range(topk.n_layers):
            rows = topk.pattern_sparse(i, layer)
            np.testing.assert_allclose(rows.weights.sum(-1) + rows.left_out, 1.0, atol=1e-5)
            # the left-out mass is what the dense row holds outside the kept keys
            full = dense.pattern(i, layer)
            outside = full.sum(-1) - np.sort(full, -1)[..., ::-1][..., :K].sum(-1)
            np.testing.assert_allclose(rows.left_out, outside, atol=1e-5)


def _ctx(model, rec, i):
    n = rec.length(i)
    return PatternContext(input_ids=torch.tensor([rec.prompts[i].token_ids]),
                          lengths=torch.tensor([n]), query_mask=torch.ones(1, n, dtype=bool),
                          layer=0, causal=model.info.causal)


@pytest.mark.parametrize("metric", [patterns.first_token, patterns.previous_token,
                                    patterns.self_attention])
def test_sink_previous_and_self_scores_equal_the_dense_ones(pair, metric):
    model, dense, topk = pair
    for i in range(len(dense)):
        for layer in range(dense.n_layers):
            full = torch.from_numpy(dense.pattern(i, layer))[None]
            view = torch.from_numpy(topk.pattern(i, layer))[None]  # the dense view
            np.testing.assert_allclose(metric(view, _ctx(model, topk, i)),
                                       metric(full, _ctx(model, dense, i)), atol=1e-6)


def test_dense_view_is_the_kept_and_exact_weights_and_zero_elsewhere(pair):
    _, dense, topk = pair
    for i in range(len(topk)):
        n = dense.length(i)
        full, view = dense.pattern(i, 1), topk.pattern(i, 1)
        rows = topk.pattern_sparse(i, 1)
        shown = np.zeros(full.shape, dtype=bool)  # kept keys, first token, diagonal, previous
        real = rows.keys != rows.sentinel
        heads, queries, _ = np.nonzero(real)
        shown[heads, queries, rows.keys[real].astype(int)] = True
        q = np.arange(n)
        shown[:, q, 0] = shown[:, q, q] = True
        shown[:, q[1:], q[1:] - 1] = True
        np.testing.assert_allclose(view, np.where(shown, full, 0.0), atol=1e-6)
        assert (view.sum(-1) <= 1 + 1e-5).all()  # the left-out mass is spread nowhere


def _reference_pool(full, factor, how):
    """Pooling by its definition: each cell the max (sum) of its factor x factor square."""
    q, k = full.shape
    out = np.zeros((-(-q // factor), -(-k // factor)), dtype=np.float32)
    for a in range(out.shape[0]):
        for b in range(out.shape[1]):
            cell = full[a * factor:(a + 1) * factor, b * factor:(b + 1) * factor]
            out[a, b] = cell.max() if how == "max" else cell.sum()
    return out


@pytest.mark.parametrize("how", ["max", "sum"])
def test_pooled_overview_and_window_match_the_definition(pair, how):
    _, dense, topk = pair
    n = dense.length(0)
    for rec in (dense, topk):
        full = rec.pattern(0, 1, head=2)
        pooled = rec.pooled(0, 1, 2, max_cells=16, how=how)
        assert pooled.factor == -(-n // 16) and pooled.how == how
        np.testing.assert_allclose(pooled.grid, _reference_pool(full, pooled.factor, how),
                                   atol=1e-5)
        window = rec.pooled(0, 1, 2, window=(20, 40, 3, 30), max_cells=64, how=how)
        assert window.factor == 1
        np.testing.assert_allclose(window.grid, full[20:40, 3:30], atol=1e-6)


def test_a_window_reads_only_the_chunks_of_its_rows(llama, tmp_path, monkeypatch):
    monkeypatch.setattr(zarr_store, "QUERY_BLOCK", 8)
    read: list[str] = []
    get = zarr_store.ConfinedStore.get

    async def counting(self, key, *args, **kwargs):
        read.append(key)
        return await get(self, key, *args, **kwargs)

    text = "the cat sat on the mat and the dog sat on the rug " * 4
    for storage, kinds in (("dense", ["attn"]), ("topk", ["topk_weights", "exact"])):
        rec = record(llama, [Prompt(text=text)], tmp_path / storage, patterns=storage,
                     include_resid=False, topk=K)
        assert rec.length(0) > 32
        read.clear()
        monkeypatch.setattr(zarr_store.ConfinedStore, "get", counting)
        rec.pooled(0, 1, 0, window=(17, 30, 0, 30))
        monkeypatch.setattr(zarr_store.ConfinedStore, "get", get)
        chunks = sorted({k for k in read if "/c/" in k and "topk_keys" not in k})
        # query rows 17..29 lie in query blocks 2 and 3 of 8 rows
        assert chunks == sorted(f"{kind}/L001/c/0/0/{b}/0" for kind in kinds for b in (2, 3))


def test_first_key_mass_is_the_mean_first_column_in_both_storages(pair):
    _, dense, topk = pair
    for i in range(len(dense)):
        n = dense.length(i)
        for layer in range(dense.n_layers):
            full = dense.pattern(i, layer)  # (head, query, key)
            want = full[:, 1:, 0].mean(axis=1) if n > 1 else np.zeros(dense.n_heads)
            np.testing.assert_allclose(dense.first_key_mass(i, layer), want, atol=1e-6)
            np.testing.assert_allclose(topk.first_key_mass(i, layer), want, atol=1e-3)


def test_a_dense_view_of_some_keys_is_those_columns_of_the_sparse_form(pair):
    _, _, topk = pair
    whole = topk.pattern(0, 1)
    np.testing.assert_array_equal(topk.pattern(0, 1, keys=(2, 9)), whole[..., 2:9])
    np.testing.assert_array_equal(topk.pattern(0, 1, 2, queries=(3, 7), keys=(0, 4)),
                                  whole[2, 3:7, :4])
