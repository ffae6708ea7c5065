"""Head pruning on tiny random models: gradients against the chain rule, ablation
importance against a hand-made mask, pruning orders, the run's tables and claim checks.
Removing heads from the weights is tested in ``test_surgery.py``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from experiments.head_pruning import DEMO, Config
from experiments.head_pruning.checks import prunable_fraction_at_least, pruning_beats_random
from experiments.head_pruning.measure import (
    SIMILARITY,
    CausalObjective,
    EncoderObjective,
    PrunedOrder,
    Pruner,
    budget_masks,
    by_importance,
    in_order,
    make_objective,
    order_table,
    pruning_path,
    random_order,
    schedule,
)
from experiments.head_pruning.summary import curve_summary, prunable_fraction
from experiments.head_pruning.survival import kind_scores, survival_table
from workbench.core.errors import ConfigError
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import run_experiment
from workbench.inputs.prompts import Prompt
from workbench.interventions.importance import (
    ablation_importance,
    gradient_importance,
    mask_gradients,
    normalize_by_layer,
)
from workbench.interventions.masks import HeadMask, applied, head_means, mask_hooks
from workbench.recording import hooks
from workbench.scores.embeddings import sentence_embeddings
from workbench.scores.losses import row_losses, token_losses
from workbench.store import schema
from workbench.store.runs import RunStore

TEXTS = ["the cat sat on the mat and the dog sat on the rug",
         "a quick brown fox jumps over the lazy dog by the river",
         "bread is made from flour water salt and yeast",
         "the committee met on tuesday to discuss the budget"]
PROMPTS = [Prompt(text=t) for t in TEXTS]
SMALL = {"fit_tokens": 128, "ablation_tokens": 32, "eval_tokens": 64, "chunk_tokens": 32,
         "repeat_prompts": 2, "repeat_len": 6, "probes": 2, "step_fraction": 0.25,
         "max_fraction": 0.75, "n_boot": 50, "speed_repeats": 5, "budgets": (0.25, 0.5)}


def causal_objective(model, prompts=PROMPTS, ablation=PROMPTS[:2]):
    return CausalObjective(list(prompts), list(ablation), list(prompts), [], 4, True, 1024)


def encoder_objective(model, prompts=PROMPTS, n_probes=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    probes = torch.randn(len(prompts), n_probes, model.info.d_model, generator=gen)
    ref = sentence_embeddings(model, prompts)
    return EncoderObjective(list(prompts), list(prompts[:2]), list(prompts), ref, ref,
                            probes, 1024)


# ---- gradient importance ---------------------------------------------------------------------

def chain_rule_gradient(model, prompt, values):
    """sum over positions of <dL/dz'_h, z_h>, with z_h captured before the mask and z' after
    it, and L the prompt's mean next-token loss computed here from the logits."""
    ids = torch.tensor([model.encode(prompt)[0]])
    n_layers = model.info.n_layers
    before, first = hooks.caching_hooks([hooks.z(layer) for layer in range(n_layers)])
    after = {}

    def keep_grad(store, layer):
        def hook(z, hook):  # a fresh tensor that the rest of the model reads
            store[layer] = z.clone()
            store[layer].retain_grad()
            return store[layer]

        return hook

    last = [(hooks.z(layer), keep_grad(after, layer)) for layer in range(n_layers)]
    with torch.enable_grad(), model.bridge.hooks(fwd_hooks=first), \
            applied(model, HeadMask(values.clone())), model.bridge.hooks(fwd_hooks=last):
        logits = model.bridge(ids)
        loss = F.cross_entropy(logits[0, :-1], ids[0, 1:])
        loss.backward()
    return torch.stack([(after[layer].grad * before[hooks.z(layer)]).sum((0, 1, 3))
                        for layer in range(n_layers)]).detach()


@pytest.mark.parametrize("values", [torch.ones(2, 4),
                                    torch.tensor([[1.0, 0.0, 1.0, 0.5], [0.0, 1.0, 1.0, 1.0]])])
def test_mask_gradient_is_the_chain_rule_form(llama, values):
    objective = causal_objective(llama)
    grads = mask_gradients(llama, PROMPTS[:2], objective.example_loss, values)
    assert grads.shape == (2, 1, 2, 4)
    for i, prompt in enumerate(PROMPTS[:2]):
        torch.testing.assert_close(grads[i, 0], chain_rule_gradient(llama, prompt, values),
                                   atol=1e-5, rtol=1e-4)


def test_mask_gradients_leave_the_parameters_as_they_were(llama):
    """The parameters are frozen only while the mask is differentiated, and not at all
    when the loss raises (a training run that follows still updates every weight)."""
    before = [p.requires_grad for p in llama.bridge.parameters()]
    objective = causal_objective(llama)
    mask_gradients(llama, PROMPTS[:1], objective.example_loss, torch.ones(2, 4))

    def broken(model, batch):
        raise RuntimeError("loss failed")

    with pytest.raises(RuntimeError, match="loss failed"):
        mask_gradients(llama, PROMPTS[:1], broken, torch.ones(2, 4))
    assert [p.requires_grad for p in llama.bridge.parameters()] == before
    assert any(before)


def test_row_losses_are_the_mean_token_losses_of_each_prompt(llama):
    """The example loss of gradient importance, in a padded batch, against token_losses."""
    batch = llama.batches(PROMPTS)[0]
    by_prompt = torch.stack([t.mean() for t in token_losses(llama, PROMPTS)])
    torch.testing.assert_close(row_losses(llama, batch), by_prompt[batch.indices],
                               atol=1e-5, rtol=1e-5)


def test_per_example_gradients_do_not_depend_on_the_batch(llama):
    objective = causal_objective(llama)
    together = mask_gradients(llama, PROMPTS, objective.example_loss, torch.ones(2, 4))
    alone = torch.cat([mask_gradients(llama, [p], objective.example_loss, torch.ones(2, 4))
                       for p in PROMPTS])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)


def test_per_example_accumulation_differs_from_per_batch(llama):
    objective = causal_objective(llama)
    grads = mask_gradients(llama, PROMPTS, objective.example_loss, torch.ones(2, 4))
    per_example = gradient_importance(grads, accumulate="example")
    per_batch = gradient_importance(grads, accumulate="batch", batch_size=2)
    by_hand_example = torch.stack([g.abs() for g in grads[:, 0]]).mean(0)
    by_hand_batch = ((grads[0, 0] + grads[1, 0]).abs() / 2
                     + (grads[2, 0] + grads[3, 0]).abs() / 2) / 2
    torch.testing.assert_close(per_example, by_hand_example)
    torch.testing.assert_close(per_batch, by_hand_batch)
    # |mean| <= mean |.|, strictly wherever examples disagree in sign
    assert (per_batch <= per_example + 1e-7).all()
    assert not torch.allclose(per_example, per_batch, atol=1e-4)


def test_encoder_probe_gradient_is_the_probed_jacobian(bert):
    """d(g . u)/dxi from one backward pass per probe equals g . J, with J = du/dxi the full
    Jacobian of the unit embedding computed independently (one column per head)."""
    prompt = PROMPTS[1]
    objective = encoder_objective(bert, [prompt], n_probes=3)
    grads = mask_gradients(bert, [prompt], objective.example_loss, torch.ones(2, 4))[0]
    ids = torch.tensor([bert.encode(prompt)[0]])
    name = hooks.resid(2, 2)

    def unit_embedding(flat):
        seen = {}
        fwd = [*mask_hooks(flat.reshape(2, 4)), (name, lambda r, hook: seen.update(r=r))]
        with bert.bridge.hooks(fwd_hooks=fwd):
            bert.bridge(ids)
        return F.normalize(seen["r"][0].mean(0), dim=-1)

    jac = torch.autograd.functional.jacobian(unit_embedding, torch.ones(8))  # [d_model, 8]
    expected = (objective.probes[0] @ jac).reshape(3, 2, 4)
    torch.testing.assert_close(grads, expected, atol=1e-5, rtol=1e-4)
    # removing a head moves the unit embedding, so its Jacobian column is not zero
    assert (jac.norm(dim=0) > 0).all()


def test_normalize_by_layer():
    imp = torch.tensor([[3.0, 4.0, 7.0], [0.0, 0.0, 0.0]])
    keep = torch.tensor([[True, True, False], [True, True, True]])
    out = normalize_by_layer(imp, keep)
    torch.testing.assert_close(out[0, :2], torch.tensor([0.6, 0.8]))
    assert torch.isnan(out[0, 2]) and (out[1] == 0).all()


# ---- ablation importance ---------------------------------------------------------------------

@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_ablation_importance_is_the_loss_change_of_a_hand_made_mask(llama, ablation):
    objective = causal_objective(llama)
    means = head_means(llama, PROMPTS) if ablation == "mean" else None
    start = HeadMask.for_model(llama, ablation=ablation).without([(0, 3)])
    # 64 tokens per pass: several heads share a forward pass, and the batch is split
    diffs = ablation_importance(llama, PROMPTS[:2], objective.row_degradation, start,
                                means=means, max_batch_tokens=64)
    assert diffs.shape == (2, 2, 4) and torch.isnan(diffs[:, 0, 3]).all()

    def mean_losses(mask):
        with applied(llama, mask, means=means):
            return torch.stack([t.mean() for t in token_losses(llama, PROMPTS[:2])])

    by_hand = mean_losses(start.without([(1, 2)])) - mean_losses(start)
    torch.testing.assert_close(diffs[:, 1, 2], by_hand)


def test_encoder_ablation_importance_is_one_minus_cosine(bert):
    objective = encoder_objective(bert)
    diffs = ablation_importance(bert, PROMPTS[:2], objective.row_degradation,
                                HeadMask.for_model(bert))
    with applied(bert, HeadMask.for_model(bert).without([(1, 1)])):
        emb = sentence_embeddings(bert, PROMPTS[:2])
    ref = sentence_embeddings(bert, PROMPTS[:2])
    expected = 1 - (emb * ref).sum(-1) / (emb.norm(dim=-1) * ref.norm(dim=-1))
    torch.testing.assert_close(diffs[:, 1, 1], expected, atol=1e-6, rtol=1e-5)


def test_sentence_embedding_is_the_mean_of_the_final_residual_stream(bert):
    ids = torch.tensor([bert.encode(PROMPTS[0])[0]])
    with torch.inference_mode():
        _, cache = bert.bridge.run_with_cache(ids)
    expected = cache[hooks.resid(2, 2)][0].mean(0)
    torch.testing.assert_close(sentence_embeddings(bert, PROMPTS[:1])[0], expected,
                               atol=1e-6, rtol=1e-5)


# ---- pruning orders --------------------------------------------------------------------------

def test_schedule_removes_a_fixed_fraction_of_all_heads_per_step():
    assert schedule(270, 0.1, 1.0) == list(range(0, 271, 27))
    assert schedule(72, 0.1, 0.5) == [0, 7, 14, 22, 29, 36]
    assert schedule(8, 0.25, 0.75) == [0, 2, 4, 6]
    assert schedule(3, 0.1, 1.0) == [0, 1, 2, 3]  # never a step that removes nothing


def test_importance_order_removes_the_least_important_and_re_estimates():
    seen = []

    def importance(mask):  # a head matters more the fewer heads its layer has left
        seen.append(mask.clone())
        left = mask.sum(1, keepdim=True)
        return 10 - left + 0.01 * torch.arange(3)[None, :].float()

    masks, removed = pruning_path(torch.ones(2, 3), [0, 1, 2, 4],
                                     by_importance(importance))
    # layer counts tie at first, so head (0, 0); then layer 0 has fewer left, so layer 1
    assert removed[:2] == [(0, 0), (1, 0)]
    assert len(seen) == 3 and all(torch.equal(a, b) for a, b in zip(seen, masks, strict=False))
    assert [int((m == 0).sum()) for m in masks] == [0, 1, 2, 4]
    assert len(set(removed)) == len(removed)
    reverse = pruning_path(torch.ones(2, 3), [0, 2],
                              by_importance(lambda m: torch.arange(6.0).reshape(2, 3),
                                               reverse=True))[1]
    assert reverse == [(1, 2), (1, 1)]


def test_random_orders_are_reproducible_permutations():
    a, b = random_order(3, 4, seed=1), random_order(3, 4, seed=2)
    assert sorted(a) == [(layer, head) for layer in range(3) for head in range(4)]
    assert a == random_order(3, 4, seed=1) and a != b
    masks, removed = pruning_path(torch.ones(3, 4), [0, 5, 12], in_order(a))
    assert removed == a and (masks[-1] == 0).all()


def test_a_chooser_that_removes_a_removed_head_is_refused():
    with pytest.raises(Exception, match="distinct heads still in the model"):
        pruning_path(torch.ones(1, 3), [0, 1, 2], lambda mask, k: [(0, 0)])


def test_order_table_and_budget_masks():
    masks, removed = pruning_path(torch.ones(2, 2), [0, 1, 3], in_order(
        [(1, 1), (0, 0), (1, 0), (0, 1)]))
    po = PrunedOrder("x", "", None, masks, removed)
    table = order_table([po], [0, 1, 3], 2, 2).set_index(["layer", "head"])
    assert table.loc[(1, 1)].step == 1 and table.loc[(1, 0)].step == 2
    assert table.loc[(1, 0)].fraction_pruned == 0.75
    assert pd.isna(table.loc[(0, 1)].step) and table.loc[(0, 1)].survival == 3.5 / 4
    assert table.survival.mean() == pytest.approx(0.5)
    got = budget_masks(po, [0, 1, 3], [0.25, 0.5, 1.0], 4)
    assert [int((m == 0).sum()) for m in got.values()] == [1, 1, 3]


def test_prunable_fraction_stops_at_the_first_step_beyond_tolerance():
    curve = pd.DataFrame({"metric": "heldout_loss", "fraction_pruned": [0, .1, .2, .3, .4],
                          "value": [2.0, 2.05, 2.3, 2.08, 3.0]})
    assert prunable_fraction(curve, "heldout_loss", 0.05) == pytest.approx(0.1)
    sim = curve.assign(metric=SIMILARITY, value=[1.0, 0.99, 0.97, 0.9, 0.8])
    assert prunable_fraction(sim, SIMILARITY, 0.05) == pytest.approx(0.2)


# ---- the experiment --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_run(llama, tmp_path_factory):
    # every kind of order: both importances, the reverse and three random seeds
    return run_experiment("head-pruning", llama,
                          {**SMALL, "importance": ("gradient", "ablation"), "n_random": 3},
                          runs_dir=tmp_path_factory.mktemp("runs"))


def test_run_tables_on_a_tiny_llama(llama, llama_run):
    run = llama_run
    scores = run.table("head_scores")
    assert set(scores.metric) == {"importance_gradient", "importance_gradient_raw",
                                  "importance_ablation"}
    assert len(scores) == 3 * 8 and (scores.ci_low <= scores.score + 1e-9).all()
    grad = scores[scores.metric == "importance_gradient"]
    norms = grad.groupby("layer").score.apply(lambda s: float(np.sqrt((s ** 2).sum())))
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    curve = run.table("pruning_curve")
    assert set(curve.order) == {"gradient", "ablation", "reverse-gradient", "random"}
    assert sorted(curve[curve.order == "random"].seed.unique()) == [1, 2, 3]
    assert sorted(curve.n_pruned.unique()) == [0, 2, 4, 6]
    # step 0 is the unpruned model: its held-out loss, computed independently
    cfg = Config(**SMALL)
    objective = make_objective(llama, cfg)
    expected = np.mean([t.mean().item() for t in token_losses(llama, objective.heldout)])
    start = curve[(curve.step == 0) & (curve.metric == "heldout_loss")]
    np.testing.assert_allclose(start.value, expected, rtol=1e-5)
    by_prompt = run.table("pruning_curve_by_prompt")
    keys = ["order", "seed", "step", "metric"]
    means = by_prompt.groupby(keys, dropna=False).value.agg(["mean", "size"]).reset_index()
    both = curve.merge(means, on=keys, validate="one_to_one")
    assert len(both) == len(curve) == len(means)
    np.testing.assert_allclose(both["mean"], both.value, rtol=1e-6)
    assert (both["size"] == both.n_prompts).all()
    # each fit text's importance, averaged, is the stored one (the normalised one has none)
    importance = run.table("head_scores_by_prompt")
    assert set(importance.metric) == {"importance_gradient_raw", "importance_ablation"}
    keys = ["metric", "layer", "head"]
    means = importance.groupby(keys).score.agg(["mean", "size"])
    stored = scores.set_index(keys).loc[means.index]
    np.testing.assert_allclose(means["mean"], stored.score, rtol=1e-6, atol=1e-12)
    assert (means["size"] == stored.n_prompts).all()
    order = run.table("pruning_order")
    per_order = order.groupby(["order", "seed"], dropna=False)
    assert (per_order.position.count() == 6).all() and (per_order.size() == 8).all()


def test_run_saves_masks_that_load_as_head_masks(llama_run):
    masks = llama_run.table("masks")
    for budget in (0.25, 0.5):
        mask = HeadMask.load(llama_run.path / "masks" / f"gradient-{budget:.2f}.json")
        table = masks[masks.budget == budget].sort_values(["layer", "head"])
        assert mask.values.flatten().tolist() == table.keep.tolist()
        assert len(mask.removed()) == round(budget * 8)
    order = llama_run.table("pruning_order")
    first = order[(order.order == "gradient") & (order.step == 1)]
    half = HeadMask.load(llama_run.path / "masks" / "gradient-0.25.json")
    assert sorted(half.removed()) == sorted(zip(first.layer, first["head"], strict=True))


def test_claim_checks_read_the_curves(llama_run):
    beats = pruning_beats_random(llama_run, order="gradient", metric="heldout_loss",
                                    fractions=[0.25])
    curve = curve_summary(llama_run.table("pruning_curve"), "heldout_loss")
    row = curve[curve.fraction_pruned == 0.25].iloc[0]
    expected = ("pass" if row.gradient <= row.random_min else
                "fail" if row.gradient > row.random_max else "undecided")
    assert beats.outcome == expected and "25%:" in beats.measured
    assert beats.ci_low == pytest.approx(row.random_min - row.gradient)
    assert beats.ci_high == pytest.approx(row.random_max - row.gradient)
    frac = prunable_fraction_at_least(llama_run, order="gradient", metric="heldout_loss",
                                         tolerance=0.5, fraction=0.5)
    assert frac.value == 0.75 and frac.ci_low <= 0.75 <= frac.ci_high and frac.threshold == 0.5
    more = prunable_fraction_at_least(llama_run, order="gradient", metric="heldout_loss",
                                         tolerance=0.5, fraction=0.9)
    # the run pruned 75% at most: a claim about 90% is undecided, not failed
    assert more.outcome == "undecided" and "cannot reach the claimed 90%" in more.measured


def test_encoder_run(bert, tmp_path):
    run = run_experiment("head-pruning", bert, {**SMALL, "importance": ("gradient",),
                                                "n_random": 1, "reverse": False},
                         runs_dir=tmp_path)
    curve = run.table("pruning_curve")
    assert set(curve.metric) == {SIMILARITY}
    assert curve[curve.step == 0].value.tolist() == pytest.approx([1.0, 1.0])
    speed = run.table("speedup")
    assert len(speed) == 2 and (speed.max_abs_diff < 1e-4).all()


# head scores as a head-finding run stores them, reduced to what the join reads
HEAD_SCORES = schema.tables(schema.Table("head_scores", "scores per head", schema.columns(
    ("layer", "int", "layer"), ("head", "int", "head"), ("metric", "str", "metric"),
    ("score", "float", "score"))))


def test_survival_join_finds_matching_runs_only(llama, tmp_path):
    store = RunStore(tmp_path)
    info = llama.info
    heads = pd.DataFrame({"layer": [0, 0, 0, 0, 1, 1, 1, 1], "head": [0, 1, 2, 3] * 2,
                          "metric": "induction", "score": np.arange(8.0)})
    for model, interventions in [(info, None), (info.replace(checksum="other"), None),
                                 (info, {"heads_mask": HeadMask.ones(2, 4).to_json()})]:
        with store.start("induction-heads", model, {}, tables=HEAD_SCORES,
                         extra={"interventions": interventions}) as run:
            run.save_table("head_scores", heads.assign(score=heads.score * (
                1 if model is info and interventions is None else -1)))
    kinds = kind_scores(store, info)
    assert kinds.run.nunique() == 1 and (kinds.score >= 0).all()
    order = pd.DataFrame({"order": "gradient", "layer": heads.layer, "head": heads["head"],
                          "survival": (np.arange(8) + 0.5) / 8})
    table = survival_table(order, kinds, top_k=2)
    row = table.iloc[0]
    assert row.heads == "L1H3, L1H2" and row.spearman == pytest.approx(1.0)
    assert row.top_mean_survival == pytest.approx((7.5 + 6.5) / 16) and row.z > 0
    assert row.runs_read == row.run == store.latest_on_weights("induction-heads", info).id


def test_survival_names_every_run_it_read_even_one_that_gives_no_row(llama, tmp_path):
    """An attention-sinks run with 2 scored heads gives no row (3 are needed), and the
    table still says it was read, after the induction-heads run, on every row."""
    store = RunStore(tmp_path)
    heads = pd.DataFrame({"layer": [0, 0, 0, 0, 1, 1, 1, 1], "head": [0, 1, 2, 3] * 2,
                          "metric": "induction", "score": np.arange(8.0)})
    for name, scores in [("induction-heads", heads),
                         ("attention-sinks", heads.iloc[:2].assign(metric="first_token"))]:
        with store.start(name, llama.info, {}, tables=HEAD_SCORES) as run:
            run.save_table("head_scores", scores)
    order = pd.DataFrame({"order": "gradient", "layer": heads.layer, "head": heads["head"],
                          "survival": (np.arange(8) + 0.5) / 8})
    table = survival_table(order, kind_scores(store, llama.info), top_k=2)
    read = [store.latest_on_weights(name, llama.info).id
            for name in ("induction-heads", "attention-sinks")]
    assert list(table.experiment) == ["induction-heads"]
    assert list(table.runs_read) == [", ".join(read)]


def test_a_survival_table_stored_before_runs_read_reads_back_with_it_empty(llama, tmp_path):
    """A run stored before the survival table said which runs it read holds runs_read ''
    when read through its declaration; its run column still names each row's run."""
    from experiments.head_pruning.tables import SURVIVAL
    from workbench.harness.tables import read

    before = schema.Table("survival", SURVIVAL.meaning,
                          tuple(c for c in SURVIVAL.columns if c.name != "runs_read"))
    row = {"experiment": "induction-heads", "run": "20250101-000000-induction-heads-tiny-ab12",
           "metric": "induction", "order": "gradient", "top_k": 2, "heads": "L1H3, L1H2",
           "top_mean_survival": 0.875, "z": 1.5, "spearman": 1.0}
    store = RunStore(tmp_path)
    with store.start("head-pruning", llama.info, {}, tables=schema.tables(before)) as active:
        active.save_table("survival", pd.DataFrame([row]))
    table = read(store.get(active.final), "survival")
    assert list(table.runs_read) == [""] and list(table.run) == [row["run"]]
    SURVIVAL.check(table)


@pytest.mark.parametrize("override, message", [
    ({"importance": ("gradient", "gradient")}, "distinct kinds"),
    ({"importance": ()}, "distinct kinds"),
    ({"importance": ("gradient", "magnitude")}, "expected one of"),
    ({"ablation_tokens": 4096}, "at most fit_tokens"),
    ({"max_fraction": 1.5}, "max_fraction: expected at most 1"),
    ({"step_fraction": 0.0}, "step_fraction: expected at least"),
    ({"budgets": (0.3, 0.0)}, "budgets: expected at least"),
    ({"eval_tokens": 16}, "at least chunk_tokens"),
    ({"n_random": -1}, "n_random: expected at least 0"),
    ({"ablation": "resample"}, "ablation: expected one of 'zero' \\| 'mean', got 'resample'"),
])
def test_bad_configs_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(Config, override)


def test_config_parses_from_the_command_line_form():
    cfg = apply_overrides(Config, ["importance=ablation,gradient", "budgets=0.2,0.4"])
    assert cfg.importance == ("ablation", "gradient") and cfg.budgets == (0.2, 0.4)
    assert json.loads(json.dumps(DEMO, default=list))["importance"] == ["gradient"]
    assert apply_overrides(Config, json.loads(json.dumps(DEMO, default=list))).budgets == (
        0.1, 0.3)


def test_unnormalised_ranking_and_skipping_ablation(llama, tmp_path):
    cfg = Config(**{**SMALL, "normalize": False, "ablation_tokens": 0,
                    "importance": ("gradient",)})
    objective = make_objective(llama, cfg)
    pruner = Pruner(llama, objective, cfg)
    values = torch.ones(2, 4)
    values[0, 1] = 0
    grads = mask_gradients(llama, objective.fit, objective.example_loss, values)
    score = pruner.score("gradient", values)
    raw = grads.abs().mean((0, 1))
    assert torch.isnan(score[0, 1])
    keep = values != 0
    torch.testing.assert_close(score[keep], raw[keep])
    scores, by_prompt = pruner.head_scores()
    assert set(scores.metric) == {"importance_gradient", "importance_gradient_raw"}
    assert by_prompt is not None and set(by_prompt.metric) == {"importance_gradient_raw"}
    with pytest.raises(ValueError, match="ablation_tokens > 0"):
        Config(ablation_tokens=0, importance=("gradient", "ablation"))


def test_tables_left_empty_still_match_their_declarations(llama, tmp_path):
    """No speed-up asked for and no run to join: the empty tables are stored, typed."""
    run = run_experiment("head-pruning", llama, {**SMALL, "importance": ("gradient",),
                                                 "ablation_tokens": 0, "reverse": False,
                                                 "n_random": 0, "speed_repeats": 0},
                         runs_dir=tmp_path)
    assert run.table("speedup").empty and run.table("survival").empty
    assert set(run.table("pruning_curve").order) == {"gradient"}
    assert any("survival by kind of head skipped" in line for line in run.meta.summary)


class _Curve:
    """A stand-in run holding only a pruning curve (what the checks read)."""

    id = "stub"

    def __init__(self, curve):
        self.curve = curve

    def table(self, name):
        assert name == "pruning_curve"
        return self.curve


def _curve(importance, randoms, metric="heldout_loss", base=1.0, spread=0.0):
    """Two steps (0% and 50% pruned): the importance order and one row per random order."""
    rows = []
    for order, seed, value in [("gradient", None, importance),
                               *[("random", i + 1, v) for i, v in enumerate(randoms)]]:
        for step, fraction, v in ((0, 0.0, base), (1, 0.5, value)):
            rows.append({"order": order, "importance": "gradient", "seed": seed, "step": step,
                         "n_pruned": step, "fraction_pruned": fraction, "metric": metric,
                         "value": v, "ci_low": v - spread if step else v,
                         "ci_high": v + spread if step else v, "n_prompts": 4})
    return _Curve(pd.DataFrame(rows))


@pytest.mark.parametrize("importance, randoms, verdict", [
    (2.0, [2.5, 3.0, 4.0], "pass"),       # below every random order
    (2.0, [1.5, 2.5, 3.0], "undecided"),  # inside the random orders' spread
    (2.0, [1.0, 1.2, 1.9], "fail"),       # above every random order
])
def test_pruning_beats_random_judges_the_random_spread(importance, randoms, verdict):
    m = pruning_beats_random(_curve(importance, randoms), order="gradient",
                             metric="heldout_loss", fractions=[0.5])
    assert m.outcome == verdict and m.threshold == 0.0
    assert (m.ci_low, m.ci_high) == pytest.approx((min(randoms) - 2.0, max(randoms) - 2.0))
    # a similarity is better when higher: the same numbers read the other way round
    sim = pruning_beats_random(_curve(importance, randoms, metric="cosine_similarity"),
                               order="gradient", metric="cosine_similarity", fractions=[0.5])
    assert sim.outcome == {"pass": "fail", "fail": "pass", "undecided": "undecided"}[verdict]


@pytest.mark.parametrize("value, spread, verdict", [
    (1.02, 0.01, "pass"),       # +2% loss, within 5% at both ends of the interval
    (1.04, 0.03, "undecided"),  # the pessimistic end (+7%) fails 5%, the optimistic (+1%) passes
    (1.20, 0.01, "fail"),       # +20% at both ends
])
def test_prunable_fraction_judges_the_bootstrap_ends(value, spread, verdict):
    m = prunable_fraction_at_least(_curve(value, [], spread=spread), order="gradient",
                                   metric="heldout_loss", tolerance=0.05, fraction=0.5)
    assert m.outcome == verdict and m.threshold == 0.5


def test_the_speed_up_is_the_median_of_interleaved_pairs_with_its_range(bert, tmp_path,
                                                                        monkeypatch):
    """Timings scripted so that one slow moment hits the third pair: the median ignores it,
    the range shows it, and the pairs alternate full, removed."""
    from experiments.head_pruning import speedup

    calls = []

    def scripted(hf_model, batch, causal):
        calls.append(hf_model)
        plain = calls[0]  # the first call warms the full model up
        fulls = sum(m is plain for m in calls[1:])
        if hf_model is plain:
            return 10.0 if fulls == 3 else 1.0
        return 0.5

    monkeypatch.setattr(speedup, "_seconds", scripted)
    run = run_experiment("head-pruning", bert, {**SMALL, "importance": ("gradient",),
                                                "n_random": 1, "reverse": False,
                                                "budgets": (0.25,)}, runs_dir=tmp_path)
    row = run.table("speedup").iloc[0]
    assert row.repeats == 5
    assert (row.seconds_full, row.seconds_full_low, row.seconds_full_high) == (1.0, 1.0, 10.0)
    assert (row.seconds_removed, row.seconds_removed_low, row.seconds_removed_high) == (
        0.5, 0.5, 0.5)
    assert (row.speedup, row.speedup_low, row.speedup_high) == (2.0, 2.0, 20.0)
    plain, warm_removed, *timed = calls
    assert warm_removed is not plain
    assert [m is plain for m in timed] == [True, False] * 5  # full, removed, alternately
    assert isinstance(row.busy, bool | np.bool_) and row.load_before >= 0


def test_fewer_than_five_timed_pairs_are_refused():
    with pytest.raises(ValueError, match=r"speed_repeats: 0 \(skip\) or at least 5"):
        Config(speed_repeats=2)
    assert Config(speed_repeats=0).speed_repeats == 0


def test_compare_pairs_two_pruning_runs_prompt_by_prompt(llama, llama_run, tmp_path):
    from workbench.harness.compare import compare

    # fewer orders on the same texts: the unpruned step is the same model in both
    other = run_experiment("head-pruning", llama, {**SMALL, "importance": ("gradient",),
                                                    "n_random": 1, "reverse": False},
                           runs_dir=llama_run.path.parent)
    rows = compare(llama_run, other, only="pruning_curve_by_prompt").differences
    assert len(rows) and (rows.pairing == "same prompts").all()
    unpruned = rows[rows.key.str.contains("order=gradient ") & rows.key.str.contains(" step=0 ")]
    assert len(unpruned) == 2 and np.allclose(unpruned.difference, 0, atol=1e-6)
    assert set(rows.key.str.extract(r"order=(\S+)")[0]) == {"gradient", "random"}
    # the importance of the unpruned model on the same fit texts: paired, and the same
    importance = compare(llama_run, other, only="head_scores_by_prompt").differences
    assert len(importance) and (importance.pairing == "same prompts").all()
    assert set(importance.key.str.extract(r"metric=(\S+)")[0]) == {
        "importance_gradient_raw", "importance_ablation"}
    np.testing.assert_allclose(importance.difference, 0, atol=1e-6)
    # more fit text is another set of texts: compared unpaired
    more = run_experiment("head-pruning", llama, {**SMALL, "importance": ("gradient",),
                                                   "n_random": 0, "reverse": False,
                                                   "speed_repeats": 0,
                                                   "fit_tokens": 2 * SMALL["fit_tokens"]},
                          runs_dir=llama_run.path.parent)
    unpaired = compare(llama_run, more, only="head_scores_by_prompt").differences
    assert (unpaired.pairing == "different prompts").all()
