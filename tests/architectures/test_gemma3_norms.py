"""QK attribution and path patching through Gemma 3's extra norms, on a tiny random Gemma 3.

Gemma 3 normalizes each head's query and key (``q_norm``, ``k_norm``: RMSNorm over
``d_head``, between the projection and rotary) and the attention's output before the
residual add (``post_attention_layernorm``). Each is frozen at its scale on the input, like
the first norm, so the split stays exact. References: the model's own pre-softmax scores
(``hook_attn_scores``), and the controls that leave one norm out.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tests import tiny
from tests.architectures.families import build
from workbench.core.errors import WorkbenchError
from workbench.interventions.paths import path_removed
from workbench.recording import hooks
from workbench.scores import components
from workbench.scores import qk_attribution as qk

IDS = [0, *range(10, 22), *range(10, 22)]  # BOS, then 12 distinct tokens twice
TARGET = (1, 3)  # layer 1 reads layer 0's heads through its post-attention norm


@pytest.fixture(scope="module")
def gemma3(tokenizer):
    """The tiny Gemma 3 with random norm weights (Gemma multiplies by 1 + w: the weights
    start at 0), so every frozen scale and every weight matters."""
    hf = build("gemma-3", len(tokenizer))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
    return tiny.wrap(hf, tokenizer, "tiny-gemma3-norms")


def scores_at(model, layer: int) -> torch.Tensor:
    kept, keep = hooks.caching_hooks([hooks.scores(layer)])
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=keep):
        model.bridge(torch.tensor([IDS]), return_type=None)
    return kept[hooks.scores(layer)][0].double()


def test_gemma3_is_linearisable_and_its_parts_sum_to_its_scores(gemma3):
    qk.require_linearisable(gemma3)
    # layer 0 slides over 8 keys: its pairs stay inside the window; layer 1 is global
    for head, rule in (((0, 1), "previous"), (TARGET, "induction")):
        [att] = qk.attribute_prompt(gemma3, IDS, [head], qk.pair_positions(IDS, rule))
        want = att.score
        assert np.abs(want).max() > 1e-3
        for got in (att.key.sum(0), att.query.sum(0), att.pair.sum((0, 1))):
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_pairs_beyond_a_sliding_window_are_refused(gemma3):
    """The induction key of a 12-token repeat is 12 back: masked in the 8-key window."""
    with pytest.raises(WorkbenchError, match=r"beyond the 8-key sliding window of layer 0"):
        qk.attribute_prompt(gemma3, IDS, [(0, 1)], qk.pair_positions(IDS, "induction"))


@pytest.mark.parametrize("left_out", ["q/k norms", "post-attention norm"])
def test_leaving_a_norm_out_misses_the_scores(gemma3, monkeypatch, left_out):
    """The controls: each frozen norm is needed for the split to be exact."""
    if left_out == "q/k norms":
        monkeypatch.setattr(qk, "_frozen_head_norm", lambda *args: None)
    else:
        monkeypatch.setattr(components, "output_norm", lambda *args: None)
    [att] = qk.attribute_prompt(gemma3, IDS, [TARGET], qk.pair_positions(IDS, "induction"))
    assert att.error > 1e-2


@pytest.mark.parametrize("side", ["key", "query"])
def test_path_patch_moves_the_score_by_exactly_the_part(gemma3, side):
    [att] = qk.attribute_prompt(gemma3, IDS, [TARGET], qk.pair_positions(IDS, "induction"))
    names, parts = getattr(att, f"{side}_components"), getattr(att, side)
    q, k = torch.tensor(att.query_pos), torch.tensor(att.key_pos)
    for source in ("embed", "L0H1", "L0MLP"):
        with path_removed(gemma3, [source], [TARGET], side[0]):
            patched = scores_at(gemma3, TARGET[0])
        drop = att.score - patched[TARGET[1]][q, k].numpy()
        part = parts[names.index(source)]
        assert np.abs(part).max() > 1e-4, source  # the check can fail
        assert np.abs(drop - part).max() <= 1e-4 * np.abs(att.score).max(), source


def test_a_path_patch_over_replayed_blocks_equals_it_run_in_full(gemma3):
    """The blocks below the target replayed from one clean pass (as induction-heads and ioi
    run their path patches) must hand the patch what it reads there: the sources' outputs
    and the scale of their layer's post-attention norm (:func:`read_points`)."""
    from workbench.interventions import replay
    from workbench.interventions.paths import read_points

    ids = torch.tensor([IDS])
    with torch.no_grad():
        with path_removed(gemma3, ["L0H1"], [TARGET], "k"):
            full = scores_at(gemma3, TARGET[0])
        with replay.kept(gemma3.bridge, read_points(gemma3, [0])) as prefix:
            gemma3.bridge(ids, return_type=None)
        with replay.replayed(gemma3.bridge, prefix, TARGET[0]), \
                path_removed(gemma3, ["L0H1"], [TARGET], "k"):
            replayed = scores_at(gemma3, TARGET[0])
    assert prefix.depth() >= TARGET[0]
    assert torch.equal(replayed, full)
    assert (full - scores_at(gemma3, TARGET[0])).abs().max() > 1e-4  # the patch changed it


def test_a_path_patch_freezes_the_qk_norms_without_the_bridges_warning(gemma3):
    """Freezing a target's q/k norm scale edits its hook_scale, which the bridge warns of;
    the patch's own edit stays quiet, and an edit of anyone else's still warns."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with path_removed(gemma3, ["L0H1"], [TARGET], "k"):
            scores_at(gemma3, TARGET[0])
    assert not [w for w in caught if "hook_scale" in str(w.message)]
    edit = [(f"blocks.{TARGET[0]}.ln1.hook_scale", lambda t, hook: t * 2)]
    with pytest.warns(UserWarning, match="hook_scale"), gemma3.bridge.hooks(fwd_hooks=edit):
        scores_at(gemma3, TARGET[0])
