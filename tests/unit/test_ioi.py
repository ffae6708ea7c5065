"""IOI prompts by hand (templates, orders, named positions, the ABC corruption) and the ioi
and logit-lens experiments on the tiny Llama: their tables against the model's own logits,
their invariants, and no head class claimed where the behaviour is at chance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.harness import claims
from workbench.harness.experiment import get, run_experiment
from workbench.inputs.ioi import TEMPLATES, _ordered, ioi_prompts, single_tokens
from workbench.inputs.prompts import load_prompt_set

WORDS = {"names": "and dog on sat the", "places": "dog", "objects": "sat"}
"""The tiny tokenizer's only words that are one token with their leading space."""
SMALL = {**WORDS, "n_prompts": 6, "templates": 3, "patch_prompts": 2, "n_boot": 50}


def _prompts(llama, n=8, **kw):
    return ioi_prompts(llama, n, names=WORDS["names"].split(), places=["dog"], objects=["sat"],
                       **kw)


def test_orders_and_named_positions_by_hand(llama):
    assert _ordered(TEMPLATES[0], "ABBA").startswith("Then, [A] and [B] went")
    assert _ordered(TEMPLATES[0], "BABA") == TEMPLATES[0]
    prompts = _prompts(llama, 8, templates=[0, 6])
    assert [p.order for p in prompts[:4]] == ["ABBA", "BABA", "ABBA", "BABA"]
    assert [p.template for p in prompts[:4]] == [0, 0, 6, 6]
    for p in prompts:
        ids, r = list(p.ids), p.roles
        assert ids[0] == llama.info.bos_token_id and r["END"] == len(ids) - 1
        assert ids[r["IO"]] == p.io_id and ids[r["S1"]] == ids[r["S2"]] == p.s_id
        assert r["S1+1"] == r["S1"] + 1 and r["S2"] > max(r["IO"], r["S1"])
        assert (r["IO"] < r["S1"]) == (p.order == "ABBA")
        changed = [i for i, (a, b) in enumerate(zip(p.ids, p.corrupted, strict=True)) if a != b]
        assert changed == sorted([r["IO"], r["S1"], r["S2"]])
        new = {p.corrupted[i] for i in changed}
        assert len(new) == 3 and not new & {p.io_id, p.s_id}
        assert llama.str_tokens([p.io_id])[0] == " " + p.io and p.text.endswith(" to")
    lengths = {}
    for p in prompts:
        lengths.setdefault(p.group, set()).add(len(p.ids))
    assert all(len(v) == 1 for v in lengths.values())


def test_names_are_filtered_to_single_tokens(llama):
    assert set(single_tokens(llama, ["dog", "Christopher", "the"])) == {"dog", "the"}
    with pytest.raises(WorkbenchError, match="at least 5 names"):
        ioi_prompts(llama, 2, names=["dog", "the"], places=["dog"], objects=["sat"])
    with pytest.raises(WorkbenchError, match="templates must be"):
        _prompts(llama, 2, templates=[len(TEMPLATES)])


@pytest.fixture(scope="module")
def ioi_run(llama, tmp_path_factory):
    return run_experiment("ioi", llama, SMALL, runs_dir=tmp_path_factory.mktemp("runs"))


def test_the_behaviour_is_the_models_own_logit_difference(llama, ioi_run):
    prompts = _prompts(llama, SMALL["n_prompts"], templates=range(3))
    table = ioi_run.table("prompts")
    for p, row in zip(prompts, table.itertuples(), strict=True):
        with torch.no_grad():
            clean, corrupted = (llama.logits(list(ids))[0, -1].double()
                                for ids in (p.ids, p.corrupted))
        assert row.text == p.text
        assert row.logit_diff == pytest.approx(float(clean[p.io_id] - clean[p.s_id]), abs=1e-5)
        assert row.corrupted_logit_diff == pytest.approx(
            float(corrupted[p.io_id] - corrupted[p.s_id]), abs=1e-5)
    behaviour = ioi_run.table("behaviour").set_index("scope")
    assert behaviour.logit_diff["all"] == pytest.approx(table.logit_diff.mean())
    effects = ioi_run.table("direct_effects")
    assert effects.effect.sum() == pytest.approx(table.logit_diff.mean(), abs=1e-5)


def test_invariants_hold_and_no_class_is_claimed_at_chance(ioi_run):
    checks = ioi_run.table("checks").set_index("invariant").value
    assert checks["dla_sum"] <= 1e-5 and checks["patch_every"] <= 1e-4
    assert checks["patch_nothing"] <= 1e-4
    positions = ioi_run.table("patch_positions")
    assert set(positions.group) == {"T0 ABBA", "T0 BABA"} and (positions.site == "resid_pre").all()
    every = positions[positions.position == -1]
    np.testing.assert_allclose(every.value, 1, atol=1e-4)
    heads = ioi_run.table("patch_heads")
    assert set(heads["head"]) == {-1, 0, 1, 2, 3}
    assert len(ioi_run.table("path_patching"))  # into the top heads by direct effect
    # its senders are all in layer 0: nothing is below them to patch into their keys
    assert ioi_run.table("upstream_paths").empty
    assert any(line.startswith("upstream path patching into s-inhibition candidates: not run")
               for line in ioi_run.meta.summary)
    behaviour = ioi_run.table("behaviour").set_index("scope")
    if not behaviour.above_chance["all"]:  # a random model: nothing may be claimed
        classes = ioi_run.table("classes")
        assert not classes.claimed.any()
        assert any("no head class is claimed" in line for line in ioi_run.meta.summary)
        for head_class in ("name mover", "s-inhibition"):
            m = claims.CHECKS.get("ioi_class_found")(ioi_run, head_class=head_class)
            assert m.outcome == "undecided" and "no class is claimed" in m.measured
    m = claims.CHECKS.get("invariant_at_most")(ioi_run, invariant="dla_sum", threshold=1e-4)
    assert m.outcome == "pass"


def test_ioi_and_the_lens_refuse_encoders_before_a_run(bert, runs_dir):
    for name in ("ioi", "logit-lens"):
        with pytest.raises(ModelCapabilityError):
            get(name).check_fit(bert.info)
    assert not runs_dir.exists() or not any(runs_dir.rglob("run.json"))


def test_the_logit_lens_experiment_against_the_models_logits(llama, tmp_path):
    run = run_experiment("logit-lens", llama, {"prompt_set": "repeated-random", "n_prompts": 3,
                                               "n_boot": 50}, runs_dir=tmp_path)
    prompts = load_prompt_set("repeated-random", llama, limit=3)
    lens = run.table("lens")
    last = lens[lens.layer == llama.info.n_layers]
    for i, prompt in enumerate(prompts):
        ids = list(prompt.token_ids)
        with torch.no_grad():
            probs = llama.logits(ids)[0, -2].double().softmax(-1)
        row = last[last.prompt == i].iloc[0]
        assert row.position == len(ids) - 2 and row.answer_id == ids[-1]
        assert row.answer_prob == pytest.approx(float(probs[ids[-1]]), rel=1e-4)
        assert row.top_id == int(probs.argmax())
    per_prompt = run.table("direct_per_prompt")
    sums = per_prompt.groupby("prompt").agg(effect=("effect", "sum"), total=("total", "first"))
    np.testing.assert_allclose(sums.effect, sums.total, rtol=1e-4, atol=1e-6)
    checks = run.table("checks").set_index("invariant").value
    assert checks["lens_output"] <= 1e-5 and checks["dla_sum"] <= 1e-5
    assert set(run.table("lens_layers").layer) == set(range(llama.info.n_layers + 1))
