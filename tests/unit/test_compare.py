"""Comparing two runs: the paired statistics against hand computations and a plain numpy
reference, their invariants (a run against itself: difference 0, p = 1), and the
researcher's question end to end on the tiny model: score induction heads, ablate the top
heads with a head mask, ablate same-layer control heads, ``workbench compare`` the runs."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from tests import tiny
from tests.dashboard_runs import CONFIGS
from workbench.harness.compare import compare, config_table
from workbench.interventions.masks import HeadMask
from workbench.scores import paired
from workbench.store.runs import RunStore
from workbench.store.schema import Table, columns, per_prompt


def reference_bootstrap(d: np.ndarray, n_boot: int, seed: int) -> tuple[float, float]:
    """The percentile interval of the mean of ``d``, written out with numpy alone."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n_boot, len(d)))
    means = np.array([d[row].mean() for row in idx])
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def exact_sign_flip_p(d: np.ndarray) -> float:
    """The exact two-sided sign-flip p-value: every one of the 2^n sign patterns."""
    observed = abs(d.mean())
    flips = [abs((np.array(s) * d).mean()) for s in itertools.product((-1, 1), repeat=len(d))]
    return float(np.mean([f >= observed - 1e-12 for f in flips]))


def test_paired_interval_is_the_percentile_bootstrap_of_the_differences():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(30, 3))
    b = a + rng.normal(0.4, 1.0, size=(30, 3))
    out = paired.paired_differences(a, b, n_boot=500, n_flips=200, seed=7)
    for j in range(3):
        low, high = reference_bootstrap(b[:, j] - a[:, j], 500, 7)
        assert out.ci_low[j] == pytest.approx(low) and out.ci_high[j] == pytest.approx(high)
        assert out.difference[j] == pytest.approx((b[:, j] - a[:, j]).mean())
        assert out.a[j] == pytest.approx(a[:, j].mean()) and out.b[j] == pytest.approx(
            b[:, j].mean())
    assert (out.n_prompts == 30).all()


@pytest.mark.parametrize("d", [[0.5, 0.5, 0.5, 0.5], [1.0, -0.2, 0.3, 0.7, 0.1, -0.4],
                               [2.0, 1.5, 0.1, 0.3, 0.9, 1.1, 0.4, 0.2]])
def test_sign_flip_p_matches_the_exact_enumeration(d):
    d = np.array(d)
    exact = exact_sign_flip_p(d)
    p = paired.sign_flip_p_two_sided(d[:, None], 40_000, seed=1)[0]
    # Monte Carlo over 40,000 draws: within 4 standard errors of the exact value
    assert abs(p - exact) < 4 * np.sqrt(exact * (1 - exact) / 40_000) + 1e-4


def test_constant_differences_reach_the_two_sign_patterns():
    """Four equal differences: only all-plus and all-minus reach |mean|, p = 2/16."""
    assert exact_sign_flip_p(np.full(4, 0.5)) == 2 / 16


def test_a_run_against_itself_differs_by_zero_with_p_one():
    a = np.random.default_rng(0).normal(size=(12, 5))
    out = paired.paired_differences(a, a.copy())
    assert (out.difference == 0).all() and (out.ci_low == 0).all() and (out.ci_high == 0).all()
    assert (out.p == 1).all()


def test_nan_prompts_are_left_out_and_unpaired_gives_no_p():
    a = np.array([[1.0], [2.0], [np.nan], [4.0]])
    out = paired.paired_differences(a, a + 1)
    assert out.difference[0] == 1 and out.n_prompts[0] == 3 and out.a[0] == pytest.approx(7 / 3)
    unpaired = paired.unpaired_differences(np.ones((5, 2)), np.full((7, 2), 3.0))
    assert (unpaired.difference == 2).all() and unpaired.p.isna().all()
    assert (unpaired.ci_low == 2).all() and (unpaired.ci_high == 2).all()


def test_config_table_lists_every_field_of_either():
    table = config_table({"seed": 0, "n": 2}, {"seed": 1, "extra": [1]})
    assert table.set_index("field").differs.to_dict() == {"seed": True, "n": True,
                                                          "extra": True}
    assert table.set_index("field").loc["extra"].a == "-"


# ---- end to end on the tiny model ------------------------------------------------------

def _sets(config: dict) -> list[str]:
    return [arg for k, v in config.items() for arg in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory, llama_folder):
    """Clean, top-heads-ablated and control-ablated induction-heads runs on the tiny
    model, made through the command line as a researcher would: ``--ablate
    top:induction:2 --from CLEAN``, then ``--ablate control:induction:2 --from CLEAN``."""
    root = tmp_path_factory.mktemp("compare-runs")
    args = ["run", "induction-heads", "--model", str(llama_folder), "--out", str(root),
            *_sets(CONFIGS["induction-heads"])]
    clean = _made(root, args)
    scores = clean.table("head_scores")
    induction = scores[(scores.metric == "induction") & scores.score.notna()]
    top = induction.nlargest(2, "score")
    ablated = [(int(r.layer), int(r.head)) for r in top.itertuples()]
    # the control: as many other heads of the same layers, the lowest-scoring
    control = []
    for layer in sorted({layer for layer, _ in ablated}):
        others = induction[(induction.layer == layer)
                           & ~induction["head"].isin([h for lay, h in ablated if lay == layer])]
        count = sum(lay == layer for lay, _ in ablated)
        control += [(layer, int(h)) for h in others.nsmallest(count, "score")["head"]]
    top_run = _made(root, [*args, "--ablate", "top:induction:2", "--from", clean.id,
                           "--ablation", "mean"])
    control_run = _made(root, [*args, "--ablate", "control:induction:2", "--from", clean.id,
                               "--ablation", "mean"])
    # the same stored mask as a hand-written head mask of those heads
    assert top_run.meta.interventions.heads_mask.removed() == tuple(sorted(ablated))
    assert control_run.meta.interventions.heads_mask.removed() == tuple(sorted(control))
    return root, [clean, top_run, control_run], ablated


def _made(root, args: list[str]):
    """The run a ``workbench`` command line made in the store at ``root``."""
    from workbench.cli import main

    before = {r.id for r in RunStore(root).runs()}
    main(["--quiet", *args])
    (made,) = [r for r in RunStore(root).runs() if r.id not in before]
    return made


def test_per_prompt_tables_agree_with_their_aggregates(three_runs):
    _, (clean, *_), _ = three_runs
    by_prompt = clean.table("repeat_loss_by_prompt")
    means = by_prompt.groupby("repeat").loss.mean().to_numpy()
    np.testing.assert_allclose(means, clean.table("repeat_loss").loss.to_numpy(), rtol=1e-6)
    icl = clean.table("icl_by_prompt").groupby("metric", sort=False).value.mean()
    stored = clean.table("icl").set_index("metric").value
    np.testing.assert_allclose(icl.loc[stored.index].to_numpy(), stored.to_numpy(), rtol=1e-6)
    by_pos = clean.table("loss_by_prompt").groupby("position").loss.mean().to_numpy()
    np.testing.assert_allclose(by_pos, clean.table("loss_by_position").loss.to_numpy(),
                               rtol=1e-5)
    keys = ["layer", "head", "metric", "inputs"]
    per_head = clean.table("head_scores_by_prompt").groupby(keys).score.mean()
    scores = clean.table("head_scores").set_index(keys).score
    assert set(per_head.index) == set(scores.index)  # copying's included, token by token
    np.testing.assert_allclose(per_head.to_numpy(), scores.loc[per_head.index].to_numpy(),
                               rtol=1e-6)
    copying = clean.table("head_scores_by_prompt").query("metric == 'copying'")
    assert copying.prompt.nunique() == clean.table("head_scores").query(
        "metric == 'copying'").n_prompts.iloc[0]


def test_induction_heads_pairs_copying_token_by_token(three_runs):
    _, (clean, ablated, _), _ = three_runs
    rows = compare(clean, ablated, only="head_scores_by_prompt").differences
    copying = rows[rows.key.str.contains("metric=copying")]
    assert len(copying) and (copying.pairing == "same prompts").all()
    assert copying.p.notna().all()


@pytest.mark.parametrize("experiment, table", [
    ("previous-token-heads", "head_scores_by_prompt"), ("head-overview", "per_prompt_scores")])
def test_head_scoring_experiments_pair_their_heads_by_prompt(llama, tmp_path, experiment,
                                                             table):
    from workbench.harness.experiment import run_experiment

    config = CONFIGS.get(experiment, {"n_boot": 20})
    clean = run_experiment(experiment, llama, config, runs_dir=tmp_path)
    mask = HeadMask.for_model(llama).without([(0, 1)])
    masked = run_experiment(experiment, llama, config, runs_dir=tmp_path, heads_mask=mask)
    itself = compare(clean, clean, only=table).differences
    assert (itself.pairing == "same prompts").all() and (itself.p.dropna() == 1).all()
    assert (itself.difference.dropna() == 0).all()
    rows = compare(clean, masked, only=table).differences
    assert (rows.pairing == "same prompts").all()
    # the mask acts on layer 0's output: layer 0's patterns, and so its scores, stay put
    layer0 = rows[rows.key.str.startswith("layer=0 ")]
    assert len(layer0) and (layer0.difference.dropna() == 0).all()
    assert (rows[rows.key.str.startswith("layer=1 ")].difference.abs() > 0).any()


def test_a_run_compared_with_itself(three_runs):
    _, (clean, *_), _ = three_runs
    result = compare(clean, clean)
    paired_rows = result.differences[result.differences.pairing == "same prompts"]
    assert len(paired_rows) and (paired_rows.difference == 0).all()
    assert (paired_rows.p == 1).all()
    assert (result.differences.difference.fillna(0) == 0).all()
    assert not result.config.differs.any() and result.interventions == ("none", "none")


def test_ablation_against_clean_is_paired_by_prompt(three_runs):
    _, (clean, ablated, control), heads = three_runs
    result = compare(clean, ablated)
    table = result.differences
    second = table[(table.table == "repeat_loss_by_prompt") & (table.key == "repeat=2")].iloc[0]
    a = clean.table("repeat_loss_by_prompt").query("repeat == 2").sort_values("prompt").loss
    b = ablated.table("repeat_loss_by_prompt").query("repeat == 2").sort_values("prompt").loss
    d = b.to_numpy() - a.to_numpy()
    assert second.difference == pytest.approx(d.mean())
    low, high = reference_bootstrap(d, paired.N_RESAMPLES, paired.SEED)
    assert (second.ci_low, second.ci_high) == (pytest.approx(low), pytest.approx(high))
    assert second.pairing == "same prompts" and 0 < second.p <= 1
    exact = exact_sign_flip_p(d)  # 4 prompts: all 16 sign patterns
    assert abs(second.p - exact) < 4 * np.sqrt(exact * (1 - exact) / paired.N_FLIPS) + 2e-4
    labels = ", ".join(f"L{la}H{h}" for la, h in sorted(heads))
    assert result.interventions[0] == "none"
    assert result.interventions[1] == f"2 heads mean-ablated ({labels})"
    assert set(table[table.pairing == "aggregate"].table) >= {"repeat_loss", "head_scores"}
    assert compare(ablated, control).interventions[0] == result.interventions[1]


def test_compare_on_the_command_line(three_runs, capsys):
    root, (clean, ablated, _), _ = three_runs
    status, out, _ = tiny.cli(capsys, "compare", clean.id, ablated.id, "--out", str(root))
    assert status == 0
    text = "\n".join(out)
    assert f"B          {ablated.id}  interventions: 2 heads mean-ablated" in text
    assert "table repeat_loss_by_prompt (same prompts, 3 rows)" in text
    assert "2000 resamples, seed 0" in text and "config     the same" in text


def test_old_runs_compare_on_what_they_have(three_runs, tmp_path):
    """A run stored before the per-prompt tables: the aggregates still compare, and the
    notes say which per-prompt tables it lacks."""
    import json
    import shutil

    _, (clean, ablated, _), _ = three_runs
    store = tmp_path / "runs"
    store.mkdir()
    old = store / clean.id
    shutil.copytree(clean.path, old)
    meta = json.loads((old / "run.json").read_text())
    for name in ("repeat_loss_by_prompt", "icl_by_prompt", "loss_by_prompt"):
        (old / meta["tables"].pop(name)["file"]).unlink()
    (old / "run.json").write_text(json.dumps(meta))
    shutil.copytree(ablated.path, store / ablated.id)
    result = compare(RunStore(store).get(clean.id), RunStore(store).get(ablated.id))
    assert any("run A" in n and "repeat_loss_by_prompt" in n for n in result.notes)
    assert "repeat_loss_by_prompt" not in set(result.differences.table)
    assert "repeat_loss" in set(result.differences.table)


@pytest.mark.parametrize("change, message", [
    ("experiment", "cannot compare {a} and {b}: they differ in experiment (induction-heads vs "
                   "head-overview)"),
    ("unknown", "no run 'no-such-run'"),
])
def test_refusals_are_one_line(three_runs, capsys, llama_folder, change, message):
    root, (clean, *_), _ = three_runs
    if change == "experiment":
        other = tiny.cli(capsys, "run", "head-overview", "--model", str(llama_folder),
                         "--out", str(root), "--set", "n_boot=20")[1][-1]
        other_id = RunStore(root).get(other).id
    else:
        other_id = "no-such-run"
    status, out, err = tiny.cli(capsys, "compare", clean.id, other_id, "--out", str(root))
    assert status == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message.format(a=clean.id, b=other_id) in lines[0]


def test_differences_frame_has_the_declared_columns(three_runs):
    _, (clean, ablated, _), _ = three_runs
    frame = compare(clean, ablated, only="icl_by_prompt").differences
    assert list(frame.columns) == ["table", "key", "column", "a", "b", "difference", "ci_low",
                                   "ci_high", "p", "n_prompts", "pairing"]
    assert set(frame.key) == {"metric=icl_score", "metric=icl_score_window"}
    assert isinstance(frame, pd.DataFrame)


@pytest.mark.parametrize("experiment, table", [
    ("logit-lens", "lens"), ("logit-lens", "direct_per_prompt"), ("ioi", "prompts"),
    ("attention-sinks", "sink_per_prompt")])
def test_per_prompt_tables_without_digests_pair_by_index_under_equal_configs(
        llama, tmp_path, experiment, table):
    from workbench.harness.experiment import run_experiment

    clean = run_experiment(experiment, llama, CONFIGS[experiment], runs_dir=tmp_path)
    masked = run_experiment(experiment, llama, CONFIGS[experiment], runs_dir=tmp_path,
                            heads_mask=HeadMask.for_model(llama).without([(0, 1)]))
    itself = compare(clean, clean, only=table).differences
    assert (itself.pairing == "same prompts").all() and (itself.p.dropna() == 1).all()
    assert (itself.difference.dropna() == 0).all()
    result = compare(clean, masked, only=table)
    assert (result.differences.pairing == "same prompts").all()
    assert any("paired by index" in note for note in result.notes)
    other = run_experiment(experiment, llama, {**CONFIGS[experiment], "seed": 1},
                           runs_dir=tmp_path)
    # another config: the prompts may differ, so nothing is paired by index
    assert (compare(clean, other, only=table).differences.pairing == "different prompts").all()


def _stored(store, losses: np.ndarray, *, info=None, digests=None, mask=None):
    """An induction-heads run holding only ``repeat_loss_by_prompt`` (``[prompt, repeat]``
    losses), on the fake model ``info``, with a head mask's interventions."""
    from experiments.induction_heads.tables import REPEAT_LOSS_BY_PROMPT
    from tests.tiny import fake_info

    n, repeats = losses.shape
    digests = digests or [f"{i:016x}" for i in range(n)]
    table = pd.DataFrame({"prompt": np.repeat(np.arange(n), repeats),
                          "tokens": np.repeat(digests, repeats),
                          "repeat": np.tile(np.arange(1, repeats + 1), n),
                          "loss": losses.reshape(-1)})
    extra = {"interventions": {"heads_mask": mask.to_json()}} if mask else None
    with store.start("induction-heads", info or fake_info(), {"n_prompts": n},
                     tables={"repeat_loss_by_prompt": REPEAT_LOSS_BY_PROMPT},
                     extra=extra) as run:
        run.save_table("repeat_loss_by_prompt", table)
    return store.get(run.id)


def test_a_known_shift_is_found_and_its_interval_excludes_zero(tmp_path):
    """B's second-repeat loss is A's plus 1 (and noise) on every prompt: the interval is
    near [1 - noise, 1 + noise], far from 0, and p is the smallest 16 prompts allow."""
    store = RunStore(tmp_path)
    rng = np.random.default_rng(0)
    clean = rng.normal(3.0, 1.0, size=(16, 2))
    shifted = clean + np.array([0.0, 1.0]) + rng.normal(0, 0.05, size=(16, 2))
    a = _stored(store, clean)
    b = _stored(store, shifted, mask=HeadMask.ones(2, 4).without([(1, 3)]))
    result = compare(a, b)
    rows = result.differences.set_index("key")
    second = rows.loc["repeat=2"]
    assert 0.9 < second.ci_low < 1 < second.ci_high < 1.1
    assert second.p == pytest.approx(1 / (1 + paired.N_FLIPS), abs=3e-4)  # 2 / 2^16 exact
    assert rows.loc["repeat=1"].ci_low < 0 < rows.loc["repeat=1"].ci_high
    assert result.interventions == ("none", "1 head zero-ablated (L1H3)")
    assert any("no per-prompt tables" in n for n in result.notes)  # the others are missing
    # other prompts (other digests): unpaired, no p-value, the same point difference
    c = _stored(store, shifted, digests=[f"{i:016x}" for i in range(100, 116)])
    other = compare(a, c).differences.set_index("key").loc["repeat=2"]
    assert other.pairing == "different prompts" and np.isnan(other.p)
    assert other.difference == pytest.approx(second.difference)


def test_runs_on_other_weights_are_refused(tmp_path):
    from tests.tiny import fake_info
    from workbench.core.errors import WorkbenchError
    from workbench.harness.compare import check_comparable

    store = RunStore(tmp_path)
    losses = np.ones((3, 2))
    a = _stored(store, losses)
    b = _stored(store, losses, info=fake_info(checksum="def"))
    c = _stored(store, losses, info=fake_info(name="other"))
    with pytest.raises(WorkbenchError, match=r"differ in model weights \(sha256 abc vs def\)"):
        check_comparable(a, b)
    with pytest.raises(WorkbenchError, match=r"differ in model \(tiny vs other\)"):
        compare(a, c)


def test_induction_distance_stores_and_pairs_its_losses_per_prompt(llama, tmp_path):
    from workbench.harness.experiment import run_experiment

    config = CONFIGS["induction-distance"]
    clean = run_experiment("induction-distance", llama, config, runs_dir=tmp_path)
    by_prompt = clean.table("distance_losses_by_prompt")
    means = by_prompt.groupby("distance")[["first_loss", "second_loss", "drop"]].mean()
    stored = clean.table("distance_losses").set_index("distance")
    np.testing.assert_allclose(means.to_numpy(), stored.loc[means.index, means.columns]
                               .to_numpy(), rtol=1e-6)
    masked = run_experiment("induction-distance", llama, config, runs_dir=tmp_path,
                            heads_mask=HeadMask.for_model(llama).without([(0, 1)]))
    itself = compare(clean, clean, only="distance_losses_by_prompt").differences
    assert (itself.difference == 0).all() and (itself.p == 1).all()
    rows = compare(clean, masked, only="distance_losses_by_prompt").differences
    assert (rows.pairing == "same prompts").all()
    assert set(rows.key) == {f"distance={d}" for d in by_prompt.distance.unique()}
    # the head scores: each prompt's, averaged, are the stored ones; paired in compare
    scores = clean.table("distance_scores_by_prompt")
    keys = ["distance", "layer", "head"]
    means = scores.groupby(keys).score.mean()
    stored = clean.table("distance_scores").set_index(keys).score
    np.testing.assert_allclose(means.to_numpy(), stored.loc[means.index].to_numpy(),
                               rtol=1e-6)
    assert (scores.groupby(keys).size() == config["n_prompts"]).all()
    itself = compare(clean, clean, only="distance_scores_by_prompt").differences
    assert (itself.difference == 0).all() and (itself.p == 1).all()
    rows = compare(clean, masked, only="distance_scores_by_prompt").differences
    assert (rows.pairing == "same prompts").all() and len(rows) == len(means)
    # the mask acts on layer 0's output: layer 0's patterns, and so its scores, stay put
    layer0 = rows[rows.key.str.contains(" layer=0 ")]
    assert len(layer0) and (layer0.difference == 0).all()
    assert (rows[rows.key.str.contains(" layer=1 ")].difference.abs() > 0).any()


def test_permutation_equivariance_pairs_its_errors_by_prompt(llama, tmp_path):
    from workbench.harness.experiment import run_experiment

    small = {"n_prompts": 3, "max_tokens": 8, "layers": (1,), "view_prompts": 0,
             "shifts": (10,)}
    a = run_experiment("permutation-equivariance", llama, {**small, "seeds": (0,)},
                       runs_dir=tmp_path)
    b = run_experiment("permutation-equivariance", llama, {**small, "seeds": (1, 2)},
                       runs_dir=tmp_path)
    itself = compare(a, a, only="equivariance_by_prompt").differences
    assert (itself.pairing == "same prompts").all() and (itself.difference == 0).all()
    # other permutations of the same prompts: paired, and the permutation-dependent
    # errors (a causal mask without positions) differ
    rows = compare(a, b, only="equivariance_by_prompt").differences
    assert (rows.pairing == "same prompts").all() and rows.p.notna().all()
    assert set(rows.column) == {"max_rel_error", "min_rel_error"}
    causal = rows[rows.key == "component=attention sublayer "
                              "condition=no positions, causal mask layer=1 shift=0"]
    assert len(causal) == 2 and (causal.n_prompts == 3).all()
    assert (causal.difference.abs() > 0).all()
    # a shift draws no permutation: the same prompts give the same error
    shifted = rows[rows.key.str.contains("shift=10")]
    assert len(shifted) and (shifted.difference == 0).all()
    cut = run_experiment("permutation-equivariance", llama,
                         {**small, "seeds": (0,), "max_tokens": 6}, runs_dir=tmp_path)
    other = compare(a, cut, only="equivariance_by_prompt").differences
    assert (other.pairing == "different prompts").all() and other.p.isna().all()


# ---- the notes: what could not be compared, on hand-made runs -------------------------

_REPEAT = columns(("repeat", "int", "which repeat, from 1"))
NOTES_TABLES = {t.name: t for t in (
    per_prompt("loss_by_prompt", "a loss per prompt and repeat", _REPEAT,
               columns(("loss", "float", "loss"))),
    per_prompt("icl_by_prompt", "a score per prompt", (), columns(("value", "float", "score"))),
    Table("prompts", "a per-prompt table stored without token digests",
          columns(("prompt", "int", "prompt"), ("value", "float", "value")), keys=("prompt",)),
    Table("loss", "the mean loss per repeat", (*_REPEAT, *columns(("loss", "float", "loss"))),
          keys=("repeat",)),
    Table("loose", "rows with no declared keys", columns(("name", "str", "a name"),
                                                         ("value", "float", "value"))),
)}
"""The tables of the hand-made experiment ``notes-test``; ``notes-aggregates`` declares
``loss`` alone, and ``extra`` is saved by a run without being declared by either."""
EXTRA = Table("extra", "a table its experiment does not declare",
              columns(("name", "str", "a name"), ("value", "float", "value")), keys=("name",))


@pytest.fixture
def notes_kinds(monkeypatch):
    """The hand-made experiments' declarations, as the compare reads them."""
    from workbench.harness import tables

    declared = tables.declared
    kinds = {"notes-test": NOTES_TABLES, "notes-aggregates": {"loss": NOTES_TABLES["loss"]}}
    monkeypatch.setattr(tables, "declared", lambda kind: kinds.get(kind) or declared(kind))


def _hand_made(store, kind: str, frames: dict[str, pd.DataFrame], config=None):
    from tests.tiny import fake_info

    with store.start(kind, fake_info(), config or {"seed": 0},
                     tables={**NOTES_TABLES, "extra": EXTRA}) as run:
        for name, frame in frames.items():
            run.save_table(name, frame)
    return store.get(run.id)


def _losses(repeats: int, n: int = 4, first_digest: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"prompt": np.repeat(np.arange(n), repeats),
                         "tokens": np.repeat([f"{first_digest + i:016x}" for i in range(n)],
                                             repeats),
                         "repeat": np.tile(np.arange(1, repeats + 1), n),
                         "loss": np.arange(n * repeats, dtype=float)})


def _values(**more) -> pd.DataFrame:
    return pd.DataFrame({"prompt": np.arange(4), **more, "value": np.linspace(0, 1, 4)})


def test_each_note_says_what_could_not_be_compared(tmp_path, notes_kinds):
    """A per-prompt table one run lacks, keys and rows without partner, a per-prompt table
    without token digests, an aggregate without keys, a table the experiment does not
    declare: each note in its words, in the order the tables are compared."""
    store = RunStore(tmp_path)
    loose = pd.DataFrame({"name": ["x", "x"], "value": [1.0, 2.0]})
    extra = pd.DataFrame({"name": ["x"], "value": [1.0]})
    a = _hand_made(store, "notes-test", {
        "loss_by_prompt": _losses(2), "prompts": _values(),
        "loss": pd.DataFrame({"repeat": [1, 2], "loss": [1.0, 2.0]}), "loose": loose,
        "extra": extra})
    b = _hand_made(store, "notes-test", {
        "loss_by_prompt": _losses(3), "icl_by_prompt": _values(tokens=[f"{i:016x}" for i in
                                                                     range(4)]),
        "prompts": _values(), "loss": pd.DataFrame({"repeat": [1, 2, 3],
                                                    "loss": [1.0, 2.0, 3.0]}),
        "loose": loose, "extra": extra})
    assert compare(a, b).notes == (
        f"run A ({a.id}) has no per-prompt tables icl_by_prompt (stored before per-prompt "
        "values, or a config that writes none): those scalars compare as aggregates, "
        "without intervals",
        "table loss_by_prompt: 0 keys of A and 1 of B have no partner",
        "table icl_by_prompt: only in run B",
        "table prompts stores no token digests: its prompts are paired by index (the two "
        "configs are equal, so the prompts are the same)",
        "table loss: 0 rows of A and 1 of B have no partner (their keys differ)",
        "table loose: its rows are not named by name; not compared",
        "table extra: not declared by notes-test; not compared",
    )


def test_notes_on_other_prompts_and_on_an_experiment_of_aggregates(tmp_path, notes_kinds):
    """Other token digests, or no digests under other configs: unpaired; an experiment
    that declares no per-prompt table: one note says so."""
    store = RunStore(tmp_path)
    tables = {"icl_by_prompt": _values(tokens=[f"{i:016x}" for i in range(4)]),
              "prompts": _values()}
    a = _hand_made(store, "notes-test", {"loss_by_prompt": _losses(2), **tables})
    other = _hand_made(store, "notes-test", {"loss_by_prompt": _losses(2, first_digest=100),
                                             **tables}, config={"seed": 1})
    assert compare(a, other).notes == (
        "table loss_by_prompt: the runs scored different prompts, so its differences are "
        "unpaired (intervals from each run's prompts alone, no p-values)",
        # icl_by_prompt's digests agree, so it pairs; prompts has none, and the configs
        # differ
        "table prompts: the runs scored different prompts, so its differences are "
        "unpaired (intervals from each run's prompts alone, no p-values)",
    )
    means = {"loss": pd.DataFrame({"repeat": [1], "loss": [1.0]})}
    c, d = (_hand_made(store, "notes-aggregates", means) for _ in range(2))
    assert compare(c, d).notes == (
        "notes-aggregates stores no per-prompt values: its differences are of aggregates, "
        "without intervals or p-values",)
