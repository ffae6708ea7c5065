"""A long document on the bundled models: a 2,048-token smollm2 prompt recorded as top-k
(from blocked attention) keeps the sink, previous-token and self-attention scores of the
model's dense eager patterns and
every row's mass; minilm's sparse and dense recordings agree on the exact channels. (The
8,192-token run is measured in benchmarks/long_context.py.)"""

from __future__ import annotations

import numpy as np
import torch

from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import load_prompt_set
from workbench.recording.reductions import PatternContext, reduce_patterns
from workbench.recording.writer import record
from workbench.scores import patterns

METRICS = {"first_token": patterns.first_token, "previous_token": patterns.previous_token,
           "self_attention": patterns.self_attention}


def test_smollm2_2048_tokens_topk_keeps_the_dense_scores(smollm2, tmp_path):
    prompt = token_chunks(smollm2, python_docs(), n_chunks=1, n_tokens=2048)[0]
    rec = record(smollm2, [prompt], tmp_path / "rec", include_resid=False)
    assert rec.patterns == "topk" and rec.topk == 16  # auto: topk above 1,024 tokens
    # the reference: the metrics applied to the model's own dense (eager) patterns; the
    # recording came from blocked attention
    dense = reduce_patterns(smollm2, [prompt], METRICS, max_batch_tokens=2048,
                            attention="dense")
    n = rec.length(0)
    ctx = PatternContext(input_ids=torch.tensor([list(prompt.token_ids)]),
                         lengths=torch.tensor([n]), query_mask=torch.ones(1, n, dtype=bool),
                         layer=0, causal=True)
    for layer in range(rec.n_layers):
        view = torch.from_numpy(rec.pattern(0, layer))[None]  # the dense view of the top-k
        for metric, fn in METRICS.items():
            want = dense[(dense.layer == layer) & (dense.metric == metric)].sort_values("head")
            np.testing.assert_allclose(fn(view, ctx)[0].numpy(), want["score"], atol=1e-5,
                                       err_msg=f"{metric} layer {layer}")
        rows = rec.pattern_sparse(0, layer)
        np.testing.assert_allclose(rows.weights.sum(-1) + rows.left_out, 1.0, atol=1e-5)


def test_minilm_sparse_and_dense_channels_agree(minilm, tmp_path):
    prompts = load_prompt_set("sentence-pairs", minilm)[:2]
    dense = record(minilm, prompts, tmp_path / "dense", patterns="dense", store_dtype="float32",
                   include_resid=False)
    topk = record(minilm, prompts, tmp_path / "topk", patterns="topk", include_resid=False)
    for i in range(len(prompts)):
        q = np.arange(dense.length(i))
        for layer in range(dense.n_layers):
            full, rows = dense.pattern(i, layer), topk.pattern_sparse(i, layer)
            np.testing.assert_allclose(rows.first, full[:, :, 0], atol=1e-6)
            np.testing.assert_allclose(rows.diagonal, full[:, q, q], atol=1e-6)
            np.testing.assert_allclose(rows.previous[:, 1:], full[:, q[1:], q[1:] - 1],
                                       atol=1e-6)
            np.testing.assert_allclose(rows.weights.sum(-1) + rows.left_out, 1.0, atol=1e-5)
