"""Pattern reductions fed one block of query rows at a time equal the same reductions of
the whole pattern (the eager pattern captured at ``hook_pattern``, reduced at once)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.attention_sinks.scans import sink_reductions
from workbench.inputs.prompts import Prompt
from workbench.inputs.token_types import TokenTyper, model_token_types
from workbench.recording import hooks, reductions
from workbench.scores import metrics

PATTERN_METRICS = [m.name for _, m in metrics.METRICS.items() if m.kind == "pattern"]
PROMPTS = [Prompt(text="the cat sat on the mat the cat sat on the mat and the dog sat"),
           Prompt(text="bread is made from flour"), Prompt(text="the dog")]


def _whole(model, prompts, fns) -> pd.DataFrame:
    """Every reduction of every layer's whole pattern, batch by batch (the reference)."""
    n_layers = model.info.n_layers
    frames = []
    for batch in model.batches(prompts):
        names = [hooks.pattern(layer) for layer in range(n_layers)]
        with torch.inference_mode():
            kept = hooks.capture(model, batch, names)
        ctx = reductions.PatternContext(
            input_ids=batch.input_ids, lengths=torch.tensor(batch.lengths),
            query_mask=batch.attention_mask.bool(), layer=-1, causal=model.info.causal)
        out = {(layer, metric): fn(kept[names[layer]], ctx).float()
               for layer in range(n_layers) for metric, fn in fns.items()}
        frames.append(reductions._to_frame(out, batch.indices))
    return pd.concat(frames).sort_values(["prompt", "layer", "head", "metric"],
                                         ignore_index=True)


def _sinks(model):
    return sink_reductions(TokenTyper.for_model(model), model_token_types(model))


@pytest.mark.parametrize("name", ["llama", "bert"])
@pytest.mark.parametrize("attention", ["blocked", "dense"])
def test_block_by_block_scores_equal_the_whole_pattern_scores(request, name, attention):
    model = request.getfixturevalue(name)
    fns = {**metrics.reductions(*PATTERN_METRICS), **_sinks(model)}
    want = _whole(model, PROMPTS, fns)
    got = reductions.reduce_patterns(model, PROMPTS, fns, attention=attention, block=3)
    assert got[["prompt", "layer", "head", "metric"]].equals(
        want[["prompt", "layer", "head", "metric"]])
    ranks = want.metric.str.endswith(("_type", "_position"))  # categorical: exactly equal
    np.testing.assert_allclose(got.score[~ranks], want.score[~ranks], atol=1e-6,
                               equal_nan=True)
    assert (got.score[ranks] == want.score[ranks]).all()


def test_a_plain_function_of_the_whole_pattern_gets_it_whole(llama):
    seen = []

    def rows(pattern, ctx):
        seen.append(pattern.shape[-2])
        return pattern.float().sum((-1, -2))

    out = reductions.reduce_patterns(llama, PROMPTS[:1], {"rows": rows})
    n = llama.encode(PROMPTS[0])[0]
    assert set(seen) == {len(n)}  # one block of every row per layer
    np.testing.assert_allclose(out.score, len(n), rtol=1e-6)  # every row sums to 1


def test_null_scores_block_by_block_equal_the_whole_uniform_pattern(llama):
    fns = metrics.reductions(*PATTERN_METRICS)
    null = reductions.null_scores(llama, PROMPTS, fns)
    for i, prompt in enumerate(PROMPTS):
        n = len(llama.encode(prompt)[0])
        ctx = reductions.PatternContext(
            input_ids=torch.tensor([llama.encode(prompt)[0]]), lengths=torch.tensor([n]),
            query_mask=torch.ones(1, n, dtype=torch.bool), layer=-1, causal=True)
        whole = reductions.uniform_pattern(n, causal=True)
        for metric, fn in fns.items():
            got = null[(null.prompt == i) & (null.metric == metric)].score.item()
            np.testing.assert_allclose(got, float(fn(whole, ctx)[0, 0]), atol=1e-6,
                                       equal_nan=True)
