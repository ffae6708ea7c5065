"""QK attribution on a tiny random grouped-query Llama: the parts sum to the model's own
scores, a zeroed component contributes nothing, rotary is handled, and removing a
component from only a head's key or query input moves the score by exactly its part."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.induction_heads import Config
from experiments.induction_heads.measure import path_patch_table
from tests import tiny
from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.harness.experiment import run_experiment
from workbench.inputs.prompts import load_prompt_set
from workbench.interventions.ablation import ablated
from workbench.interventions.paths import path_removed
from workbench.recording import hooks
from workbench.scores import qk_attribution as qk

IDS = [0, *range(10, 22), *range(10, 22)]  # BOS, then 12 distinct tokens twice
HEADS = [(0, 1), (1, 0), (1, 3)]  # layer 1 heads 0 and 3 read kv groups 0 and 1


@pytest.fixture(scope="module")
def model(llama_hf, tokenizer):
    """The tiny Llama with random (not all-ones) norm weights, so the frozen scale and the
    norm weight both matter."""
    hf = copy.deepcopy(llama_hf)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    return tiny.wrap(hf, tokenizer, "tiny-llama-norms")


def _real(model, ids, layer, fwd=()):
    """The model's own scores and pattern at ``layer``, and its pre-rotary q and k."""
    names = [hooks.scores(layer), hooks.pattern(layer), hooks.qkv(layer, "q"),
             hooks.qkv(layer, "k")]
    kept, keep = hooks.caching_hooks(names)
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=[*fwd, *keep]):
        model.bridge(torch.tensor([ids]), return_type=None)
    return [kept[n][0].double() for n in names]


def test_pair_positions_by_hand():
    ids = [0, 7, 8, 9, 7, 8, 9]
    assert qk.pair_positions(ids, "induction") == [(4, 2), (5, 3), (6, 4)]
    assert qk.pair_positions(ids[:3], "previous") == [(1, 0), (2, 1)]
    assert qk.pair_positions(ids[:3], "first") == [(1, 0), (2, 0)]
    assert qk.pair_positions([0, 7, 7, 7], "induction") == [(2, 2)]  # once before only


def test_parts_sum_to_the_models_own_scores(model):
    pairs = qk.pair_positions(IDS, "induction")
    for att in qk.attribute_prompt(model, IDS, HEADS, pairs):
        scores, pattern, _, _ = _real(model, IDS, att.layer)
        q, k = torch.tensor(att.query_pos), torch.tensor(att.key_pos)
        want = scores[att.head][q, k].numpy()
        scale = np.abs(want).max()
        assert scale > 1e-4  # a real score, not zeros
        for got in (att.key.sum(0), att.query.sum(0), att.pair.sum((0, 1))):
            assert np.abs(got - want).max() <= 1e-4 * scale
        np.testing.assert_allclose(att.weight, pattern[att.head][q, k].numpy(), rtol=1e-6)
        assert att.kv_group == att.head // 2  # 4 query heads share 2 kv heads
        expected = 1 + (4 + 1) * att.layer  # embed, then 4 heads and an MLP per layer
        assert len(att.key_components) == len(att.query_components) == expected


def test_a_zeroed_head_contributes_exactly_zero(model):
    pairs = qk.pair_positions(IDS, "previous")
    with ablated(model, [(0, 2)], kind="zero"):
        [att] = qk.attribute_prompt(model, IDS, [(1, 1)], pairs)
        scores, *_ = _real(model, IDS, 1)
    c = att.key_components.index("L0H2")
    assert np.all(att.key[c] == 0) and np.all(att.query[att.query_components.index("L0H2")] == 0)
    assert np.abs(att.key[att.key_components.index("L0H1")]).max() > 0
    q, k = torch.tensor(att.query_pos), torch.tensor(att.key_pos)
    want = scores[1][q, k].numpy()
    assert np.abs(att.key.sum(0) - want).max() <= 1e-4 * np.abs(want).max()


def _rotary_off(model):
    return [(f"blocks.{layer}.attn.hook_{which}",
             (lambda t, hook: torch.ones_like(t)) if which == "cos" else
             (lambda t, hook: torch.zeros_like(t)))
            for layer in range(model.info.n_layers) for which in ("cos", "sin")]


def test_rotary_on_and_off(model, monkeypatch):
    pairs = qk.pair_positions(IDS, "previous")
    # rotary off: scores are q . k / sqrt(d_head) of the unrotated projections
    with model.bridge.hooks(fwd_hooks=_rotary_off(model)):
        [off] = qk.attribute_prompt(model, IDS, [(1, 2)], pairs)
        _, _, q, k = _real(model, IDS, 1, fwd=_rotary_off(model))
    qi, ki = torch.tensor(off.query_pos), torch.tensor(off.key_pos)
    by_hand = (q[qi, 2] * k[ki, 1]).sum(-1).numpy() / np.sqrt(model.info.d_head)
    assert np.abs(off.key.sum(0) - by_hand).max() <= 1e-4 * np.abs(by_hand).max()
    # rotary on: the split needs the rotation; without it the parts miss the score
    [on] = qk.attribute_prompt(model, IDS, [(1, 2)], pairs)
    assert on.error <= 1e-4
    monkeypatch.setattr(qk, "_rotate", lambda x, cos, sin: x)
    [unrotated] = qk.attribute_prompt(model, IDS, [(1, 2)], pairs)
    assert unrotated.error > 1e-2


@pytest.mark.parametrize("side", ["key", "query"])
def test_path_patch_moves_the_score_by_exactly_the_part(model, side):
    pairs = qk.pair_positions(IDS, "induction")
    [att] = qk.attribute_prompt(model, IDS, [(1, 3)], pairs)
    names = getattr(att, f"{side}_components")
    parts = getattr(att, side)
    q, k = torch.tensor(att.query_pos), torch.tensor(att.key_pos)
    for source in ("embed", "L0H1", "L0MLP"):
        with path_removed(model, [source], [(1, 3)], side[0]):
            scores, *_ = _real(model, IDS, 1)
        drop = att.score - scores[3][q, k].numpy()
        part = parts[names.index(source)]
        assert np.abs(drop - part).max() <= 1e-4 * np.abs(att.score).max()


def test_path_patch_reaches_only_the_chosen_input(model):
    ids = IDS[:10]
    clean_scores, clean_pattern, clean_q, clean_k = _real(model, ids, 1)
    with path_removed(model, ["L0H1"], [(1, 0)], "v"):  # the value path: pattern unchanged
        scores, pattern, q, k = _real(model, ids, 1)
    assert torch.equal(pattern, clean_pattern) and torch.equal(scores, clean_scores)
    with path_removed(model, ["L0H1"], [(1, 0)], "q"):  # head 0's query only
        _, _, q, k = _real(model, ids, 1)
    assert torch.equal(k, clean_k) and torch.equal(q[:, 1:], clean_q[:, 1:])
    assert not torch.equal(q[:, 0], clean_q[:, 0])
    with path_removed(model, ["L1H2"], [(1, 0)], "k"):  # a source at the target's layer
        scores, *_ = _real(model, ids, 1)
    assert torch.equal(scores, clean_scores)


def test_bad_inputs_are_refused(model, bert):
    with pytest.raises(WorkbenchError, match="unknown component"), \
            path_removed(model, ["L0X"], [(1, 0)], "k"):
        pass
    with pytest.raises(WorkbenchError, match="does not exist"):
        qk.attribute_prompt(model, IDS, [(5, 0)], [(2, 1)])
    with pytest.raises(WorkbenchError, match="outside"):
        qk.attribute_prompt(model, IDS, [(1, 0)], [(1, 2)])  # a key after its query
    qk.require_pre_norm(model)
    with pytest.raises(ModelCapabilityError, match="post-norm"):
        qk.require_pre_norm(bert)


def test_experiment_refuses_a_post_norm_model_before_a_run_exists(bert, runs_dir):
    with pytest.raises(ModelCapabilityError, match="post-norm"):
        run_experiment("qk-attribution", bert, ["n_prompts=2"], runs_dir=runs_dir)
    assert not runs_dir.exists() or not any(runs_dir.rglob("run.json"))


def test_experiment_tables_on_the_tiny_model(model, runs_dir):
    run = run_experiment("qk-attribution", model,
                         ["n_prompts=3", "seq_len=8", "n_heads=2", "n_previous=1",
                          "n_random=3", "n_boot=20", "patch_prompts=2", "n_patch=2"],
                         runs_dir=runs_dir)
    scores = run.table("scores")
    assert (scores.key_sum - scores.score).abs().max() <= 1e-4 * scores.score.abs().max()
    check = run.table("path_check")
    assert len(check) and check.sign_agrees.all()
    assert (check.max_abs_diff <= 1e-4 * scores.score.abs().max()).all()
    att = run.table("attribution")
    # the mean contributions of each head and side add up to the mean score
    per_head = scores.groupby(["layer", "head", "prompt"]).score.mean().groupby(
        ["layer", "head"]).mean()
    for (layer, head), want in per_head.items():
        for side in ("key", "query"):
            got = att[(att.layer == layer) & (att["head"] == head)
                      & (att.side == side)].contribution.sum()
            assert got == pytest.approx(want, rel=1e-4, abs=1e-9)
    matrix = run.table("pair_matrix")
    means = matrix[matrix.prompt == -1].groupby(["layer", "head"]).contribution.sum()
    for (layer, head), want in per_head.items():
        assert means[(layer, head)] == pytest.approx(want, rel=1e-4, abs=1e-9)
    # each prompt's values average to the stored aggregate
    by_prompt = run.table("attribution_by_prompt")
    keys = ["layer", "head", "side", "component"]
    assert by_prompt.groupby(keys).size().eq(3).all()
    both = att.merge(by_prompt.groupby(keys)[["contribution", "share"]].mean().reset_index(),
                     on=keys, suffixes=("", "_mean"), validate="one_to_one")
    assert len(both) == len(att)
    np.testing.assert_allclose(both.contribution_mean, both.contribution, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(both.share_mean, both.share, rtol=1e-6, atol=1e-9)


def test_compare_pairs_two_attribution_runs_prompt_by_prompt(model, runs_dir):
    from workbench.harness.compare import compare
    from workbench.interventions.masks import HeadMask

    config = ["n_prompts=3", "seq_len=8", "heads=L1H0,L1H2", "n_previous=1", "n_random=2",
              "n_boot=20", "n_patch=0"]
    clean = run_experiment("qk-attribution", model, config, runs_dir=runs_dir)
    masked = run_experiment("qk-attribution", model, config, runs_dir=runs_dir,
                            heads_mask=HeadMask.for_model(model).without([(0, 1)]))
    rows = compare(clean, masked, only="attribution_by_prompt").differences
    assert len(rows) and (rows.pairing == "same prompts").all()
    assert (rows.n_prompts == 3).all() and rows.p.notna().all()
    # layer 0's head 1 is gone from the masked run's components: its part is 0 there
    gone = rows[rows.key.str.contains("component=L0H1") & (rows.column == "contribution")]
    assert len(gone) and np.allclose(gone.b, 0, atol=1e-6)


def test_path_patch_table_is_the_same_with_the_blocks_below_replayed(model, monkeypatch):
    """The table replays the blocks below the tracked heads from the clean pass (their
    sources' outputs too); run again with every block running, it must not change."""
    from workbench.interventions import replay

    cfg = Config(n_prompts=3, seq_len=8, repeats=2, n_ablate=1, n_track=2, n_path_random=3,
                 max_batch_tokens=32)  # several batches: each pass meets its own reference
    prompts = load_prompt_set("repeated-random", model, n_prompts=3, seq_len=8, repeats=2)
    rows = [{"layer": layer, "head": head, "metric": metric, "score": score}
            for layer in range(2) for head in range(4)
            for metric, score in (("induction", layer + head / 10),
                                  ("previous_token", 1 - layer - head / 10))]
    fired = []
    ran = [(hooks.qkv(0, "q"), lambda q, hook: fired.append(1))]  # not a kept hook point
    with model.bridge.hooks(fwd_hooks=ran):
        replayed = path_patch_table(model, prompts, pd.DataFrame(rows), cfg)
    n_passes = len(fired)
    real = replay.replayed
    monkeypatch.setattr(replay, "replayed", lambda bridge, prefix, upto, **kw:
                        real(bridge, prefix, 0, **kw))
    fired.clear()
    with model.bridge.hooks(fwd_hooks=ran):
        every_block = path_patch_table(model, prompts, pd.DataFrame(rows), cfg)
    pd.testing.assert_frame_equal(replayed, every_block, atol=1e-6, rtol=1e-5)
    assert n_passes < len(fired) / 4  # block 0 ran in the clean passes only


def test_induction_heads_path_patch_on_the_tiny_model(model):
    cfg = Config(n_prompts=3, seq_len=8, repeats=2, n_ablate=1, n_track=2, n_path_random=3)
    prompts = load_prompt_set("repeated-random", model, n_prompts=3, seq_len=8, repeats=2)
    rows = [{"layer": layer, "head": head, "metric": metric, "score": score}
            for layer in range(2) for head in range(4)
            for metric, score in (("induction", layer + head / 10),
                                  ("previous_token", 1 - layer - head / 10))]
    table = path_patch_table(model, prompts, pd.DataFrame(rows), cfg)
    assert set(table.path) == {"none", "key", "query", "value"}
    assert (table.condition == "random").sum() == 3 * 3
    clean = table[table.condition == "clean"].iloc[0]
    prev = table[table.condition == "previous-token"].set_index("path")
    assert prev.loc["key"].heads == "L0H0" and clean.tracked == "L1H3 L1H2"
    # the value path cannot move a pattern; the key and query paths do
    value = table[table.path == "value"]
    assert (value.induction_tracked == clean.induction_tracked).all()
    assert prev.loc["key"].induction_tracked != clean.induction_tracked
    assert prev.loc["value"].second_repeat_loss != clean.second_repeat_loss
