"""The workbench's head scores against plain Hugging Face attention, on the bundled models.

The reference side uses only ``transformers`` (eager attention, ``output_attentions=True``)
and the published definitions, written out here query by query: no TransformerLens and no
workbench scoring code (``hf_dir`` only finds the folder). It is the audit of issue 12,
kept as a test so that the scores cannot drift from what the papers define:

- previous_token: mean over queries ``i >= 1`` of ``A[i, i-1]``;
- duplicate_token: over queries whose token occurred before, the weight on those tokens;
- induction (Olsson et al. 2022): over the second repeat of ``[BOS] + seq * R``, the weight
  on the token after the query's first occurrence;
- alpha_1 (Gu et al. 2024): the mean weight on position 0 over all queries;
- Sink_1^eps: per sequence, the percentage of heads with alpha_1 > eps, then averaged.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from experiments.attention_sinks.summary import sink_rates
from workbench.inputs.prompts import Prompt, load_prompt_set
from workbench.models.cache import hf_dir
from workbench.models.load import load_model
from workbench.recording.reductions import reduce_patterns
from workbench.scores import patterns
from workbench.scores.heads import score_heads

pytestmark = pytest.mark.integration

TEXTS = [
    "The quick brown fox jumps over the lazy dog, and the dog does not mind at all.",
    "In 1905 Einstein published four papers; the third one introduced special relativity.",
    "def add(a, b):\n    return a + b  # the sum of the two numbers a and b",
    "Paris is the capital of France. Paris is also its largest city, and the city is old.",
]
SEQ_LEN, REPEATS, EPS = 16, 3, 0.3
ATOL = 1e-5


# ---- the reference: plain Hugging Face and the definitions -------------------------------

def hf_attentions(hf, ids: list[int]) -> np.ndarray:
    """``[layer, head, query, key]`` eager attention weights of one unpadded prompt."""
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([ids]), output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).double().numpy()


def reference_scores(att: np.ndarray, ids: list[int], seq_len: int | None = None
                     ) -> dict[str, np.ndarray]:
    """Each score as ``[layer, head]``, query by query. ``seq_len`` marks a repeated prompt
    ``[BOS or CLS] + seq * R (+ [SEP])``, on which Olsson's induction score is read off
    its second repeat: query ``q`` in ``1 + L .. 2L`` on key ``q - L + 1``."""
    n = len(ids)
    prev = np.mean([att[..., i, i - 1] for i in range(1, n)], axis=0)
    dup = []
    for i in range(n):
        earlier = [j for j in range(i) if ids[j] == ids[i]]
        if earlier:
            dup.append(sum(att[..., i, j] for j in earlier))
    out = {"previous_token": prev,
           "duplicate_token": np.mean(dup, axis=0) if dup else np.full(att.shape[:2], np.nan),
           "first_token": np.mean([att[..., t, 0] for t in range(n)], axis=0)}
    if seq_len is not None:
        second = range(1 + seq_len, 1 + 2 * seq_len)
        out["induction"] = np.mean([att[..., q, q - seq_len + 1] for q in second], axis=0)
    return out


def reference_table(hf, prompts: list[list[int]], seq_len: int | None = None
                    ) -> dict[str, np.ndarray]:
    """Scores averaged over the prompts on which each is defined, and per-prompt alpha_1."""
    per = [reference_scores(hf_attentions(hf, ids), ids, seq_len) for ids in prompts]
    out = {m: np.nanmean([p[m] for p in per], axis=0) for m in per[0]}
    out["alpha_per_prompt"] = np.stack([p["first_token"] for p in per])
    return out


# ---- the workbench side ------------------------------------------------------------------

METRICS = {"previous_token": patterns.previous_token,
           "duplicate_token": patterns.duplicate_token,
           "induction": patterns.induction, "first_token": patterns.first_token}


def workbench_scores(model, prompts: list[Prompt]) -> dict[str, np.ndarray]:
    table = score_heads(model, prompts, METRICS, inputs="reference", n_boot=10)
    shape = (model.info.n_layers, model.info.n_heads)
    return {m: g.sort_values(["layer", "head"]).score.to_numpy().reshape(shape)
            for m, g in table.groupby("metric")}


def workbench_per_prompt(model, prompts: list[Prompt]) -> pd.DataFrame:
    """Per-prompt scores, as every head-scoring experiment reduces them."""
    return reduce_patterns(model, prompts, METRICS)


def workbench_sink_rate(per_prompt: pd.DataFrame) -> float:
    """Sink_1^eps by the attention-sinks experiment's own code, from per-prompt alpha_1."""
    alpha = per_prompt[per_prompt.metric == "first_token"].assign(input="reference")
    cfg = SimpleNamespace(eps=EPS, n_boot=10, seed=0)
    return float(sink_rates(alpha, cfg).sink_rate.iloc[0])


# ---- the two bundled models --------------------------------------------------------------

@pytest.fixture(scope="module", params=["smollm2", "minilm"])
def bundled(request):
    name = request.param
    model = load_model(name)
    folder = hf_dir(name)
    tok = AutoTokenizer.from_pretrained(folder)
    loader = AutoModelForCausalLM if name == "smollm2" else AutoModel
    hf = loader.from_pretrained(folder, attn_implementation="eager",
                                torch_dtype=torch.float32).eval()
    return SimpleNamespace(name=name, model=model, tok=tok, hf=hf)


def framed(b, text: str) -> list[int]:
    """The ids the papers score: ``<|endoftext|>`` + text for smollm2, ``[CLS] text [SEP]``
    for minilm, by the tokenizer alone."""
    if b.name == "smollm2":
        bos = b.tok.convert_tokens_to_ids("<|endoftext|>")
        return [bos, *b.tok(text, add_special_tokens=False)["input_ids"]]
    return b.tok(text)["input_ids"]


def test_natural_text_scores_match_hugging_face(bundled):
    ids = [framed(bundled, t) for t in TEXTS]
    per_prompt = workbench_per_prompt(bundled.model, [Prompt(text=t) for t in TEXTS])
    shape = (bundled.model.info.n_layers, bundled.model.info.n_heads)
    alphas = []
    for k, prompt_ids in enumerate(ids):  # prompt by prompt, not only on average
        ref = reference_scores(hf_attentions(bundled.hf, prompt_ids), prompt_ids)
        ours = per_prompt[per_prompt.prompt == k]
        for metric in ("previous_token", "duplicate_token", "first_token"):
            got = ours[ours.metric == metric].sort_values(["layer", "head"]).score
            np.testing.assert_allclose(got.to_numpy().reshape(shape), ref[metric], atol=ATOL,
                                       err_msg=f"{metric}, prompt {k}")
        alphas.append(ref["first_token"])
    ref_rate = float(np.mean([(a > EPS).mean() * 100 for a in alphas]))
    assert workbench_sink_rate(per_prompt) == pytest.approx(ref_rate, abs=1e-9)


def test_repeated_random_scores_match_hugging_face(bundled):
    prompts = load_prompt_set("repeated-random", bundled.model, n_prompts=4, seq_len=SEQ_LEN,
                              repeats=REPEATS, seed=0)
    ids = [list(p.token_ids) for p in prompts]
    for seq_ids in ids:  # the prompts are what they claim to be: framed repeats
        body = seq_ids[1:] if bundled.name == "smollm2" else seq_ids[1:-1]
        assert seq_ids == framed(bundled, "")[:1] + body + framed(bundled, "")[1:]
        assert body == body[:SEQ_LEN] * REPEATS
        assert len(set(body[:SEQ_LEN])) == SEQ_LEN  # distinct, so the second repeat is Q1
    ref = reference_table(bundled.hf, ids, SEQ_LEN)
    ours = workbench_scores(bundled.model, prompts)
    for metric in ("induction", "previous_token", "duplicate_token", "first_token"):
        np.testing.assert_allclose(ours[metric], ref[metric], atol=ATOL, err_msg=metric)
    if bundled.name == "smollm2":  # a trained causal LM has a clear induction head
        assert np.nanmax(ref["induction"]) > 0.4
