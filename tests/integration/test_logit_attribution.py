"""The logit lens, direct logit attribution and activation patching on the bundled causal
LMs: the lens's last boundary is the model's output ("The capital of France is" -> " Paris"
on smollm2), the direct effects sum to the logit difference (through gemma3's sandwich
norms too), and patching every position restores the clean run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from experiments.ioi.measure import pair_of
from workbench.inputs.batching import Batch
from workbench.inputs.ioi import ioi_prompts
from workbench.inputs.prompts import Prompt
from workbench.interventions.patching import EVERY, NOTHING, patch_grid
from workbench.scores.logit_attribution import Contrast, direct_effects, logit_lens


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_the_lens_is_the_output_and_the_parts_sum(request, name):
    model = request.getfixturevalue(name)
    ids, _ = model.encode(Prompt(text="The capital of France is"))
    batch = Batch.of(torch.tensor([ids]))
    last = torch.tensor([len(ids) - 1])
    with torch.no_grad():
        logits = model.logits(ids)[0, -1].double()
        paris = int(logits.argmax())
        lens = logit_lens(model, batch, torch.tensor([0]), last, torch.tensor([paris]))
        other = int(logits.argsort(descending=True)[1])
        effects = direct_effects(model, batch, Contrast(torch.tensor([paris]),
                                                        torch.tensor([other])), last)
    if name == "smollm2":
        assert model.str_tokens([paris]) == [" Paris"]
    assert lens.output_error <= 1e-5 and lens.top_token[-1, 0] == paris
    assert lens.answer_rank[-1, 0] == 0 and lens.answer_rank[0, 0] > 0  # it appears on the way
    want = float(logits[paris] - logits[other])
    assert effects.total[0] == pytest.approx(want, rel=1e-4, abs=1e-4)
    assert effects.error <= 1e-4


def test_patching_every_position_restores_smollm2s_clean_run(smollm2):
    prompts = [p for p in ioi_prompts(smollm2, 4, templates=[0], seed=0) if p.order == "ABBA"]
    pair = pair_of(prompts)
    with torch.no_grad():
        grid = patch_grid(smollm2, pair, "resid_pre", layers=[0, 12, 29], cells=[EVERY, NOTHING])
    np.testing.assert_allclose(grid.normalised()[:, 0], 1, atol=1e-4)
    np.testing.assert_allclose(grid.normalised()[:, 1], 0, atol=1e-4)
    assert abs(grid.clean.mean() - grid.corrupted.mean()) > 0.1  # a metric to normalise
