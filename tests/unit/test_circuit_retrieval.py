"""The circuit experiment's retrieval task on the tiny Llama: the planted pair where the
prompt says it is, clean and corrupted of one length, the metric's sign by hand, the
faithfulness endpoints, the refusals before a model loads, and the pair planted at a depth
(depth 0: the documents built by hand as they were before the depth existed)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from experiments.circuit.measure import retrieval_task
from tests import tiny
from workbench.core.errors import ConfigError, ModelCapabilityError, WorkbenchError
from workbench.harness import experiment as harness
from workbench.harness.experiment import run_experiment
from workbench.inputs.corpus import python_docs
from workbench.inputs.retrieval import BREAK, LEAD, LINK, retrieval_prompts
from workbench.interventions.circuits.ablate import circuit_metrics
from workbench.interventions.circuits.faithfulness import faithfulness
from workbench.interventions.circuits.graph import build_graph
from workbench.store.runs import RunStore

KEYS, VALUES = ["dog", "sat"], ["on", "and", "the"]
"""Of the tiny tokenizer's few words that are one token with a leading space."""
WORDS = {"keys": ",".join(KEYS), "values": ",".join(VALUES)}


def _ids(model, text: str) -> list[int]:
    return model.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_pair_is_planted_where_the_prompt_says(llama):
    prompts = retrieval_prompts(llama, 12, doc_tokens=80, seed=4, keys=KEYS, values=VALUES)
    assert prompts == retrieval_prompts(llama, 12, doc_tokens=80, seed=4, keys=KEYS,
                                        values=VALUES)
    assert prompts != retrieval_prompts(llama, 12, doc_tokens=80, seed=5, keys=KEYS,
                                        values=VALUES)
    lead, link = _ids(llama, LEAD), _ids(llama, LINK)
    for p in prompts:
        assert len(p.ids) == len(p.corrupted) == 80 and p.position == 79
        assert p.ids[0] == llama.info.bos_token_id
        assert p.key in KEYS and p.value in VALUES and p.corrupted_value in VALUES
        assert p.value != p.corrupted_value
        tokens = llama.str_tokens(list(p.ids))
        assert list(p.ids[1: 1 + len(lead)]) == lead
        assert tokens[p.key_position] == " " + p.key
        assert list(p.ids[p.key_position + 1: p.value_position]) == link
        assert tokens[p.value_position] == " " + p.value
        differ = [i for i, (a, b) in enumerate(zip(p.ids, p.corrupted, strict=True)) if a != b]
        assert differ == [p.value_position]
        assert llama.str_tokens([p.corrupted[p.value_position]]) == [" " + p.corrupted_value]
        question = [*lead, p.ids[p.key_position], *link]
        assert list(p.ids[-len(question):]) == question
        assert p.ids[-len(question) - 1] == _ids(llama, BREAK)[-1]


def test_the_metric_is_the_planted_value_over_the_other_by_hand(llama, llama_hf):
    task = retrieval_task(llama, 3, 64, 0, keys=KEYS, values=VALUES)
    prompts = retrieval_prompts(llama, 3, doc_tokens=64, seed=0, keys=KEYS, values=VALUES)
    logits = torch.zeros(3, 64, llama.info.d_vocab)
    for i, p in enumerate(prompts):
        logits[i, 63, p.value_id] = 2.0  # the planted value ahead: positive
        logits[i, 63, p.corrupted_id] = -1.0
        logits[i, 10, p.corrupted_id] = 50.0  # another position is not read
    assert task.metric(logits, slice(0, 3)).tolist() == [3.0, 3.0, 3.0]
    assert task.metric(-logits, slice(0, 3)).tolist() == [-3.0, -3.0, -3.0]
    with torch.no_grad():  # the plain Hugging Face model's logits, read by hand
        hf = llama_hf(task.clean).logits[:, -1]
        got = task.metric(llama.bridge(task.clean), slice(0, 3))
    want = [float(hf[i, p.value_id] - hf[i, p.corrupted_id]) for i, p in enumerate(prompts)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ablation", ["corrupted", "mean"])
def test_full_and_empty_circuits_have_faithfulness_one_and_zero(llama, ablation):
    task = retrieval_task(llama, 4, 48, 1, keys=KEYS, values=VALUES)
    graph = build_graph(llama)
    got = circuit_metrics(llama, graph, task, [graph.edges.clone(),
                                               torch.zeros_like(graph.edges)],
                          ablation=ablation, attention="blocked")
    with torch.no_grad():
        clean = task.metric(llama.bridge(task.clean), slice(None)).double().numpy()
        corrupted = task.metric(llama.bridge(task.corrupted), slice(None)).double().numpy()
    np.testing.assert_allclose(got[:, 0], clean, rtol=1e-5, atol=1e-6)
    if ablation == "corrupted":
        np.testing.assert_allclose(got[:, 1], corrupted, rtol=1e-4, atol=1e-5)
    f = faithfulness(got, got[:, 0], got[:, 1])
    assert f[0] == 1.0 and f[1] == 0.0


def test_retrieval_runs_through_the_experiment(llama, runs_dir):
    cfg = {**WORDS, "task": "retrieval", "doc_tokens": 48, "n_prompts": 4, "method": "eap",
           "attention": "blocked", "n_exact": 3, "n_boot": 20, "fractions": [0.1, 1.0]}
    run = run_experiment("circuit", llama, cfg, runs_dir=runs_dir)
    scores = run.table("scores").set_index("name").value
    assert run.table("faithfulness").faithfulness.iloc[-1] == 1.0
    assert scores["metric_empty"] == pytest.approx(scores["metric_corrupted"], abs=1e-4)


def _no_load(monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(harness, "load_model", no_load)


def test_a_document_beyond_the_context_is_refused_before_the_load(monkeypatch, runs_dir,
                                                                  llama):
    _no_load(monkeypatch)
    with pytest.raises(WorkbenchError) as err:  # a bundled model's context is in its entry
        run_experiment("circuit", "smollm2", {"task": "retrieval", "doc_tokens": 9000},
                       runs_dir=runs_dir)
    assert "beyond smollm2's context of 8192" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(WorkbenchError) as err:  # a loaded model's, in its info
        run_experiment("circuit", llama, {**WORDS, "task": "retrieval", "doc_tokens": 600},
                       runs_dir=runs_dir)
    assert f"context of {tiny.N_CTX}" in str(err.value) and "\n" not in str(err.value)
    assert not RunStore(runs_dir).runs()


def test_a_folder_model_is_refused_before_a_run_exists(llama_folder, runs_dir):
    # a folder's context is known once it loads: refused in plan, no failed run left
    for overrides, said in (({"doc_tokens": 600}, "context of 512"),
                            ({"doc_tokens": 32}, "cannot hold the planted line"),
                            ({"values": "dog"}, "at least 2 values")):
        with pytest.raises(WorkbenchError) as err:
            run_experiment("circuit", str(llama_folder),
                           {**WORDS, "task": "retrieval", **overrides}, runs_dir=runs_dir)
        assert said in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not RunStore(runs_dir).runs()


def test_an_encoder_is_refused_before_the_load(bert_hf, bert_tokenizer, tmp_path, runs_dir,
                                               monkeypatch):
    folder = tiny.save_folder(bert_hf, bert_tokenizer, tmp_path / "bert")
    _no_load(monkeypatch)
    for model in ("minilm", str(folder)):
        with pytest.raises(ModelCapabilityError) as err:
            run_experiment("circuit", model, {"task": "retrieval"}, runs_dir=runs_dir)
        assert "needs a causal model" in str(err.value) and "\n" not in str(err.value)
    assert not RunStore(runs_dir).runs()


def _today(model, n: int, doc_tokens: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """The documents as they were before ``depth`` (the pair right after BOS), built by
    hand from the draws the module documents: a key, two values, where the filler starts."""
    rng, docs = random.Random(seed), python_docs()
    keys = {w: _ids(model, " " + w)[0] for w in KEYS}
    values = {w: _ids(model, " " + w)[0] for w in VALUES}
    lead, link, stop, brk = (_ids(model, t) for t in (LEAD, LINK, ".", BREAK))
    n_filler = doc_tokens - (1 + 2 * (len(lead) + 1 + len(link)) + 1 + len(stop) + 2 * len(brk))
    out = []
    for _ in range(n):
        key = rng.choice(sorted(keys))
        value, other = rng.sample(sorted(values), 2)
        start = rng.randrange(len(docs))
        text = "".join(docs[(start + i) % len(docs)] + BREAK for i in range(40))
        filler = _ids(model, text)[:n_filler]
        line = [*lead, keys[key], *link]
        out.append(tuple([model.info.bos_token_id, *line, v, *stop, *brk, *filler, *brk, *line]
                         for v in (values[value], values[other])))
    return out


def test_depth_0_is_todays_documents_token_for_token(llama):
    for seed, doc_tokens in ((0, 80), (3, 200)):
        got = retrieval_prompts(llama, 5, doc_tokens=doc_tokens, seed=seed, keys=KEYS,
                                values=VALUES, depth=0.0)
        assert got == retrieval_prompts(llama, 5, doc_tokens=doc_tokens, seed=seed,
                                        keys=KEYS, values=VALUES)  # the default
        assert [(list(p.ids), list(p.corrupted)) for p in got] == _today(llama, 5, doc_tokens,
                                                                         seed)


def test_depth_plants_the_line_that_far_into_the_filler(llama):
    lead, link, stop, brk = (_ids(llama, t) for t in (LEAD, LINK, ".", BREAK))
    flat = retrieval_prompts(llama, 4, doc_tokens=400, seed=2, keys=KEYS, values=VALUES)
    deep = retrieval_prompts(llama, 4, doc_tokens=400, seed=2, keys=KEYS, values=VALUES,
                             depth=0.5)
    n_filler = 400 - (1 + 2 * (len(lead) + 1 + len(link)) + 1 + len(stop) + 2 * len(brk))
    before = round(0.5 * n_filler)
    for p, q in zip(flat, deep, strict=True):
        assert (q.key, q.value, q.corrupted_value) == (p.key, p.value, p.corrupted_value)
        assert len(q.ids) == len(q.corrupted) == 400 and q.position == 399
        # about midway through the document, after `before` filler tokens and a break
        assert q.key_position == 1 + before + len(brk) + len(lead)
        assert 0.45 < q.key_position / 400 < 0.55
        tokens = llama.str_tokens(list(q.ids))
        assert tokens[q.key_position] == " " + q.key and tokens[q.value_position] == " " + q.value
        assert q.value_position == q.key_position + 1 + len(link)
        differ = [i for i, (a, b) in enumerate(zip(q.ids, q.corrupted, strict=True)) if a != b]
        assert differ == [q.value_position]
        # the planted line sits inside the same filler, which gives up a break's tokens
        line_at = q.key_position - len(lead)
        assert list(q.ids[line_at - len(brk): line_at]) == brk
        planted = [*brk, *lead, q.ids[q.key_position], *link, q.ids[q.value_position], *stop,
                   *brk]
        assert list(q.ids[line_at - len(brk): q.value_position + 1 + len(stop) + len(brk)]
                    ) == planted
        filler = [*q.ids[1: line_at - len(brk)],
                  *q.ids[q.value_position + 1 + len(stop) + len(brk): -len(brk) - len(
                      lead) - 1 - len(link)]]
        flat_filler = p.ids[p.value_position + 1 + len(stop) + len(brk):
                            -len(brk) - len(lead) - 1 - len(link)]
        assert filler == list(flat_filler[: n_filler - len(brk)])
        question = [*lead, q.ids[q.key_position], *link]
        assert list(q.ids[-len(question):]) == question
    task = retrieval_task(llama, 4, 400, 2, keys=KEYS, values=VALUES, depth=0.5)
    assert task.clean.tolist() == [list(q.ids) for q in deep]
    assert task.corrupted.tolist() == [list(q.corrupted) for q in deep]


@pytest.mark.parametrize("depth", ["1", "1.5", "-0.1", "nan"])
def test_a_depth_outside_0_1_is_refused_before_the_load(monkeypatch, runs_dir, depth):
    _no_load(monkeypatch)
    with pytest.raises(ConfigError) as err:
        run_experiment("circuit", "smollm2", ["task=retrieval", f"depth={depth}"],
                       runs_dir=runs_dir)
    assert "depth" in str(err.value) and "\n" not in str(err.value)
    assert not runs_dir.exists() or not RunStore(runs_dir).runs()


@pytest.mark.parametrize("depth", [1.0, -0.5, float("nan")])
def test_the_library_refuses_a_depth_outside_0_1(llama, depth):
    with pytest.raises(WorkbenchError, match=r"^depth must be a fraction of the filler in "
                       r"\[0, 1\)"):
        retrieval_prompts(llama, 1, doc_tokens=80, keys=KEYS, values=VALUES, depth=depth)
