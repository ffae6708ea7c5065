"""Ablation importance replays the blocks below a candidate head instead of running them
again (:func:`workbench.interventions.importance.ablation_importance`); on every family it
must give what removing each head by hand gives, and must actually skip those blocks."""

from __future__ import annotations

import pytest
import torch

from experiments.head_pruning import Config
from experiments.head_pruning.measure import make_objective
from tests.architectures.test_matrix import SMALL, SUPPORTED
from workbench.interventions.importance import ablation_importance
from workbench.interventions.masks import HeadMask, applied
from workbench.recording import hooks


@pytest.mark.parametrize("family", SUPPORTED)
def test_ablation_importance_equals_each_head_removed_by_hand(families, family):
    model = families.model(family)
    objective = make_objective(model, Config(**SMALL["head-pruning"]))
    start = HeadMask.for_model(model).without([(0, 1)])
    prompts = objective.ablation_fit  # the encoder's degradation is indexed by them
    batch = model.batches(prompts)[0]
    fired = []

    def count(z, hook):
        fired.append(1)

    per_pass = batch.input_ids.numel()  # one candidate a pass
    with model.bridge.hooks(fwd_hooks=[(hooks.z(0), count)]):
        diffs = ablation_importance(model, prompts, objective.row_degradation, start,
                                    max_batch_tokens=per_pass)
    # layer 0 ran for the current mask and its own 3 candidates, not for layer 1's 4
    assert len(fired) == 1 + 3
    with torch.inference_mode():
        with applied(model, start):
            current = objective.row_degradation(model, batch)
        for layer, head in [(0, 0), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]:
            with applied(model, start.without([(layer, head)])):
                removed = objective.row_degradation(model, batch)
            torch.testing.assert_close(diffs[batch.indices, layer, head], removed - current,
                                       atol=2e-5, rtol=1e-4)
    assert torch.isnan(diffs[:, 0, 1]).all()
