"""Interventions as part of a run's identity (the short form everywhere a run is named, the
summary lines that name a head the run ablated) and ``--ablate`` on the command line:
every form resolved to the head mask a hand-written ``--heads-mask`` file holds, and every
refusal one line, before any model loads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests import tiny
from workbench.core.errors import WorkbenchError
from workbench.harness.ablate import (
    Control,
    InClass,
    Listed,
    Top,
    model_heads,
    parse_ablate,
)
from workbench.interventions.masks import HeadMask
from workbench.store.records import (
    HeadMaskFile,
    Interventions,
    interventions_text,
    marked_summary,
)
from workbench.store.runs import RunStore

TEXT = ["--text", "the cat sat on the mat and the dog sat on the rug"]
OVERVIEW = ["run", "head-overview", "--set", "n_boot=20"]


def _mask(rows, ablation="zero") -> Interventions:
    return Interventions(heads_mask=HeadMaskFile(
        format="workbench-heads-mask", n_layers=len(rows), n_heads=len(rows[0]),
        ablation=ablation, mask=tuple(tuple(row) for row in rows)))


# ---- the short form ------------------------------------------------------------------

def test_the_short_form_names_the_heads_and_the_ablation():
    assert interventions_text(None) == ""
    assert interventions_text(Interventions()) == ""
    one = _mask([[1, 1, 0], [1, 1, 1]])
    assert interventions_text(one) == "1 head zero-ablated (L0H2)"
    nine = _mask([[0, 0, 0], [0, 0, 0], [0, 0, 0]], "mean")
    assert interventions_text(nine) == "9 heads mean-ablated (L0H0, L0H1, L0H2, ...)"
    mixed = _mask([[0.5, 1, 0], [1, 0.25, 1]])
    assert interventions_text(mixed) == "1 head zero-ablated (L0H2); 2 heads scaled (L0H0, L1H1)"
    assert interventions_text(_mask([[1, 1], [1, 1]])) == "head mask of all ones"


def test_the_short_form_names_a_resamples_seed_where_it_is_not_0():
    rows = ((1.0, 0.0), (0.5, 1.0))
    for seed, said in ((0, "1 head resample-ablated (L0H1)"),
                       (3, "1 head resample-ablated, seed 3 (L0H1)")):
        mask = HeadMaskFile(format="workbench-heads-mask", n_layers=2, n_heads=2,
                            ablation="resample", seed=seed, mask=rows)
        assert interventions_text(Interventions(heads_mask=mask)) == f"{said}; 1 head scaled (L1H0)"


def test_a_summary_line_says_which_heads_the_run_ablated():
    mask = _mask([[1, 1, 1, 1], [1, 1, 0, 1], [0.5, 1, 1, 1]])
    lines = ["top induction heads: L1H2 0.94 [0.91, 0.96], L0H0 0.50 [0.4, 0.6]",
             "heads: L1H2 (0.94), L2H0 (0.3)", "L1H2: rank 1; L1H22 is another head",
             "no head here"]
    assert marked_summary(lines, mask) == [
        "top induction heads: L1H2 0.94 [0.91, 0.96] (ablated in this run), L0H0 0.50 [0.4, 0.6]",
        "heads: L1H2 (0.94) (ablated in this run), L2H0 (0.3) (scaled in this run)",
        "L1H2 (ablated in this run): rank 1; L1H22 is another head",
        "no head here"]
    assert marked_summary(lines, None) == lines


# ---- parsing -------------------------------------------------------------------------

def test_ablate_forms_parse():
    assert parse_ablate("L17H3,L18H6") == Listed(((17, 3), (18, 6)))
    assert parse_ablate("l0h1, L0H1 ,L1H0") == Listed(((0, 1), (1, 0)))  # repeats once
    assert parse_ablate("top:induction:9") == Top("induction", 9)
    assert parse_ablate("control:induction:9") == Control("induction", 9)
    assert parse_ablate("class:previous-token") == InClass("previous-token")


@pytest.mark.parametrize("text, said", [
    ("L1H", "'L1H' is not a head"), ("L1H2,,L0H0", "'' is not a head"),
    ("heads", "'heads' is not a head"), ("top:induction", "expected top:METRIC:N"),
    ("top:induction:0", "expected top:METRIC:N"), ("top::3", "expected top:METRIC:N"),
    ("control:induction", "expected control:METRIC:N"),
    ("class:", "expected class:NAME")])
def test_ablate_text_of_no_form_is_refused(text, said):
    with pytest.raises(WorkbenchError, match=said):
        parse_ablate(text)


def test_model_heads_are_known_before_the_model_loads(llama_folder):
    assert model_heads("smollm2") == (30, 9)
    assert model_heads("minilm") == (6, 12)
    assert model_heads(str(llama_folder)) == (2, 4)


def test_a_cached_hub_models_heads_come_from_its_config(monkeypatch, llama_folder):
    from workbench.models import reference

    # a hub id in the local cache reads its config.json as a folder's is read
    monkeypatch.setattr(reference, "parse_model",
                        lambda text: reference.Hub(str(llama_folder), cached=True))
    assert model_heads("org/tiny-llama") == (2, 4)
    monkeypatch.setattr(reference, "parse_model",
                        lambda text: reference.Hub("org/tiny-llama", cached=False))
    assert model_heads("org/tiny-llama") is None  # known once it loads


# ---- the command line ----------------------------------------------------------------

@pytest.fixture
def no_load(monkeypatch):
    """Any model load fails the test: a refusal must come before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("workbench.harness.experiment.load_model", refuse)
    monkeypatch.setattr("workbench.models.load.load_model", refuse)


def _stored_mask(out: list[str]) -> HeadMaskFile:
    from workbench.core import paths

    run = RunStore(paths.runs_dir()).get(out[-1])
    assert run.meta.interventions is not None and run.meta.interventions.heads_mask
    return run.meta.interventions.heads_mask


def test_ablate_heads_stores_the_mask_a_heads_mask_file_holds(capsys, runs_dir, llama_folder,
                                                              tmp_path):
    path = HeadMask.ones(2, 4, ablation="mean").without([(0, 1), (1, 3)]).save(
        tmp_path / "mask.json")
    model = ["--model", str(llama_folder)]
    status, by_file, _ = tiny.cli(capsys, *OVERVIEW, *model, "--heads-mask", str(path))
    assert status == 0
    status, by_ablate, _ = tiny.cli(capsys, *OVERVIEW, *model, "--ablate", "L1H3,L0H1",
                                    "--ablation", "mean")
    assert status == 0
    stored, wanted = _stored_mask(by_ablate), _stored_mask(by_file)
    assert stored == wanted
    assert stored.mask == ((1, 0, 1, 1), (1, 1, 1, 0)) and stored.ablation == "mean"
    # the two runs measured the same thing
    first = RunStore(runs_dir).get(by_file[-1]).table("head_scores")
    second = RunStore(runs_dir).get(by_ablate[-1]).table("head_scores")
    pd.testing.assert_frame_equal(first, second)

    status, out, _ = tiny.cli(capsys, "record", str(llama_folder), *TEXT, "--ablate", "L0H2")
    assert status == 0 and _stored_mask(out).mask == ((1, 1, 0, 1), (1, 1, 1, 1))
    assert _stored_mask(out).ablation == "zero"  # the default


def _stand_in_run(store: RunStore, tables: dict[str, pd.DataFrame], name: str = "tiny",
                  **model) -> str:
    """A run of ``record`` holding ``tables``, as the head-scoring experiments declare them."""
    from workbench.store.schema import head_classes, head_scores

    declared = {"head_scores": head_scores("scores"), "head_classes": head_classes()}
    with store.start("record", tiny.fake_info(name, **model), {"source": "text"},
                     tables={k: declared[k] for k in tables}) as run:
        for table_name, frame in tables.items():
            run.save_table(table_name, frame)
    return run.final.name


SCORES = pd.DataFrame({  # 2 layers x 4 heads of one metric, and another metric
    "layer": [0, 0, 0, 0, 1, 1, 1, 1] * 2, "head": [0, 1, 2, 3] * 4,
    "metric": ["induction"] * 8 + ["entropy"] * 8,
    "score": [0.1, 0.9, 0.3, 0.3, 0.8, 0.2, np.nan, 0.05] + [1.0] * 8,
    "inputs": "repeated"}).assign(layer_type="global", ci_low=0.0, ci_high=1.0, n_prompts=4,
                                  null=0.1)
CLASSES = pd.DataFrame({
    "layer": [0, 0, 1, 1, 0, 1], "head": [1, 3, 0, 2, 0, 3],
    "head_class": ["induction"] * 4 + ["sink"] * 2, "metric": "induction",
    "score": [0.9, 0.3, 0.8, 0.1, 0.5, 0.5], "q": [0.01, 0.2, 0.04, np.nan, 0.5, 0.6],
    "fdr": 0.05, "in_class": [True, False, True, False, False, False]}).assign(
        ci_low=0.0, ci_high=1.0, null_mean=0.1, chance=0.1, p=0.01, n_prompts=4, n_draws=99,
        inputs="repeated", null="shuffled")


def test_ablate_top_and_class_read_a_stored_run(capsys, runs_dir, llama_folder):
    store = RunStore(runs_dir)
    source = _stand_in_run(store, {"head_scores": SCORES, "head_classes": CLASSES})
    record = ["record", str(llama_folder), *TEXT]
    # induction by score: L0H1 0.9, L1H0 0.8, then L0H2 and L0H3 tie at 0.3 (lower head first)
    status, out, _ = tiny.cli(capsys, *record, "--ablate", "top:induction:3", "--from", source)
    assert status == 0
    stored = _stored_mask(out)
    assert stored.mask == ((1, 0, 0, 1), (0, 1, 1, 1))
    assert stored.note == f"top:induction:3 of run {source}"
    # the induction class at its FDR 0.05: L0H1 (q 0.01) and L1H0 (q 0.04)
    status, out, _ = tiny.cli(capsys, *record, "--ablate", "class:induction", "--from",
                              source[:-2], "--ablation", "mean")
    assert status == 0
    stored = _stored_mask(out)
    assert stored.mask == ((1, 0, 1, 1), (0, 1, 1, 1)) and stored.ablation == "mean"
    # the control of top:induction:3 (L0H1, L0H2 and L1H0): two other heads of layer 0 and
    # one of layer 1, the lowest-scoring: L0H0 (0.1) and L0H3 (0.3); L1H3 (0.05), not L1H1
    # (0.2), and never the unscored L1H2
    status, out, _ = tiny.cli(capsys, *record, "--ablate", "control:induction:3", "--from",
                              source)
    assert status == 0
    stored = _stored_mask(out)
    assert stored.mask == ((0, 1, 1, 0), (1, 1, 1, 0))
    assert stored.note == f"control:induction:3 of run {source}"


def test_ablate_refusals_are_one_line_before_any_model_loads(capsys, runs_dir, llama_folder,
                                                             tmp_path, no_load):
    store = RunStore(runs_dir)
    source = _stand_in_run(store, {"head_scores": SCORES, "head_classes": CLASSES})
    other = _stand_in_run(store, {"head_scores": SCORES}, n_layers=3)
    bare = _stand_in_run(store, {})
    HeadMask.ones(2, 4).save(tmp_path / "m.json")
    HeadMask.ones(3, 4).save(tmp_path / "wrong.json")
    record = ["record", str(llama_folder), *TEXT]
    run = [*OVERVIEW, "--model", str(llama_folder)]
    cases = [
        (["--ablate", "L2H0"], "L2H0: " + str(llama_folder) + " has layers 0..1 and heads 0..3"),
        (["--ablate", "L0H4"], "has layers 0..1 and heads 0..3"),
        (["--ablate", "L0H1", "--ablation", "shuffle"],
         "expected one of zero, mean, resample, got 'shuffle'"),
        (["--ablate", "L0H1", "--heads-mask", str(tmp_path / "m.json")],
         "not allowed with argument"),
        (["--heads-mask", str(tmp_path / "wrong.json")],  # a file is checked as early
         f"head mask is 3 layers x 4 heads; {llama_folder} has 2 x 4 query heads"),
        (["--ablation", "mean"], "--ablation goes with --ablate HEADS"),
        (["--from", source], "--from goes with --ablate HEADS"),
        (["--ablate", "L0H1", "--from", source], "--from RUN goes with --ablate top:"),
        (["--ablate", "top:induction:2"], "read a stored run: give --from RUN"),
        (["--ablate", "top:inductoin:2", "--from", source],
         "has no metric 'inductoin' (did you mean 'induction'?); its metrics: induction, "
         "entropy"),
        (["--ablate", "class:copying", "--from", source],
         "has no head class 'copying'; its head classes: induction, sink"),
        (["--ablate", "class:sink", "--from", source], "has no head in sink at its FDR 0.05"),
        (["--ablate", "top:induction:9", "--from", source],
         "has induction scores for only 7 heads"),
        (["--ablate", "control:induction:5", "--from", source],
         "layer 0 holds 3 of the top 5 induction heads of run " + source + " and only 1 "
         "other scored head: no control of as many heads"),
        (["--ablate", "control:induction:2"], "read a stored run: give --from RUN"),
        (["--ablate", "top:induction:2", "--from", "20990101-000000-nothing-0000"],
         "no run '20990101-000000-nothing-0000'"),
        (["--ablate", "top:induction:2", "--from", other], "ran on tiny (3 x 4 heads), not"),
        (["--ablate", "class:induction", "--from", bare], "has no head_classes table"),
        (["--ablation-seed", "3"], "--ablation-seed goes with --ablate HEADS"),
        (["--ablate", "L0H1", "--ablation-seed", "3"], "--ablation-seed goes with --ablation "
         "resample (the seed of its donor draw); --ablation zero draws nothing"),
        (["--ablate", "L0H1", "--ablation", "mean", "--ablation-seed", "0"],
         "--ablation mean draws nothing"),
        (["--ablate", "L0H1", "--ablation", "resample", "--ablation-seed", "-1"],
         "--ablation-seed: expected a whole number in 0 .. 9223372036854775807, got '-1'"),
    ]
    for extra, said in cases:
        for args in (record, run):
            status, _, err = tiny.cli(capsys, *args, *extra)
            assert status == 2, (extra, err)
            assert said in err and err.count("\n") == 1, (extra, err)
    # head-pruning's importance batches copies of one prompt: no donor to resample from
    pruning = ["run", "head-pruning", "--model", str(llama_folder)]
    for extra, said in ((["--set", "ablation=resample"],
                         "ablation: expected one of 'zero' | 'mean', got 'resample'"),
                        (["--ablate", "L0H1", "--ablation", "resample"],
                         "head-pruning' takes a head mask of zero or mean ablation, not "
                         "resample")):
        status, _, err = tiny.cli(capsys, *pruning, *extra)
        assert status == 2 and said in err and err.count("\n") == 1, (extra, err)
    # qk-attribution runs each prompt in a forward pass of its own
    status, _, err = tiny.cli(capsys, "run", "qk-attribution", "--model", str(llama_folder),
                              "--ablate", "L0H1", "--ablation", "resample")
    assert status == 2 and err.count("\n") == 1, err
    assert "qk-attribution' takes a head mask of zero or mean ablation, not resample" in err
    # induction-heads scores natural lines of many lengths and records one prompt;
    # permutation-equivariance runs each case alone
    for name in ("induction-heads", "permutation-equivariance"):
        status, _, err = tiny.cli(capsys, "run", name, "--model", str(llama_folder),
                                  "--ablate", "L0H1", "--ablation", "resample")
        assert status == 2 and err.count("\n") == 1, err
        assert f"{name}' takes a head mask of zero or mean ablation, not resample" in err
    assert len(store.runs()) == 3  # no run was created
    status, _, err = tiny.cli(capsys, "run", "head-overview", "--ablate", "L0H1")
    assert status == 2 and "--ablate needs --model" in err


# ---- where a run is named ------------------------------------------------------------

def test_runs_show_and_the_run_label_show_the_interventions(capsys, runs_dir, llama_folder):
    from dashboards.components.controls import run_label
    from workbench.views.cards import run_html

    model = ["--model", str(llama_folder)]
    status, plain, _ = tiny.cli(capsys, *OVERVIEW, *model)
    status, masked, _ = tiny.cli(capsys, *OVERVIEW, *model, "--ablate", "L0H1,L1H3",
                                 "--ablation", "mean")
    assert status == 0
    short = "2 heads mean-ablated (L0H1, L1H3)"
    status, out, _ = tiny.cli(capsys, "runs")
    assert status == 0
    masked_id, plain_id = masked[-1].split("/")[-1], plain[-1].split("/")[-1]
    row = next(line for line in out if line.startswith(masked_id))
    assert short in row and "n_boot=20" in row
    assert short not in next(line for line in out if line.startswith(plain_id))
    status, out, _ = tiny.cli(capsys, "show", masked_id)
    assert f"intervened {short}" in out
    status, out, _ = tiny.cli(capsys, "show", plain_id)
    assert not any(line.startswith("intervened") for line in out)
    store = RunStore(runs_dir)
    for run in store.runs():  # from the listing index as from run.json
        assert (short in run_label(run)) == (run.id == masked_id)
    assert short in run_html(store.get(masked_id))


def test_a_masked_runs_figures_and_summary_say_so(capsys, runs_dir, llama_folder):
    from workbench.views.catalog import figure

    status, out, _ = tiny.cli(capsys, *OVERVIEW, "--model", str(llama_folder), "--ablate",
                              "L0H1,L1H3")
    assert status == 0
    run = RunStore(runs_dir).get(out[-1])
    title = figure(run, "head_scores").layout.title.text.replace("<br>", " ")
    assert title.endswith("2 heads zero-ablated (L0H1, L1H3)")
    named = [line for line in run.meta.summary if "L0H1" in line or "L1H3" in line]
    assert named  # head-overview names the most focused and broadest heads
    for line in named:
        assert line.count("L0H1") + line.count("L1H3") == line.count("(ablated in this run)")


# ---- resample's donors ---------------------------------------------------------------

SAME_LENGTH = ["the cat sat on the mat", "the mat sat on the cat", "on the mat the cat sat",
               "sat the cat on the mat"]


def test_ablation_seed_is_stored_and_draws_other_donors(capsys, runs_dir, llama_folder):
    from workbench.interventions.masks import donors

    record = ["record", str(llama_folder), "--text", "\n\n".join(SAME_LENGTH), "--ablate",
              "L0H1,L1H2", "--ablation", "resample"]
    for extra, seed in (([], 0), (["--ablation-seed", "3"], 3), (["--ablation-seed", "4"], 4)):
        status, out, err = tiny.cli(capsys, *record, *extra)
        assert status == 0, err
        stored = _stored_mask(out)
        assert (stored.ablation, stored.seed, stored.removed()) == ("resample", seed,
                                                                    ((0, 1), (1, 2)))
        assert HeadMask.from_record(stored).seed == seed
        assert RunStore(runs_dir).get(out[-1]).meta.config["n_prompts"] == 4
    # a batch of 4 (of 6 possible cycles): each seed draws other donors
    assert len({tuple(donors(4, seed).tolist()) for seed in (0, 3, 4)}) == 3


def test_two_seeds_resample_from_other_donors(llama):
    from workbench.interventions.masks import applied, donors

    ids = torch.randint(5, llama.info.d_vocab, (4, 6), generator=torch.Generator().manual_seed(1))
    assert not torch.equal(donors(4, 0), donors(4, 3))
    out = []
    for seed in (0, 3):
        mask = HeadMask.for_model(llama, ablation="resample", seed=seed).without([(0, 1)])
        with applied(llama, mask), torch.inference_mode():
            out.append(llama.logits(ids))
    assert not torch.allclose(out[0], out[1])


def test_record_refuses_a_prompt_alone_of_its_length_before_the_run(capsys, runs_dir,
                                                                     llama_folder):
    status, _, err = tiny.cli(capsys, "record", str(llama_folder), "--text",
                              "the cat sat on the mat\n\nthe cat sat on the mat\n\nthe cat",
                              "--ablate", "L0H1", "--ablation", "resample")
    assert status == 2 and err.count("\n") == 1, err
    assert "has no other: give prompts of one length" in err
    assert RunStore(runs_dir).runs() == []


def test_record_pairs_prompts_of_one_length_over_the_batch_budget(capsys, runs_dir,
                                                                  llama_folder):
    # two prompts of one length, a budget that holds one: under resample they share a
    # batch (each the other's donor), as the check before the run batched them
    text = "the cat sat on the mat\n\nthe mat sat on the cat"
    status, out, err = tiny.cli(capsys, "record", str(llama_folder), "--text", text,
                                "--max-batch-tokens", "8", "--ablate", "L0H1", "--ablation",
                                "resample")
    assert status == 0, err
    assert _stored_mask(out).ablation == "resample"
    assert len(RunStore(runs_dir).runs()) == 1


# ---- resample on prompts of varied lengths: refused before the model loads -------------

@pytest.mark.parametrize("experiment", ["head-overview", "previous-token-heads"])
def test_resample_on_natural_text_is_refused_before_the_model_loads(
        capsys, runs_dir, llama_folder, no_load, experiment):
    status, _, err = tiny.cli(capsys, "run", experiment, "--model", str(llama_folder),
                              "--set", "prompt_set=natural", "--ablate", "L0H1",
                              "--ablation", "resample")
    assert status == 2 and err.count("\n") == 1, err
    assert "--ablation resample takes each prompt's ablated heads from another prompt of " \
           "the same token length" in err
    assert "alone at their length (" in err and "use --ablation zero or mean" in err
    assert not runs_dir.exists() or RunStore(runs_dir).runs() == []


def test_resample_is_refused_before_the_run_where_the_tokenizer_needs_the_weights(
        capsys, runs_dir, llama_folder, monkeypatch):
    """A model whose tokenizer cannot be read without its weights (a GGUF file, a hub name
    not cached) is checked once it has loaded, before a run exists."""
    from workbench.harness import experiment

    monkeypatch.setattr(experiment, "load_tokenizing", lambda name: None)
    status, _, err = tiny.cli(capsys, "run", "head-overview", "--model", str(llama_folder),
                              "--set", "prompt_set=natural", "--ablate", "L0H1",
                              "--ablation", "resample")
    assert status == 2 and err.count("\n") == 1, err
    assert "alone at their length (" in err and "use --ablation zero or mean" in err
    assert not runs_dir.exists() or RunStore(runs_dir).runs() == []


def test_the_refusal_names_the_lengths_no_other_prompt_has(llama_folder):
    from workbench.inputs.prompts import load_prompt_set
    from workbench.models.load import load_tokenizing

    model = load_tokenizing(str(llama_folder))
    assert model is not None
    lengths = [len(model.encode(p)[0]) for p in load_prompt_set("natural", model)]
    alone = sorted(n for n in set(lengths) if lengths.count(n) == 1)
    assert alone  # natural text: some prompt has no other of its length
    with pytest.raises(WorkbenchError) as caught:
        from workbench.interventions.masks import check_pairing

        check_pairing(lengths, "prompt set natural")
    said = str(caught.value)
    assert f"prompt set natural has {len(alone)} of its {len(lengths)} prompts alone" in said
    assert all(str(n) in said for n in alone[:8])


def test_prompts_that_pair_pass_and_one_prompt_is_refused():
    from workbench.interventions.masks import check_pairing

    check_pairing([5, 7, 5, 7, 7], "these")  # a three where a count is odd
    with pytest.raises(WorkbenchError, match="these holds 1 prompt: use --ablation zero"):
        check_pairing([5], "these")
    with pytest.raises(WorkbenchError, match=r"1 of its 3 prompts alone at their length \(9 "):
        check_pairing([5, 9, 5], "these")


def test_the_tokenizer_alone_encodes_as_the_loaded_model(llama_folder, bert_hf, bert_tokenizer,
                                                         tmp_path):
    from workbench.inputs.prompts import load_prompt_set
    from workbench.models.load import load_model, load_tokenizing

    bert_folder = tiny.save_folder(bert_hf, bert_tokenizer, tmp_path / "tiny-bert")
    for folder in (llama_folder, bert_folder):
        alone, loaded = load_tokenizing(str(folder)), load_model(str(folder))
        assert alone is not None
        assert (alone.info.causal, alone.info.bos_token_id, alone.info.n_ctx) == (
            loaded.info.causal, loaded.info.bos_token_id, loaded.info.n_ctx)
        for name in ("natural", "sentence-pairs"):
            prompts = load_prompt_set(name, loaded)
            assert [alone.encode(p) for p in prompts] == [loaded.encode(p) for p in prompts]


def test_previous_token_heads_runs_resampled_on_windows_of_one_length(capsys, runs_dir,
                                                                      llama_folder):
    # corpus windows and repeated sequences each share a length: the run passes the check,
    # and its example recording pairs each example prompt with another of its length
    status, out, err = tiny.cli(capsys, "run", "previous-token-heads", "--model",
                                str(llama_folder), "--set", "n_prompts=3", "--set",
                                "n_tokens=12", "--set", "n_repeated=2", "--set", "seq_len=5",
                                "--set", "n_boot=20", "--set", "n_null_draws=20",
                                "--ablate", "L0H1", "--ablation", "resample")
    assert status == 0, err
    run = RunStore(runs_dir).get(out[-1])
    assert _stored_mask(out).ablation == "resample"
    from workbench.recording.reader import Recording

    labels = [p.label for p in Recording.open(run.path / "example").prompts]
    assert len(labels) == 4 and sum(x.startswith("repeated") for x in labels) == 2


def test_circuit_under_resample_pairs_every_pass(capsys, runs_dir, llama_folder):
    # three prompts, a budget of two rows a pass: the third row alone would have no donor,
    # so it joins the pass before it
    status, out, err = tiny.cli(capsys, "run", "circuit", "--model", str(llama_folder),
                                "--set", "task=induction", "--set", "n_prompts=3",
                                "--set", "seq_len=4", "--set", "max_batch_tokens=18",
                                "--set", "n_exact=2", "--set", "steps=2",
                                "--set", "fractions=0.5,1.0", "--set", "n_boot=20",
                                "--ablate", "L0H1", "--ablation", "resample")
    assert status == 0, err
    assert _stored_mask(out).ablation == "resample"
    assert "L0H1 (ablated in this run)" in "\n".join(out)


def test_ioi_under_resample_refuses_a_prompt_alone_at_its_length_before_the_run(
        capsys, runs_dir, llama_folder):
    # IOI's prompts are drawn with the loaded model (its one-token names): three prompts
    # over two templates leave one template's prompt alone at its length
    status, _, err = tiny.cli(capsys, "run", "ioi", "--model", str(llama_folder),
                              "--set", "names=and dog on sat the", "--set", "places=dog",
                              "--set", "objects=sat", "--set", "n_prompts=3",
                              "--set", "templates=2", "--set", "patch_prompts=2",
                              "--ablate", "L0H1", "--ablation", "resample")
    assert status == 2 and err.count("\n") == 1, err
    assert "ioi's prompts has 1 of its 3 prompts alone at their length" in err
    assert not runs_dir.exists() or RunStore(runs_dir).runs() == []
