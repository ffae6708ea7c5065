"""Head pruning on the bundled models, with small configurations."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from experiments.head_pruning import Config
from experiments.head_pruning.measure import make_objective
from workbench.harness.experiment import run_experiment
from workbench.interventions.masks import HeadMask
from workbench.scores.losses import token_losses
from workbench.store.runs import RunStore

SMOLLM2 = {"chunk_tokens": 64, "fit_tokens": 128, "ablation_tokens": 64, "eval_tokens": 128,
           "repeat_prompts": 2, "repeat_len": 16, "importance": ("gradient",),
           "reverse": False, "n_random": 1, "step_fraction": 0.1, "max_fraction": 0.1,
           "budgets": (0.1,), "speed_repeats": 5, "n_boot": 50}


def workbench(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "workbench", "--quiet", *args],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()


def test_smollm2_metrics_and_removal(smollm2, runs_dir):
    run = run_experiment("head-pruning", smollm2, SMOLLM2, runs_dir=runs_dir)
    curve = run.table("pruning_curve")
    # every order starts from the unpruned model, so step 0 is the same in each
    step0 = curve[curve.step == 0]
    assert step0.groupby("metric").value.nunique().eq(1).all()
    start = step0.groupby("metric").value.first()
    objective = make_objective(smollm2, Config(**SMOLLM2))
    held = token_losses(smollm2, objective.heldout)
    np.testing.assert_allclose(start["heldout_loss"], np.mean([t.mean() for t in held]),
                               rtol=1e-5)
    # induction: the second repeat of random tokens is far easier than the first
    rep = token_losses(smollm2, objective.repeats)
    first_repeat = np.mean([t[:15].mean() for t in rep])
    assert start["second_repeat_loss"] < first_repeat - 2, (start, first_repeat)
    assert sorted(curve.n_pruned.unique()) == [0, 27]
    scores = run.table("head_scores")
    assert len(scores) == 3 * 270 and np.isfinite(scores.score).all()
    # 27 query heads sliced out of grouped-query layers give the masked model's logits
    speed = run.table("speedup").iloc[0]
    assert speed.n_removed == 27 and speed.max_abs_diff < 1e-3
    # parameters, counted from the mask by the documented rule: a query head takes its
    # q_proj rows and o_proj columns; a layer keeps one kv head per surviving group when the
    # groups stay even, else one kv head per surviving query head (and none when empty)
    masks = run.table("masks")
    keep = masks[(masks.budget == 0.1) & (masks.order == "gradient")]
    d_head, d_model, per_group = 64, 576, 3
    change = 0
    for _, heads in keep.groupby("layer"):
        kept = heads[heads.keep == 1]["head"].tolist()
        groups = [sum(h // per_group == g for h in kept) for g in {h // per_group for h in kept}]
        kv = 0 if not kept else len(groups) if len(set(groups)) == 1 else len(kept)
        change += 2 * (len(kept) - 9) * d_head * d_model + 2 * (kv - 3) * d_head * d_model
    assert speed.params_removed - speed.params_full == change


def test_minilm_from_the_command_line(runs_dir, tmp_path):
    out = workbench("run", "head-pruning", "--model", "minilm", "--set", "chunk_tokens=32",
                    "--set", "fit_tokens=128", "--set", "ablation_tokens=64",
                    "--set", "eval_tokens=256", "--set", "importance=gradient",
                    "--set", "step_fraction=0.25", "--set", "n_random=2", "--set", "probes=2",
                    "--set", "budgets=0.25", "--set", "speed_repeats=5", "--set", "n_boot=50")
    run = RunStore(runs_dir).get(out[-1])
    assert run.status == "complete"
    curve = run.table("pruning_curve")
    assert set(curve.metric) == {"cosine_similarity"}
    np.testing.assert_allclose(curve[curve.step == 0].value, 1.0, atol=1e-6)
    everything = curve[curve.fraction_pruned == 1.0].value  # the same mask in every order
    assert everything.nunique() == 1 and everything.iloc[0] < 0.9
    assert (run.table("speedup").max_abs_diff < 1e-4).all()
    # the saved mask applies to a later recording of the same model
    mask = run.path / "masks" / "gradient-0.25.json"
    assert len(HeadMask.load(mask).removed()) == 18
    out = workbench("record", "minilm", "--text", "The cat sat on the mat.",
                    "--heads-mask", str(mask))
    stored = RunStore(runs_dir).get(out[-1]).meta.interventions.heads_mask
    assert [list(row) for row in stored.mask] == HeadMask.load(mask).values.tolist()
    assert torch.isfinite(HeadMask.load(mask).values).all()
