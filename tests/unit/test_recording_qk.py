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
from workbench.recording import zarr_store
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
