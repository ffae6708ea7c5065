"""The circuit experiment's greater-than task and its comparison with stored head classes:
the metric by hand on a toy distribution, the year tokens, the refusals before a model
loads, and the class_overlap table against an independent hypergeometric tail."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests import tiny
from workbench.core.errors import WorkbenchError
from workbench.harness import experiment as harness
from workbench.harness.experiment import run_experiment
from workbench.inputs.greater_than import START_YEARS, greater_than_prompts, year_tokens
from workbench.interventions.circuits.task import ProbabilityDifference
from workbench.scores.stats import hypergeometric_tail
from workbench.store.runs import RunStore
from workbench.store.schema import head_classes

WORDS = ["<bos>", "<eos>", "<unk>", "<pad>", "The", "war", "siege", "lasted", "from", "the",
         "year", "to", "17"]


@pytest.fixture(scope="module")
def year_tokenizer(tmp_path_factory):
    """A word-level tokenizer that writes ``" 1732"`` as ``17`` ``32``, as GPT-2's does."""
    words = dict.fromkeys([*WORDS, *(f"{y:02d}" for y in range(100))])  # "17" is a year too
    vocab = {w: i for i, w in enumerate(words)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Sequence([  # type: ignore[assignment]
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"\d\d"), "isolated")])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>", pad_token="<pad>")
    folder = tmp_path_factory.mktemp("year-tokenizer")
    tok.save_pretrained(str(folder))
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def year_llama(year_tokenizer):
    return tiny.wrap(tiny.tiny_llama_hf(len(year_tokenizer)), year_tokenizer, "tiny-years")


def test_the_probability_difference_by_hand():
    # vocabulary of 8 tokens; the candidates (years 0..3) are tokens 5, 2, 7, 4, in order
    probs = torch.tensor([0.05, 0.05, 0.2, 0.05, 0.1, 0.3, 0.05, 0.2])
    logits = probs.log()[None, None].repeat(3, 2, 1)  # [batch 3, pos 2, vocab 8]
    metric = ProbabilityDifference(torch.tensor([5, 2, 7, 4]), torch.tensor([0, 1, 3]),
                                   torch.tensor([1, 0, 1]))
    got = metric(logits, slice(0, 3))
    # threshold 0: years 1..3 (0.2 + 0.2 + 0.1) above, year 0 (0.3) at or below
    # threshold 1: years 2, 3 (0.2 + 0.1) above, years 0, 1 (0.3 + 0.2) below
    # threshold 3: nothing above, every year (0.8) below
    assert got.tolist() == pytest.approx([0.5 - 0.3, 0.3 - 0.5, -0.8])
    # a slice of the rows reads those rows' thresholds and positions
    assert metric(logits[1:], slice(1, 3)).tolist() == pytest.approx([-0.2, -0.8])


def test_year_tokens_and_the_prompts(year_tokenizer, year_llama):
    years = year_tokens(year_tokenizer)
    assert year_tokenizer.convert_ids_to_tokens(list(years)) == [f"{y:02d}" for y in range(100)]
    prompts = greater_than_prompts(year_llama, 40, seed=3, nouns=["war", "siege"])
    assert prompts == greater_than_prompts(year_llama, 40, seed=3, nouns=["war", "siege"])
    for p in prompts:
        assert p.start in START_YEARS and p.noun in ("war", "siege")
        assert p.text == f"The {p.noun} lasted from the year 17{p.start:02d} to the year 17"
        tokens = year_llama.str_tokens(list(p.ids))
        assert tokens[-1] == "17" and p.position == len(p.ids) - 1
        differ = [i for i, (a, b) in enumerate(zip(p.ids, p.corrupted, strict=True)) if a != b]
        assert len(differ) == 1 and tokens[differ[0]] == f"{p.start:02d}"
        assert year_llama.str_tokens([p.corrupted[differ[0]]]) == ["01"]


def test_a_tokenizer_that_splits_the_years_is_refused_in_one_line(tokenizer):
    with pytest.raises(WorkbenchError) as err:
        year_tokens(tokenizer, "tiny")
    message = str(err.value)
    assert "\n" not in message and "one token after ' 17'" in message
    assert "tiny's tokenizer gives" in message and "' 1700' is [" in message


def test_greater_than_runs_on_a_tokenizer_with_year_tokens(year_llama, runs_dir):
    cfg = {"task": "greater-than", "nouns": "war,siege", "n_prompts": 4, "steps": 2,
           "n_exact": 3, "n_boot": 20, "fractions": [0.2, 1.0]}
    run = run_experiment("circuit", year_llama, cfg, runs_dir=runs_dir)
    scores = run.table("scores").set_index("name").value
    # the probability difference is within [-1, 1]; the full circuit is the clean model
    assert -1 <= scores["metric_clean"] <= 1 and -1 <= scores["metric_corrupted"] <= 1
    assert run.table("faithfulness").faithfulness.iloc[-1] == 1.0
    assert scores["metric_empty"] == pytest.approx(scores["metric_corrupted"], abs=1e-5)


def test_greater_than_is_refused_before_the_weights_load(llama_folder, runs_dir,
                                                         monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(harness, "load_model", no_load)
    with pytest.raises(WorkbenchError) as err:
        run_experiment("circuit", str(llama_folder), {"task": "greater-than"},
                       runs_dir=runs_dir)
    assert "one token after ' 17'" in str(err.value) and "\n" not in str(err.value)
    assert not RunStore(runs_dir).runs()


CLASSES = pd.DataFrame({  # L0H1, L1H0 previous-token at fdr 0.05; L1H3 tested, not in it
    "layer": [0, 1, 1, 0], "head": [1, 0, 3, 2],
    "head_class": ["previous-token"] * 3 + ["sink"], "metric": "previous_token",
    "score": 0.5, "q": [0.01, 0.04, 0.2, 0.001], "fdr": 0.05,
    "in_class": [True, True, False, True]}).assign(
        ci_low=0.0, ci_high=1.0, null_mean=0.1, chance=0.1, p=0.01, n_prompts=4, n_draws=99,
        inputs="text", null="shuffled")


def _class_run(store: RunStore, info) -> str:
    with store.start("previous-token-heads", info, {"n_prompts": 4},
                     tables={"head_classes": head_classes()}) as run:
        run.save_table("head_classes", CLASSES)
    return run.final.name


def test_class_overlap_against_the_hypergeometric_tail(llama, runs_dir):
    source = _class_run(RunStore(runs_dir), llama.info)
    cfg = {"task": "induction", "seq_len": 4, "n_prompts": 4, "steps": 1, "n_exact": 0,
           "n_boot": 20, "fractions": [0.3, 1.0], "level": 0.0, "classes_from": source}
    run = run_experiment("circuit", llama, cfg, runs_dir=runs_dir)
    table = run.table("class_overlap").set_index("head_class")
    assert sorted(table.index) == ["previous-token", "sink"]
    assert table.class_size.to_dict() == {"previous-token": 2, "sink": 1}
    classes = {"previous-token": {"L0H1", "L1H0"}, "sink": {"L0H2"}}
    (line,) = [s for s in run.meta.summary if s.startswith("smallest circuit")]
    circuit = set(line.split("heads: ")[1].split())
    for name, row in table.iterrows():
        both = circuit & classes[str(name)]
        assert row.circuit_heads == len(circuit) and row.overlap == len(both)
        assert set(row.heads.split()) == both
        assert row.expected == pytest.approx(len(circuit) * row.class_size / 8)
        k, n, big = row.overlap, len(circuit), row.class_size
        tail = sum(math.comb(big, i) * math.comb(8 - big, n - i)
                   for i in range(k, min(big, n) + 1)) / math.comb(8, n)
        assert row.p == pytest.approx(tail)
    assert any(s.startswith(("class overlap", "no overlap")) for s in run.meta.summary)


def test_hypergeometric_tail_sums_to_one():
    pmf = [hypergeometric_tail(20, 6, 5, k) - hypergeometric_tail(20, 6, 5, k + 1)
           for k in range(6)]
    assert sum(pmf) == pytest.approx(1.0)
    assert pmf[2] == pytest.approx(math.comb(6, 2) * math.comb(14, 3) / math.comb(20, 5))
    assert np.isclose(hypergeometric_tail(20, 6, 5, 0), 1.0)


def test_classes_from_refusals_before_the_model_loads(llama_folder, runs_dir, monkeypatch):
    store = RunStore(runs_dir)
    other = _class_run(store, tiny.fake_info("other", n_layers=3))
    with pytest.raises(RuntimeError), store.start("previous-token-heads",
                                                  tiny.fake_info(str(llama_folder)), {}):
        raise RuntimeError("stopped")
    failed = next(r.id for r in store.runs() if r.status != "complete")

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(harness, "load_model", no_load)
    for ref, said in (("no-such-run", "no-such-run"), (other, "not " + str(llama_folder)),
                      (failed, "not complete")):
        with pytest.raises(WorkbenchError) as err:
            run_experiment("circuit", str(llama_folder), {"classes_from": ref},
                           runs_dir=runs_dir)
        assert said in str(err.value) and "\n" not in str(err.value), str(err.value)
