"""QK attribution on the bundled models: exact on smollm2 (rotary, grouped-query, RMSNorm
with its weights), the path patch agrees, and the post-norm minilm is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.core.errors import ModelCapabilityError
from workbench.harness.experiment import run_experiment
from workbench.inputs.prompts import load_prompt_set
from workbench.interventions.paths import path_removed
from workbench.recording import hooks
from workbench.scores import qk_attribution as qk

HEADS = [(4, 0), (17, 3), (17, 4)]  # a shallow head, and two of the same kv group deep


@pytest.fixture(scope="module")
def attributed(smollm2):
    [prompt] = load_prompt_set("repeated-random", smollm2, n_prompts=1, seq_len=20,
                               repeats=2, seed=3)
    ids = list(prompt.token_ids)
    pairs = qk.pair_positions(ids, "induction")
    return ids, qk.attribute_prompt(smollm2, ids, HEADS, pairs)


def _scores(model, ids, layer, head):
    batch, name = model.batches([qk.ids_prompt(ids)])[0], hooks.scores(layer)
    with torch.no_grad():
        return hooks.capture(model, batch, [name])[name][0, head].double()


def test_parts_sum_to_smollm2s_own_scores(smollm2, attributed):
    ids, atts = attributed
    for att in atts:
        real = _scores(smollm2, ids, att.layer, att.head)
        want = real[torch.tensor(att.query_pos), torch.tensor(att.key_pos)].numpy()
        scale = np.abs(want).max()
        assert scale > 0.1
        for got in (att.key.sum(0), att.query.sum(0), att.pair.sum((0, 1))):
            assert np.abs(got - want).max() <= 1e-4 * scale, (att.layer, att.head)
        assert att.kv_group == att.head // 3  # 9 query heads over 3 kv heads
        assert len(att.key_components) == 1 + 10 * att.layer


def test_path_patch_into_the_key_moves_smollm2s_score_by_the_part(smollm2, attributed):
    ids, atts = attributed
    att = atts[1]  # L17H3
    q, k = torch.tensor(att.query_pos), torch.tensor(att.key_pos)
    order = np.argsort(-np.abs(att.key.mean(1)))
    names = [att.key_components[i] for i in order if "bias" not in att.key_components[i]][:2]
    for name in names:
        with path_removed(smollm2, [name], [(att.layer, att.head)], "k"):
            patched = _scores(smollm2, ids, att.layer, att.head)[q, k].numpy()
        part = att.key[att.key_components.index(name)]
        assert np.abs((att.score - patched) - part).max() <= 1e-4 * np.abs(att.score).max()


def test_minilm_is_refused_before_a_run_exists(minilm, tmp_path):
    with pytest.raises(ModelCapabilityError, match="post-norm"):
        run_experiment("qk-attribution", minilm, ["n_prompts=2"], runs_dir=tmp_path)
    assert not any(tmp_path.rglob("run.json"))
