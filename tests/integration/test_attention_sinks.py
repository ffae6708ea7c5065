"""Attention sinks on the bundled models, against plain Hugging Face forward passes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoModelForCausalLM

from experiments.attention_sinks import Config, scans
from workbench.harness.experiment import run_experiment
from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import Prompt
from workbench.inputs.token_types import TokenTyper, model_token_types
from workbench.models import cache
from workbench.recording.reductions import reduce_patterns
from workbench.recording.residuals import scan_residuals, spread_by_boundary
from workbench.scores.losses import token_losses
from workbench.scores.streaming import Visibility, windowed_losses
from workbench.store.runs import RunStore

SMALL = {"n_prompts": 4, "seq_len": 32, "stream_tokens": 200, "window": 48, "n_sinks": 4,
         "sink_sweep": (1,), "chunk": 256, "recompute_stride": 38, "n_massive_prompts": 2,
         "n_boot": 100}


@pytest.fixture(scope="module")
def smollm2_hf():
    return AutoModelForCausalLM.from_pretrained(str(cache.hf_dir("smollm2")),
                                                attn_implementation="eager").eval()


def test_repeated_token_hidden_states_are_identical_on_smollm2(smollm2, smollm2_hf):
    """Gu et al. appendix C: with RoPE, one repeated token gives one hidden state."""
    gen = torch.Generator().manual_seed(0)
    tokens = [int(t) for t in torch.randint(1000, 40000, (3,), generator=gen)]
    prompts = [Prompt(token_ids=(t,) * 64) for t in tokens]
    table = scan_residuals(smollm2, prompts)
    check = spread_by_boundary(table)
    assert len(check) == smollm2.info.n_layers + 1
    assert (check.relative_deviation < 1e-4).all(), check.to_string()
    # the same property in Hugging Face's own forward pass (no workbench hooks)
    with torch.inference_mode():
        states = smollm2_hf(torch.tensor([[tokens[0]] * 64]),
                            output_hidden_states=True).hidden_states
    for h in states:
        h = h[0]
        assert float((h - h[0]).abs().max()) <= 1e-4 * float(h.abs().max())
    # with the BOS in front the positions differ: the check can fail
    with_bos = scan_residuals(smollm2, [Prompt(token_ids=(0, *(tokens[0],) * 63))])
    assert spread_by_boundary(with_bos).relative_deviation.max() > 1e-2


@pytest.mark.parametrize("name", ["smollm2", "minilm"])
def test_alpha_1_and_shares_match_huggingface_attentions(name, request):
    model = request.getfixturevalue(name)
    cfg = Config(n_prompts=3, seq_len=48)
    prompts = scans.make_inputs(model, "natural", cfg)
    types = model_token_types(model)
    metrics = scans.sink_reductions(TokenTyper.for_model(model), types)
    got = reduce_patterns(model, prompts, {k: metrics[k] for k in
                                           ("first_token", *[f"share_{t}" for t in types])})
    cls = AutoModelForCausalLM if model.info.causal else AutoModel
    hf = cls.from_pretrained(str(cache.hf_dir(name)), attn_implementation="eager").eval()
    for i, prompt in enumerate(prompts):
        ids, type_ids = model.encode(prompt)
        kwargs = {"token_type_ids": torch.tensor([type_ids])} if type_ids else {}
        with torch.inference_mode():
            attentions = hf(torch.tensor([ids]), output_attentions=True, **kwargs).attentions
        alpha = torch.stack([a[0, :, :, 0].mean(-1) for a in attentions])  # [layer, head]
        mine = got[(got.prompt == i) & (got.metric == "first_token")].sort_values(["layer", "head"])
        np.testing.assert_allclose(mine.score.to_numpy(), alpha.reshape(-1), atol=1e-5)
        shares = got[(got.prompt == i) & (got.metric != "first_token")]
        totals = shares.groupby(["layer", "head"]).score.sum()
        np.testing.assert_allclose(totals, 1.0, atol=1e-5)


def test_streaming_masks_match_one_masked_forward_on_smollm2(smollm2, smollm2_hf):
    ids = torch.tensor(token_chunks(smollm2, python_docs(), n_chunks=1, n_tokens=300)[0]
                       .token_ids)
    vis = Visibility(n_sinks=4, window=64)
    got = windowed_losses(smollm2, ids, vis, chunk=100)
    pos = torch.arange(len(ids))
    additive = torch.zeros(len(ids), len(ids)).masked_fill(~vis.mask(pos, pos),
                                                            torch.finfo(torch.float32).min)
    with torch.inference_mode():
        logits = smollm2_hf(ids[None], attention_mask=additive[None, None]).logits[0]
    reference = F.cross_entropy(logits[:-1], ids[1:], reduction="none")
    torch.testing.assert_close(got, reference, atol=1e-3, rtol=1e-4)
    dense = windowed_losses(smollm2, ids, Visibility(), chunk=100)
    plain = token_losses(smollm2, [Prompt(token_ids=tuple(ids.tolist()))])[0]
    torch.testing.assert_close(dense, plain, atol=1e-3, rtol=1e-4)


def test_small_run_on_smollm2_from_python(smollm2, runs_dir):
    run = run_experiment("attention-sinks", smollm2, SMALL, runs_dir=runs_dir)
    assert run.status == "complete"
    rates = run.table("sink_rates").set_index("input")
    assert ((rates.sink_rate >= 0) & (rates.sink_rate <= 100)).all()
    assert rates.loc["repeated_no_bos", "n_heads"] == 270
    assert run.table("repeated_token_check").relative_deviation.max() < 1e-4
    stream = run.table("streaming_perplexity").set_index("label")
    assert list(stream.index) == ["dense", "0+48", "1+47", "4+44", "recompute 48"]
    assert stream.loc["recompute 48", "n_matched"] == len(range(48, 199, 38))
    assert stream.ppl_matched.between(1, 1e4).all()
    # nothing skipped but the window-edge part, which needs sliding-window layers
    assert list(run.table("skipped").part) == ["window_edge"]
    scores = run.table("input_scores")
    no_bos = scores[scores.input == "natural_no_bos"].set_index(["layer", "head", "metric"])
    np.testing.assert_allclose(no_bos.xs("first_token", level="metric").score,
                               no_bos.xs("share_first_content", level="metric").score,
                               atol=1e-6)


def test_minilm_from_the_command_line(runs_dir):
    sets = [f"--set={k}={','.join(map(str, v)) if isinstance(v, tuple) else v}"
            for k, v in SMALL.items()]
    proc = subprocess.run([sys.executable, "-m", "workbench", "--quiet", "run",
                           "attention-sinks", "--model", "minilm", *sets],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    run = RunStore(runs_dir).get(proc.stdout.strip().splitlines()[-1])
    summary = "\n".join(run.meta.summary)
    assert "streaming perplexity: skipped" in summary and "no next-token perplexity" in summary
    assert "with/without BOS: skipped" in summary
    assert "streaming_perplexity" not in run.table_names()
    skipped = run.table("skipped").set_index("part").reason
    assert set(skipped.index) == {"bos", "streaming", "repeated", "window_edge"}
    assert "no next-token perplexity" in skipped["streaming"]
    scores = run.table("head_scores").set_index(["layer", "head", "metric"])
    np.testing.assert_allclose(scores.xs("first_token", level="metric").score,
                               scores.xs("share_cls", level="metric").score, atol=1e-6)
    assert scores.xs("share_sep", level="metric").score.between(0, 1).all()
