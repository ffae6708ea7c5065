"""Head finding on the bundled models: real previous-token and induction heads, causally."""

from __future__ import annotations

import numpy as np
import pytest
from transformer_lens.head_detector import detect_head

from workbench.core.errors import ModelCapabilityError
from workbench.harness.experiment import run_experiment
from workbench.inputs.prompts import Prompt
from workbench.recording.reductions import reduce_patterns
from workbench.scores import patterns
from workbench.store.runs import RunStore

SMALL_PREV = {"n_prompts": 8, "n_repeated": 8, "n_boot": 200}
SMALL_INDUCTION = {"n_prompts": 8, "n_natural": 4, "n_random": 1, "n_path_random": 2,
                   "icl_prompts": 4, "copying_tokens": 20, "n_boot": 200}


@pytest.mark.parametrize("name", ["smollm2", "minilm"])
def test_previous_token_heads(name, request, runs_dir):
    model = request.getfixturevalue(name)
    run = run_experiment("previous-token-heads", model, SMALL_PREV, runs_dir=runs_dir)
    table = run.table("head_scores")
    metrics = set(table.metric)
    expected = {"previous_token", "duplicate_token"} | ({"next_token"} if name == "minilm"
                                                        else set())
    assert metrics == expected
    assert len(table) == len(metrics) * model.info.n_layers * model.info.n_heads
    assert (table.ci_low <= table.score + 1e-9).all()
    assert (table.score <= table.ci_high + 1e-9).all()
    prev = table[table.metric == "previous_token"]
    # trained models have heads that attend to the previous token far above chance
    assert prev.score.max() > 0.5 and prev.score.max() > 10 * prev.null.iloc[0]
    assert (run.path / "example" / "index.json").is_file()


def test_induction_heads_refuses_the_encoder(minilm, runs_dir):
    with pytest.raises(ModelCapabilityError, match="minilm is bidirectional"):
        run_experiment("induction-heads", minilm, SMALL_INDUCTION, runs_dir=runs_dir)
    assert RunStore(runs_dir).runs() == []  # refused before any run was created


def test_induction_heads_on_smollm2(smollm2, runs_dir):
    run = run_experiment("induction-heads", smollm2, SMALL_INDUCTION, runs_dir=runs_dir)
    table = run.table("head_scores")
    assert set(table.metric) == {"induction", "induction_pooled", "copying", "previous_token"}
    induction = table[table.metric == "induction"]
    assert induction.score.max() > 0.4 > induction.null.iloc[0]
    pooled = table[table.metric == "induction_pooled"]
    assert pooled.score.max() > 0.4 > pooled.null.iloc[0]
    repeat = run.table("repeat_loss").set_index("repeat").loss
    assert repeat[2] < 0.5 * repeat[1]
    ablation = run.table("ablation")
    assert set(ablation.condition) == {"clean", "previous-token", "random"}
    # the tracked heads are the top three by Olsson's score, not by the pooled one
    top = induction.nlargest(3, "score")
    assert ablation.tracked.iloc[0] == " ".join(f"L{r.layer}H{r.head}" for r in top.itertuples())
    prev = ablation[ablation.condition == "previous-token"].set_index("kind")
    assert prev.induction_tracked["zero"] != prev.induction_tracked["mean"]
    icl = run.table("icl").iloc[0]
    assert icl.ci_low <= icl.value <= icl.ci_high
    copying = table[table.metric == "copying"]
    assert copying.score.max() > 3  # some head copies the token it reads, far above 0


def test_scores_agree_with_transformer_lens_on_smollm2(smollm2):
    text = ("The cat sat on the mat. The dog sat on the rug. "
            "The cat sat on the mat. The dog sat on the rug.")
    ids = smollm2.bridge.to_tokens(text)[0]
    n = len(ids)
    ours = reduce_patterns(smollm2, [Prompt(token_ids=tuple(ids.tolist()))],
                           {"previous_token": patterns.previous_token,
                            "stripe": patterns.induction_stripe_sum})
    ours = ours.pivot_table(index=["layer", "head"], columns="metric", values="score")
    for name, metric, factor in (("previous_token_head", "previous_token", (n - 1) / n),
                                 ("induction_head", "stripe", 1.0)):
        tl = detect_head(smollm2.bridge, text, name, error_measure="mul").numpy()
        np.testing.assert_allclose(ours[metric].to_numpy().reshape(tl.shape) * factor, tl,
                                   atol=1e-5)
