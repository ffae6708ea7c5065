"""gemma3's head scores against plain Hugging Face eager attention, across its sliding window.

The reference is the one of ``test_against_huggingface.py`` (its ``hf_attentions`` and
``reference_scores``: ``transformers`` eager attention with ``output_attentions=True`` and
the published definitions written out query by query, no TransformerLens and no workbench
scoring code), run on Gemma 3 270M as the workbench caches it (the 4-bit Q4_K_M weights,
dequantized to float32). Scores:

- previous_token: mean over queries ``i >= 1`` of ``A[i, i-1]``;
- induction (Olsson et al. 2022): over the second repeat of ``[BOS] + seq * R``, the weight
  on the token after the query's first occurrence;
- first_token (Gu et al. 2024's alpha_1): the mean weight on position 0 over all queries.

Some prompts are longer than the 512-token window of gemma3's 15 sliding layers, so the
window decides what those layers can see: past position 511 a sliding layer's query no
longer reaches position 0 (first_token), and with a repeated sequence longer than the
window no sliding query reaches its induction target (the score is exactly 0 there). The
workbench side is read three ways: blocked attention with its own block size (one block
for these lengths), blocked with 256-row blocks (so later blocks start their keys past 0,
``PatternBlock.k0 > 0``), and the bridge's dense pattern.

The invariant test reads the workbench's pattern path itself
(:func:`workbench.recording.hooks.patterns_fed`): every block of every sliding layer puts
exactly zero weight on a key further back than the window, and its weights over the
window sum to 1; a global layer's do not stay inside the window (the check can fail).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.reference.test_against_huggingface import ATOL, TEXTS, hf_attentions, reference_scores
from workbench.inputs.corpus import python_docs
from workbench.inputs.prompts import Prompt, load_prompt_set
from workbench.models.cache import hf_dir
from workbench.models.load import load_model
from workbench.recording import hooks
from workbench.recording.reductions import reduce_patterns
from workbench.scores import patterns

pytestmark = pytest.mark.integration

WINDOW, GLOBAL = 512, (5, 11, 17)
LONG_TEXT = 700
"""Tokens of the long natural prompt (BOS included): 188 queries past the window."""
SHORT_REPEAT, LONG_REPEAT = (16, 3, 0), (560, 2, 3)
"""``(seq_len, repeats, seed)`` of the repeated-random prompts: a short one, and one whose
repeated sequence is longer than the window (1,121 tokens). Each seed draws a sequence
without a repeated token, so that its second repeat is exactly Olsson's queries."""
METRICS = {"previous_token": patterns.previous_token, "induction": patterns.induction,
           "first_token": patterns.first_token}
PATHS = {"blocked": {"attention": "blocked"}, "blocked-256": {"attention": "blocked",
                                                              "block": 256},
         "dense": {"attention": "dense"}}


@pytest.fixture(scope="module")
def g3():
    gemma3 = load_model("gemma3")
    folder = hf_dir("gemma3")
    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                              torch_dtype=torch.float32).eval()
    assert hf.config.sliding_window == WINDOW
    return SimpleNamespace(model=gemma3, tok=tok, hf=hf)


def framed(tok, text: str) -> list[int]:
    """``<bos>`` + text, by the tokenizer alone."""
    return [tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"]]


def long_text_ids(tok) -> list[int]:
    """The first :data:`LONG_TEXT` tokens of the Python docs' prose, after ``<bos>``."""
    text = "\n\n".join(python_docs("all")[:40])
    return framed(tok, text)[:LONG_TEXT]


def per_prompt_scores(model, prompts: list[Prompt], path: str) -> dict[int, dict]:
    """``{prompt: {metric: [layer, head]}}`` of the workbench's per-prompt reductions."""
    table = reduce_patterns(model, prompts, METRICS, **PATHS[path])
    shape = (model.info.n_layers, model.info.n_heads)
    out: dict[int, dict] = {}
    for (prompt, metric), g in table.groupby(["prompt", "metric"]):
        out.setdefault(int(prompt), {})[metric] = (
            g.sort_values(["layer", "head"]).score.to_numpy().reshape(shape))
    return out


def check_window(att: np.ndarray, n: int) -> None:
    """The reference itself honours the window: sliding layers put no weight further back
    than 512 keys, global ones do."""
    sliding = [i for i in range(att.shape[0]) if i not in GLOBAL]
    for q in (WINDOW, n - 1):
        assert np.abs(att[sliding, :, q, : q - WINDOW + 1]).max() == 0
        assert att[list(GLOBAL), :, q, : q - WINDOW + 1].sum(-1).min() > 0


@pytest.fixture(scope="module")
def natural(g3):
    ids = [framed(g3.tok, t) for t in TEXTS] + [long_text_ids(g3.tok)]
    prompts = [Prompt(text=t) for t in TEXTS] + [Prompt(token_ids=tuple(ids[-1]))]
    for prompt, prompt_ids in zip(prompts, ids, strict=True):  # the same ids on both sides
        assert g3.model.encode(prompt)[0] == prompt_ids
    assert len(ids[-1]) == LONG_TEXT > WINDOW
    refs = []
    for prompt_ids in ids:
        att = hf_attentions(g3.hf, prompt_ids)
        if len(prompt_ids) > WINDOW:
            check_window(att, len(prompt_ids))
        refs.append(reference_scores(att, prompt_ids))
    return SimpleNamespace(prompts=prompts, refs=refs)


@pytest.fixture(scope="module")
def repeated(g3):
    sets = []
    for seq_len, repeats, seed in (SHORT_REPEAT, LONG_REPEAT):
        prompts = load_prompt_set("repeated-random", g3.model, n_prompts=1, seq_len=seq_len,
                                  repeats=repeats, seed=seed)
        ids = list(prompts[0].token_ids)
        body = ids[1:]  # the prompt is what it claims to be: <bos> + distinct tokens, repeated
        assert ids[0] == g3.tok.bos_token_id and body == body[:seq_len] * repeats
        assert len(set(body[:seq_len])) == seq_len
        att = hf_attentions(g3.hf, ids)
        if len(ids) > WINDOW:
            check_window(att, len(ids))
        sets.append((prompts[0], reference_scores(att, ids, seq_len)))
    return SimpleNamespace(prompts=[p for p, _ in sets], refs=[r for _, r in sets])


@pytest.mark.parametrize("path", list(PATHS))
def test_natural_text_scores_match_hugging_face_eager(g3, natural, path):
    ours = per_prompt_scores(g3.model, natural.prompts, path)
    for k, ref in enumerate(natural.refs):  # prompt by prompt, the long one included
        for metric in ("previous_token", "first_token"):
            np.testing.assert_allclose(ours[k][metric], ref[metric], atol=ATOL,
                                       err_msg=f"{metric}, prompt {k}, {path}")
    long = natural.refs[-1]["first_token"]
    # past the window a sliding layer's query cannot see position 0: alpha_1 of every
    # sliding head is at most the share of queries that still reach it
    sliding = [i for i in range(18) if i not in GLOBAL]
    assert long[sliding].max() <= WINDOW / LONG_TEXT + ATOL


@pytest.mark.parametrize("path", list(PATHS))
def test_repeated_random_scores_match_hugging_face_eager(g3, repeated, path):
    ours = per_prompt_scores(g3.model, repeated.prompts, path)
    for k, ref in enumerate(repeated.refs):
        for metric in ("induction", "previous_token", "first_token"):
            np.testing.assert_allclose(ours[k][metric], ref[metric], atol=ATOL,
                                       err_msg=f"{metric}, prompt {k}, {path}")
    short, long = (r["induction"] for r in repeated.refs)
    sliding = [i for i in range(18) if i not in GLOBAL]
    assert np.nanmax(short) > 0.4  # a trained model has a clear induction head
    # a repeat longer than the window: no sliding query reaches its target, global ones do
    assert long[sliding].max() == 0 == ours[1]["induction"][sliding].max()
    assert long[list(GLOBAL)].max() > 0.1


def test_sliding_layers_put_exactly_zero_weight_beyond_the_window(g3, natural):
    """Through the workbench's pattern path, block by block (256 rows, so that later blocks
    start their keys past position 0): no sliding block holds weight on a key more than
    511 positions back, and each of its rows sums to 1 over the window."""
    ids = torch.tensor([natural.prompts[-1].token_ids])
    n = ids.shape[1]
    seen = {"sliding": 0, "cut": 0, "global_beyond": 0.0}

    def consume(block):
        w = block.weights[0].double()  # [head, rows, keys k0 ..]
        queries = torch.arange(block.q0, block.q1)[:, None]
        keys = torch.arange(block.k0, block.k1)[None, :]
        beyond = keys <= queries - WINDOW  # further back than the last 512 keys
        if g3.model.info.is_sliding(block.layer):
            if beyond.any():
                assert w[:, beyond].abs().max().item() == 0
            else:  # the block's keys start inside every row's window
                seen["cut"] += 1
            np.testing.assert_allclose(w.sum(-1).numpy(), 1.0, atol=1e-5)
            seen["sliding"] += 1
        else:
            seen["global_beyond"] = max(seen["global_beyond"], float(w[:, beyond].sum()))

    with torch.inference_mode(), hooks.patterns_fed(g3.model, consume, attention="blocked",
                                                    block=256):
        hooks.run_hooked(g3.model.bridge, g3.model.batches(natural.prompts[-1:])[0], [])
    assert seen["sliding"] == 15 * -(-n // 256)  # every block of every sliding layer
    assert 0 < seen["cut"] < seen["sliding"]  # both kinds of block were seen
    assert seen["global_beyond"] > 1  # global layers do reach past the window
