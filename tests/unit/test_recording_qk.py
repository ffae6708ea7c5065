"""A ``qk`` recording: each layer's queries, keys and row log-sum-exps, from which every
weight is computed exactly. References: a dense float32 recording of the same prompts
(whose weights ``tests/architectures`` checks against the bridge's eager pattern), and
the workbench's scan of a registry metric."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.tiny import wrap
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.models.base import DTYPES
from workbench.models.fused import HALF_EPSILON
from workbench.recording import zarr_store
from workbench.recording.qk import Mask, QKLayer
from workbench.recording.reader import Recording
from workbench.recording.reductions import reduce_patterns
from workbench.recording.writer import record
from workbench.scores import metrics

TEXTS = ["the cat sat on the mat and the cat sat on the mat again",
         "a quick brown fox", "one two three four five six seven eight nine ten eleven"]


@pytest.fixture(scope="module", params=["llama", "bert", "bloom"])
def both(request, tmp_path_factory):
    """A model (grouped-query causal llama, bidirectional bert, Bloom with its ALiBi
    biases), and its dense float32 and qk recordings of prompts of three lengths (one
    batch, right-padded)."""
    if request.param == "bloom":
        from tests.architectures.families import build

        tokenizer = request.getfixturevalue("tokenizer")
        model = wrap(build("bloom", len(tokenizer)), tokenizer, "tiny-bloom")
    else:
        model = request.getfixturevalue(request.param)
    prompts = [Prompt(text=t) for t in TEXTS]
    root = tmp_path_factory.mktemp(f"qk-{request.param}")
    dense = record(model, prompts, root / "dense", patterns="dense", store_dtype="float32",
                   include_resid=False)
    qk = record(model, prompts, root / "qk", patterns="qk", include_resid=False)
    return model, dense, qk


def test_every_weight_equals_the_dense_recording(both):
    model, dense, qk = both
    assert qk.patterns == "qk" and qk.index.qk is not None
    assert qk.index.qk.kv_heads == model.info.n_kv_heads
    for prompt in range(len(TEXTS)):
        for layer in range(qk.n_layers):
            want = dense.pattern(prompt, layer)
            np.testing.assert_allclose(qk.pattern(prompt, layer), want, atol=1e-6, rtol=0)
            for head in range(qk.n_heads):
                np.testing.assert_allclose(qk.received(prompt, layer, head),
                                           want[head].sum(0), atol=1e-5, rtol=0)
                np.testing.assert_allclose(dense.received(prompt, layer, head),
                                           want[head].sum(0), atol=1e-5, rtol=0)
                stats = qk.row_stats(prompt, layer, head)
                w = want[head].astype(np.float64)
                entropy = -(w * np.log(np.where(w > 0, w, 1))).sum(-1)
                np.testing.assert_allclose(stats["entropy"], entropy, atol=1e-5, rtol=0)
                np.testing.assert_allclose(stats["first_token"], w[:, 0], atol=1e-6, rtol=0)
                np.testing.assert_allclose(stats["previous_token"][1:],
                                           np.diagonal(w, offset=-1), atol=1e-6, rtol=0)


def test_a_tile_is_the_rectangle_of_the_dense_pattern(both):
    _, dense, qk = both
    n = qk.length(0)
    want = dense.pattern(0, 1, 2)
    got = qk.tile(0, 1, 2, queries=slice(3, n - 1), keys=slice(2, 9))
    np.testing.assert_allclose(got, want[3:n - 1, 2:9], atol=1e-6, rtol=0)


def test_a_registry_metric_from_the_recording_equals_the_scan(both):
    """previous_token and first_token without the model, from the stored queries and
    keys, against the workbench's own scan of the same prompts."""
    model, _, qk = both
    prompts = [Prompt(text=t) for t in TEXTS]
    scan = reduce_patterns(model, prompts, metrics.reductions("previous_token", "first_token"))
    for row in scan.itertuples():
        stats = qk.row_stats(row.prompt, row.layer, row.head)
        mine = (stats["previous_token"][1:].mean() if row.metric == "previous_token"
                else stats["first_token"].mean())
        assert mine == pytest.approx(row.score, abs=1e-6), row


def test_a_tile_outside_the_prompt_is_one_line(both):
    _, dense, qk = both
    n = qk.length(1)
    for bad in (dict(queries=slice(0, n + 1)), dict(keys=slice(n, n + 2)),
                dict(queries=slice(5, 2))):
        with pytest.raises(WorkbenchError, match="is not a range of the prompt's") as caught:
            qk.tile(1, 0, 0, **bad)
        assert "\n" not in str(caught.value)
    with pytest.raises(WorkbenchError, match="head 9 is out of range"):
        qk.tile(1, 0, 9)
    with pytest.raises(WorkbenchError, match="stores dense patterns, not qk"):
        dense.tile(0, 0, 0)


def test_a_damaged_key_array_is_caught(both, tmp_path):
    import shutil

    _, _, qk = both
    copy = tmp_path / "qk"
    shutil.copytree(qk.root, copy)
    chunk = copy / zarr_store.GROUP / zarr_store.array_name("k", 0) / "c" / "0" / "0" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(ChecksumError):
        Recording.open(copy).verify()
    with pytest.raises(ChecksumError):
        Recording.open(copy).tile(0, 0, 0)


def test_an_index_whose_qk_facts_disagree_is_refused(both, tmp_path):
    import shutil

    _, _, qk = both
    copy = tmp_path / "qk"
    shutil.copytree(qk.root, copy)
    index = json.loads((copy / "index.json").read_text())
    index["qk"]["scale"] = index["qk"]["scale"][:1]
    (copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(WorkbenchError, match="a scale, a soft-cap and a window for every layer"):
        Recording.open(copy)


def test_alibi_slopes_are_stored_per_layer_and_head(both):
    model, _, qk = both
    alibi = qk.index.qk.alibi
    if model.info.name != "tiny-bloom":
        assert alibi is None
        return
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    # Press et al.'s geometric slopes, as Hugging Face builds them: the bias on key 1
    expected = build_alibi_tensor(torch.ones(1, 2), model.info.n_heads, torch.float32)[:, 0, 1]
    assert len(alibi) == model.info.n_layers
    for slopes in alibi:
        np.testing.assert_allclose(slopes, expected.numpy(), rtol=1e-6)


def test_a_path_qk_cannot_come_from_is_refused_before_any_work(tmp_path, llama):
    with pytest.raises(WorkbenchError, match="taken from the blocked attention path"):
        record(llama, [Prompt(text="hello")], tmp_path / "out", patterns="qk",
               attention="dense")
    assert not (tmp_path / "out").exists()


def test_a_topk_recording_receives_a_lower_bound(both, tmp_path):
    model, dense, _ = both
    topk = record(model, [Prompt(text=t) for t in TEXTS], tmp_path / "topk", patterns="topk",
                  topk=2, include_resid=False)
    exact = dense.received(0, 1, 0)
    low = topk.received(0, 1, 0)
    assert (low <= exact + 1e-6).all() and low.sum() < exact.sum() - 1e-3


@pytest.fixture(scope="module")
def stored(llama, tmp_path_factory):
    """The float32 grouped-query llama's dense float32 recording, and its qk recordings with
    queries and keys stored in each dtype (the default, float32, first)."""
    prompts = [Prompt(text=t) for t in TEXTS]
    root = tmp_path_factory.mktemp("qk-dtypes")
    dense = record(llama, prompts, root / "dense", patterns="dense", store_dtype="float32",
                   include_resid=False)
    qk = {dtype: record(llama, prompts, root / dtype, patterns="qk", include_resid=False,
                        qk_dtype=None if dtype == "float32" else dtype)
          for dtype in ("float32", "bfloat16", "float16")}
    return dense, qk


@pytest.mark.parametrize(("dtype", "array_dtype"), [("bfloat16", np.int16),
                                                    ("float16", np.float16)])
def test_a_half_dtype_halves_the_queries_and_keys(stored, dtype, array_dtype):
    _, qk = stored
    assert qk["float32"].index.qk.dtype == "float32"  # the model's own, by default
    assert qk[dtype].index.qk.dtype == dtype
    for layer in range(qk[dtype].n_layers):
        for kind in ("q", "k"):
            name = zarr_store.array_name(kind, layer)
            full, half = qk["float32"].array(name), qk[dtype].array(name)
            assert full.dtype == np.float32 and half.dtype == array_dtype
            assert half.nbytes * 2 == full.nbytes
        lse = zarr_store.array_name("lse", layer)
        assert qk[dtype].array(lse).dtype == np.float32
        np.testing.assert_array_equal(qk[dtype].array(lse), qk["float32"].array(lse))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_dtype_keeps_each_weight_within_the_bound(stored, dtype):
    """Each weight ``w`` of the dense recording within ``w (e^eta_i - 1)`` plus the 1e-6
    the exact tiles meet, ``eta_i`` from the float32 recording's queries and keys at the
    dtype's machine epsilon (:meth:`QKLayer.score_error`); the tiles widened to float32."""
    dense, qk = stored
    eps = HALF_EPSILON[DTYPES[dtype]]
    for prompt in range(len(TEXTS)):
        for layer in range(dense.n_layers):
            eta = qk["float32"].qk_layer(prompt, layer).score_error(eps).numpy()
            assert qk[dtype].qk_layer(prompt, layer).queries.dtype == torch.float32
            want = dense.pattern(prompt, layer)
            error = np.abs(qk[dtype].pattern(prompt, layer) - want)
            assert (error <= want * np.expm1(eta[:, :, None]) + 1e-6).all(), (prompt, layer)


def test_a_bfloat16_model_stores_its_own_values_by_default(llama_hf, tokenizer, tmp_path):
    """bfloat16 queries and keys are what a bfloat16 model's softmax saw: stored as they
    are by default, in half the bytes, and widening them to float32 adds nothing."""
    import copy

    model = wrap(copy.deepcopy(llama_hf).to(torch.bfloat16), tokenizer, "tiny-llama-bf16",
                 dtype="bfloat16")
    prompts = [Prompt(text=t) for t in TEXTS]
    own = record(model, prompts, tmp_path / "own", patterns="qk", include_resid=False)
    wide = record(model, prompts, tmp_path / "wide", patterns="qk", include_resid=False,
                  qk_dtype="float32")
    dense = record(model, prompts, tmp_path / "dense", patterns="dense",
                   store_dtype="float32", include_resid=False)
    assert (own.index.qk.dtype, wide.index.qk.dtype) == ("bfloat16", "float32")
    for name in own.array_names():
        if name.startswith(("q/", "k/")):
            assert own.array(name).nbytes * 2 == wide.array(name).nbytes
    for prompt in range(len(TEXTS)):
        for layer in range(own.n_layers):
            mine, theirs = own.qk_layer(prompt, layer), wide.qk_layer(prompt, layer)
            assert torch.equal(mine.queries, theirs.queries)
            assert torch.equal(mine.keys, theirs.keys)
            assert torch.equal(mine.lse, theirs.lse)
            # the stored column sums are the pass's own weights' (float32 from a softmax
            # over bfloat16 scores): the dense recording's, not a float32 recomputation's
            want = dense.pattern(prompt, layer).sum(1)
            np.testing.assert_allclose(np.stack([own.received(prompt, layer, head) for head
                                                 in range(own.n_heads)]), want, rtol=1e-5,
                                       atol=1e-6)


def _edited(rec: Recording, folder, edit) -> Recording:
    """A copy of ``rec`` whose ``index.json`` ``edit`` changed, opened."""
    import shutil

    shutil.copytree(rec.root, folder)
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))
    return Recording.open(folder)


def test_the_stored_dtype_is_checked_and_old_indexes_read_as_float32(stored, tmp_path):
    _, qk = stored
    old = _edited(qk["float32"], tmp_path / "old", lambda index: index["qk"].pop("dtype"))
    assert old.index.qk.dtype == "float32"
    np.testing.assert_array_equal(old.tile(0, 1, 2), qk["float32"].tile(0, 1, 2))
    for wrong, rec in (("bfloat16", qk["float32"]), ("float16", qk["bfloat16"]),
                       ("float32", qk["float16"])):
        with pytest.raises(WorkbenchError, match="recording is damaged"):
            _edited(rec, tmp_path / wrong, lambda index, d=wrong: index["qk"].update(dtype=d))


def test_float16_that_would_overflow_keeps_float32(llama_hf, tokenizer, tmp_path):
    """Queries past float16's 65504 are never stored as infinities: that layer's array is
    kept in float32 (exactly the values), the keys stay float16, and the recording opens."""
    import copy

    hf = copy.deepcopy(llama_hf)
    with torch.no_grad():
        hf.model.layers[0].self_attn.q_proj.weight.mul_(2.0 ** 20)
    model = wrap(hf, tokenizer, "tiny-llama-loud")
    prompts = [Prompt(text=t) for t in TEXTS]
    half = record(model, prompts, tmp_path / "half", patterns="qk", include_resid=False,
                  qk_dtype="float16")
    full = record(model, prompts, tmp_path / "full", patterns="qk", include_resid=False)
    assert np.abs(full.array("q/L000")).max() > np.finfo(np.float16).max
    assert half.array("q/L000").dtype == np.float32 and half.array("k/L000").dtype == np.float16
    assert half.array("q/L001").dtype == np.float16
    np.testing.assert_array_equal(half.array("q/L000"), full.array("q/L000"))
    assert np.isfinite(half.tile(0, 0, 1)).all()


@pytest.mark.parametrize("mask", [Mask(causal=True), Mask(causal=True, window=3),
                                  Mask(causal=True, window=1), Mask(causal=False),
                                  Mask(causal=False, window=4)],
                         ids=["causal", "window-3", "window-1", "bidirectional",
                              "bidirectional-window-4"])
def test_received_and_row_stats_over_the_seen_keys_are_those_of_the_whole_tile(
        mask, monkeypatch):
    """Each block of rows is computed over the keys it can see (``Mask.key_span``) only:
    the same column sums and row statistics as from the whole ``[T, T]`` tile, where
    every block spans several rows and the window starts past key 0."""
    from workbench.recording import qk

    torch.manual_seed(0)
    n = 13
    layer = QKLayer.of(torch.randn(2, n, 4), torch.randn(1, n, 4), scale=0.5, softcap=None,
                       mask=mask)
    monkeypatch.setattr(qk, "BLOCK_ELEMENTS", 3 * n)  # blocks of 3 rows
    for head in range(2):
        whole = layer.tile(head)                                   # [query, key]
        torch.testing.assert_close(layer.received(head), whole.sum(0), rtol=1e-6, atol=1e-7)
        stats = layer.row_stats(head)
        # (a narrower product may round its last bit apart from the whole tile's: a weight
        # of 1 - 2^-24 has an entropy of 6e-8)
        torch.testing.assert_close(stats["entropy"], torch.special.entr(whole).sum(-1),
                                   rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(stats["first_token"], whole[:, 0], rtol=1e-6, atol=1e-7)
        previous = torch.cat([torch.zeros(1), whole[torch.arange(1, n), torch.arange(n - 1)]])
        torch.testing.assert_close(stats["previous_token"], previous, rtol=1e-6, atol=1e-7)
    assert mask.key_span(slice(6, 9), n) == slice(
        0 if mask.window is None else max(0, 6 - mask.window + 1), 9 if mask.causal else n)


MASKS = [Mask(causal=True), Mask(causal=True, window=3), Mask(causal=True, window=1),
         Mask(causal=False), Mask(causal=False, window=4)]


@pytest.mark.parametrize("how", ["max", "sum"])
@pytest.mark.parametrize("mask", MASKS, ids=["causal", "window-3", "window-1",
                                             "bidirectional", "bidirectional-window-4"])
def test_pooled_cells_are_those_of_the_whole_tile(mask, how, monkeypatch):
    """Pooling computes only the keys each block of rows can see, widened to whole cells:
    every cell equals the max or sum of the same cell of the whole ``[T, T]`` tile, for
    windows whose corners fall inside cells and blocks, and ragged last cells."""
    from workbench.recording import qk

    torch.manual_seed(1)
    n = 29
    layer = QKLayer.of(torch.randn(2, n, 4), torch.randn(1, n, 4), scale=0.5, softcap=None,
                       mask=mask)
    monkeypatch.setattr(qk, "BLOCK_ELEMENTS", 40)  # a block of one or a few cells of rows
    for (q0, q1, k0, k1), factor in [((0, n, 0, n), 1), ((0, n, 0, n), 4), ((3, 26, 5, 28), 3),
                                     ((11, 29, 0, 9), 2), ((0, 7, 20, 29), 5)]:
        whole = layer.tile(1)[q0:q1, k0:k1]
        rows, cols = -(-(q1 - q0) // factor), -(-(k1 - k0) // factor)
        want = torch.zeros(rows, cols)
        for a in range(rows):
            for b in range(cols):
                cell = whole[a * factor:(a + 1) * factor, b * factor:(b + 1) * factor]
                want[a, b] = cell.max() if how == "max" else cell.sum()
        got = layer.pooled(1, slice(q0, q1), slice(k0, k1), factor, how)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_first_key_mass_and_the_pooled_view_equal_the_dense_recording(both):
    _, dense, qk = both
    for prompt in range(len(TEXTS)):
        for layer in range(qk.n_layers):
            np.testing.assert_allclose(qk.first_key_mass(prompt, layer),
                                       dense.first_key_mass(prompt, layer), atol=1e-6)
    n = qk.length(0)
    for how in ("max", "sum"):
        for window in (None, (1, n - 1, 2, n)):
            np.testing.assert_allclose(
                qk.pooled(0, 1, 1, window=window, max_cells=4, how=how).grid,
                dense.pooled(0, 1, 1, window=window, max_cells=4, how=how).grid, atol=1e-6)


def test_first_key_and_received_columns_are_stored_and_old_recordings_compute_them(
        both, tmp_path):
    """Each row's weight on the first key and each key's received attention are stored
    beside the log-sum-exps (a page's sink scores and strip without reading the queries
    and keys): the tiles' first column and column sums, and the dense pattern's. A
    recording made before they were stored has neither and computes the same from its
    queries and keys."""
    import shutil

    _, dense, qk = both
    assert qk.index.qk.first and qk.index.qk.received
    for prompt in range(len(TEXTS)):
        n = qk.length(prompt)
        for layer in range(qk.n_layers):
            want = dense.pattern(prompt, layer)
            tiles = np.stack([qk.tile(prompt, layer, h) for h in range(qk.n_heads)])
            first = qk.array(zarr_store.array_name("first", layer))[prompt, :, :n]
            np.testing.assert_allclose(first, want[..., 0], atol=1e-6)
            np.testing.assert_allclose(first, tiles[..., 0], atol=1e-6)
            received = qk.array(zarr_store.array_name("received", layer))[prompt, :, :n]
            np.testing.assert_allclose(received, want.sum(1), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(received, tiles.sum(1), rtol=1e-5, atol=1e-6)
            for head in range(qk.n_heads):
                np.testing.assert_array_equal(qk.received(prompt, layer, head),
                                              received[head])
    folder = tmp_path / "old"
    shutil.copytree(qk.root, folder)
    index = json.loads((folder / "index.json").read_text())
    group = folder / zarr_store.GROUP
    for kind in ("first", "received"):
        index["qk"].pop(kind)
        shutil.rmtree(group / kind)
        index["files"] = {name: entry for name, entry in index["files"].items()
                          if not name.startswith(f"{zarr_store.GROUP}/{kind}/")}
    (folder / "index.json").write_text(json.dumps(index))
    old = Recording.open(folder)
    assert not old.index.qk.first and not old.index.qk.received
    assert not {"first/L000", "received/L000"} & set(old.array_names())
    old.verify()  # every listed chunk there and whole
    for prompt in range(len(TEXTS)):
        for layer in range(qk.n_layers):
            np.testing.assert_allclose(old.first_key_mass(prompt, layer),
                                       qk.first_key_mass(prompt, layer), atol=1e-6)
            for head in range(qk.n_heads):
                np.testing.assert_allclose(old.received(prompt, layer, head),
                                           qk.received(prompt, layer, head),
                                           rtol=1e-5, atol=1e-6)


def test_a_dense_view_past_its_budget_is_one_line(both, monkeypatch):
    from workbench.recording import reader

    _, dense, qk = both
    n = qk.length(0)
    monkeypatch.setattr(reader, "DENSE_VIEW_BYTES", qk.n_heads * n * n * 4 - 1)
    for rec in (dense, qk):
        rec.pattern(0, 1, 0)                       # one head fits
        with pytest.raises(WorkbenchError, match=r"^a dense view of \d+ x \d+ x \d+ weights "
                                                 r"is .* GiB, over 0 GiB: read one head"):
            rec.pattern(0, 1)


def test_a_dense_view_of_some_keys_is_those_columns(both):
    _, dense, qk = both
    n = qk.length(0)
    for rec in (dense, qk):
        whole = rec.pattern(0, 1)
        # (a qk tile over fewer keys is a narrower product, which may round its last bit
        # apart from the whole row's)
        np.testing.assert_allclose(rec.pattern(0, 1, keys=(2, n - 1)), whole[..., 2:n - 1],
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(rec.pattern(0, 1, 3, queries=(1, 4), keys=(0, 5)),
                                   whole[3, 1:4, :5], rtol=1e-6, atol=1e-7)
        with pytest.raises(WorkbenchError, match=rf"^keys 0\.\.{n + 1} are not inside 0\.\.{n}$"):
            rec.pattern(0, 1, keys=(0, n + 1))
