"""Training small native models: corpus, tokenizer, reproducible training, checkpoints that
reload bit for bit, the phase-change detector on curves with a known answer, and a tiny
end-to-end run of the induction-formation experiment."""

from __future__ import annotations

import json
import math
import tempfile

import numpy as np
import pytest
import torch

from experiments.induction_formation.tables import CURVE_BY_PROMPT, PHASE_CHANGE, TABLES
from tests import tiny
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.harness.compare import compare
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import get, run_experiment
from workbench.harness.sweeps.spec import expand, parse_spec
from workbench.models import checkpoints, native
from workbench.models.load import load_model
from workbench.scores import phase_change
from workbench.store.runs import RunStore
from workbench.training import data as training_data
from workbench.training import loop

TEXT = [
    "The function returns the number of items in the container. If the container is empty, "
    "the function returns zero.",
    "A module is a file containing Python definitions and statements. The file name is the "
    "module name with the suffix .py appended.",
    "Return a new sorted list from the items in iterable. The key argument specifies a "
    "function of one argument that is used to extract a comparison key.",
] * 6


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models train faster on one thread, and do not fight other tests for cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return training_data.train_tokenizer(TEXT, 320, tmp_path_factory.mktemp("tok"))


def tiny_spec(tokenizer, n_layers=2, **over):
    return native.ModelSpec(**{"n_layers": n_layers, "d_model": 16, "n_heads": 2,
                                 "n_ctx": 32, "d_vocab": len(tokenizer), "seed": 3, **over})


def train_tiny(tokenizer, spec, steps=6, on_checkpoint=None, checkpoint_steps=()):
    bridge = native.build_bridge(spec, tokenizer)
    stream = training_data.token_stream(tokenizer, TEXT)
    data = training_data.batches(stream, 4, spec.n_ctx, bos_id=tokenizer.bos_token_id, seed=1)
    losses = loop.train(bridge, data, loop.TrainSpec(steps=steps, warmup_steps=2),
                            checkpoint_steps=checkpoint_steps, on_checkpoint=on_checkpoint)
    return bridge, losses


# ---- corpus and tokenizer ---------------------------------------------------------------------

def test_tokenizer_training_is_deterministic_and_round_trips(tokenizer, tmp_path):
    again = training_data.train_tokenizer(TEXT, 320, tmp_path / "again")
    assert again.get_vocab() == tokenizer.get_vocab()
    assert len(tokenizer) <= 320 and tokenizer.name_or_path
    assert tokenizer.bos_token == tokenizer.eos_token == training_data.BOS
    assert tokenizer.pad_token == training_data.PAD
    text = "Return a new sorted list, ünïcode and all."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text  # byte-level: nothing is ever unknown
    assert len(ids) < len(text.encode())  # merges were learned


def test_corpus_from_text_files_splits_by_document_hash(tmp_path):
    files = []
    for i in range(10):
        path = tmp_path / f"doc{i}.txt"
        path.write_text("\n\n  \n".join(f"Paragraph {j} of file {i} says something about "
                                          f"item {i * 7 + j}." for j in range(3)))
        files.append(path)
    corpus = training_data.build_corpus((), files, heldout_every=5)
    assert len(corpus.fit) + len(corpus.heldout) == 30 and corpus.heldout
    assert not set(corpus.fit) & set(corpus.heldout)
    again = training_data.build_corpus((), list(reversed(files)), heldout_every=5)
    assert set(again.heldout) == set(corpus.heldout)  # membership depends on the text only
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(WorkbenchError, match=r"empty\.txt is empty"):
        training_data.build_corpus((), [tmp_path / "empty.txt"])
    with pytest.raises(WorkbenchError, match="unknown corpus source 'poems'"):
        training_data.build_corpus(("poems",))


def test_stdlib_docstrings_are_read_without_importing(tmp_path):
    (tmp_path / "mod.py").write_text(
        '"""A module docstring that is long enough to keep, by all means."""\n'
        'raise SystemExit("importing this module would fail")\n'
        'def f():\n    """short"""\n'
        'class C:\n    """A class docstring, also long enough to be kept in the corpus."""\n')
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "t.py").write_text('"""A test module docstring that is skipped '
                                            'because tests are not documentation."""\n')
    docs = training_data.stdlib_docstrings(tmp_path)
    assert docs == ["A module docstring that is long enough to keep, by all means.",
                    "A class docstring, also long enough to be kept in the corpus."]


def test_windows_start_with_bos_and_follow_the_seed(tokenizer):
    stream = training_data.token_stream(tokenizer, TEXT)
    a = next(training_data.batches(stream, 3, 16, bos_id=0, seed=5))
    b = next(training_data.batches(stream, 3, 16, bos_id=0, seed=5))
    assert a.shape == (3, 16) and (a[:, 0] == 0).all() and torch.equal(a, b)
    torch.manual_seed(123)  # the global RNG plays no part
    assert torch.equal(next(training_data.batches(stream, 3, 16, bos_id=0, seed=5)), a)


def test_repeated_passages_copy_one_span_and_leave_the_rest():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        window = torch.arange(100, 227)  # distinct tokens, so the copy is easy to find
        out = training_data.repeat_passage(window, gen)
        changed = (out != window).nonzero().flatten()
        k = len(changed)
        assert training_data.MIN_PASSAGE <= k <= len(window) // 2
        assert torch.equal(changed, torch.arange(changed[0], changed[0] + k))  # one block
        source = int(out[changed[0]]) - 100  # where the copied tokens came from
        assert source + k <= int(changed[0])  # from earlier, not overlapping
        assert torch.equal(out[changed], window[source: source + k])
    stream = torch.arange(5000)
    plain = training_data.sample_windows(stream, 8, 64, bos_id=0,
                                         generator=torch.Generator().manual_seed(1))
    mixed = training_data.sample_windows(stream, 8, 64, bos_id=0, repeat_fraction=1.0,
                                         generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain[:, :1], mixed[:, :1])
    assert all(len(set(row.tolist())) < 64 for row in mixed)  # every window repeats itself
    assert all(len(set(row.tolist())) == 64 for row in plain)


# ---- training and checkpoints -----------------------------------------------------------------

def test_training_is_reproducible_and_lowers_the_loss(tokenizer):
    _, first = train_tiny(tokenizer, tiny_spec(tokenizer), steps=30)
    _, second = train_tiny(tokenizer, tiny_spec(tokenizer), steps=30)
    assert first == second
    assert np.mean(first[-5:]) < np.mean(first[:5]) - 0.2


@pytest.mark.parametrize("spec_over", [{}, {"positions": "rotary"},
                                       {"attn_only": False, "d_mlp": 32, "n_layers": 1}])
def test_checkpoints_reload_bit_identically(tokenizer, tmp_path, spec_over):
    spec = tiny_spec(tokenizer, **spec_over)
    (tmp_path / "tokenizer").mkdir()
    tokenizer.save_pretrained(str(tmp_path / "tokenizer"))
    kept = {}

    def save(step, loss):
        checkpoints.save(tmp_path, bridge_ref[0], spec, step=step, tokens=step * 128)
        kept[step] = {k: v.clone() for k, v in bridge_ref[0].state_dict().items()}

    bridge_ref = [None]
    bridge_ref[0] = native.build_bridge(spec, tokenizer)
    stream = training_data.token_stream(tokenizer, TEXT)
    data = training_data.batches(stream, 4, spec.n_ctx, bos_id=0, seed=1)
    loop.train(bridge_ref[0], data, loop.TrainSpec(steps=4, warmup_steps=1),
                   checkpoint_steps={0, 4}, on_checkpoint=save)
    ids = next(training_data.batches(stream, 2, spec.n_ctx, bos_id=0, seed=9))
    for step in (0, 4):
        model = checkpoints.load_folder(checkpoints.step_dir(tmp_path, spec.n_layers, step))
        loaded = model.bridge.state_dict()
        assert loaded.keys() == kept[step].keys()
        assert all(torch.equal(loaded[k], kept[step][k]) for k in loaded)
        assert model.info.n_layers == spec.n_layers and model.info.causal
    with torch.no_grad():
        assert torch.equal(model.bridge(ids), bridge_ref[0](ids))
    assert not torch.equal(kept[0]["embed.weight"], kept[4]["embed.weight"])


def _saved_run(tmp_path, tokenizer, layers=(1, 2), steps=(0, 3)):
    store = RunStore(tmp_path / "runs")
    with store.start("induction-formation", None, {"seed": 0}) as run:
        tokenizer.save_pretrained(str(run.dir / "tokenizer"))
        for n in layers:
            spec = tiny_spec(tokenizer, n_layers=n)
            bridge = native.build_bridge(spec, tokenizer)
            for step in steps:
                checkpoints.save(run.dir, bridge, spec, step=step, tokens=step)
    return store.get(run.final)


def test_checkpoint_names_load_anywhere_a_model_is_accepted(tokenizer, tmp_path, monkeypatch):
    run = _saved_run(tmp_path, tokenizer)
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", str(tmp_path / "runs"))
    model = load_model(f"{run.id}/L2:3")
    assert model.info.name == f"{run.id}/L2:3" and model.info.n_layers == 2
    assert model.info.checksum and "step 3" in model.info.source
    assert load_model(f"{run.id[:-2]}/L1:0").info.n_layers == 1  # a unique prefix will do
    with pytest.raises(WorkbenchError, match=f"name one: {run.id}/L1:0, {run.id}/L2:0"):
        load_model(f"{run.id}:0")
    with pytest.raises(WorkbenchError, match="has no model 'L3'; it has L1, L2"):
        load_model(f"{run.id}/L3:0")
    with pytest.raises(WorkbenchError, match="no checkpoint at step 2 for L2; steps: 0, 3"):
        load_model(f"{run.id}/L2:2")
    single = _saved_run(tmp_path, tokenizer, layers=(2,))
    assert load_model(f"{single.id}:3").info.n_layers == 2


def test_a_damaged_checkpoint_is_a_clear_error(tokenizer, tmp_path):
    run = _saved_run(tmp_path, tokenizer, layers=(1,), steps=(0,))
    folder = checkpoints.step_dir(run.path, 1, 0)
    weights = folder / checkpoints.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-7] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"model\.safetensors does not match the SHA-256"):
        checkpoints.load_folder(folder)
    (run.path / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(ChecksumError, match=r"tokenizer\.json is missing"):
        checkpoints.verify(folder)
    with pytest.raises(WorkbenchError, match="not a readable checkpoint"):
        checkpoints.load_folder(tmp_path)


# ---- the phase-change detector on curves with a known answer ---------------------------------

STEPS = list(range(0, 2001, 50))


def sigmoid(steps, centre, width, low=0.02, high=0.7):
    s = np.asarray(steps, dtype=float)
    return low + (high - low) / (1 + np.exp(-(s - centre) / width))


def test_rise_window_brackets_the_steepest_rise():
    values = sigmoid(STEPS, centre=800, width=60)
    window = phase_change.rise_window(STEPS, values, min_rise=0.3)
    # 20% and 80% of the rise are crossed at centre -/+ width * ln 4 = 717 and 883
    assert (window.start_step, window.end_step) == (700, 900)
    assert window.mid_step in (800, 850)  # the steepest interval is 750-800 or 800-850
    assert window.base == pytest.approx(values[0]) and window.peak == pytest.approx(values[-1])
    assert window.widened(1, STEPS) == (650, 950) and window.contains(950, 1, STEPS)


def test_rise_window_finds_nothing_in_a_flat_or_noisy_curve():
    rng = np.random.default_rng(0)
    flat = 0.03 + 0.02 * rng.random(len(STEPS))
    assert phase_change.rise_window(STEPS, flat, min_rise=0.3) is None
    slow = sigmoid(STEPS, 800, 60, high=0.2)  # a real but small rise
    assert phase_change.rise_window(STEPS, slow, min_rise=0.3) is None
    assert phase_change.rise_window(STEPS, slow, min_rise=0.1) is not None


def test_rise_window_ignores_a_later_decline():
    values = sigmoid(STEPS, 500, 40)
    values[-10:] -= 0.2  # the score fades after forming: the window is still the rise
    window = phase_change.rise_window(STEPS, values, min_rise=0.3)
    assert 400 <= window.start_step < 500 < window.end_step <= 600


def test_fastest_drop_and_descent_rates_on_a_power_law():
    tokens = [s * 4096 for s in STEPS]
    t = np.maximum(np.asarray(tokens, dtype=float), 1.0)
    smooth = 3.0 + 40 * t ** -0.3
    assert phase_change.fastest_drop(STEPS, -sigmoid(STEPS, 1200, 30))[:2] in (
        (1150, 1200), (1200, 1250))
    rates = phase_change.descent_rates(tokens, smooth)
    assert math.isnan(rates[0]) and np.all(np.diff(rates[1:]) < 0)  # power law: slowing


# ---- detection on both kinds of held-out text, and the coincidence check -------------------

def synthetic_curve(natural_bump: bool, seed: int = 0):
    """A 2-layer curve on the demo's grid: induction rises at steps 325-425; on the
    repeated-passage windows the ICL score falls and the loss steps down there; on plain
    text the ICL score falls in warm-up (steps 50-75) and the loss is smooth unless
    ``natural_bump`` plants a pause of 0.1 nats (20 noise SDs) at step 375."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    steps = np.arange(0, 1001, 25)
    tokens = steps * 4096
    smooth = 2.0 + 40 * np.maximum(tokens, 1.0) ** -0.3
    noise = 0.005

    def loss(extra):
        return smooth + extra + noise * rng.standard_normal(len(steps))

    shift = -0.5 / (1 + np.exp(-(steps - 375) / 15.0))
    pause = 0.1 * np.exp(-0.5 * ((steps - 375) / 25.0) ** 2) if natural_bump else 0.0
    natural_icl = np.where(steps >= 75, -0.2, 0.0) + 0.005 * rng.standard_normal(len(steps))
    return pd.DataFrame({
        "step": steps, "tokens": tokens, "n_layers": 2,
        "max_induction": 0.02 + 0.5 / (1 + np.exp(-(steps - 375) / 20.0)),
        "first_repeat_loss": 14.0, "second_repeat_loss": 12.0,
        "heldout_loss": loss(shift), "icl_score": -0.6 / (1 + np.exp(-(steps - 365) / 5.0)),
        "natural_heldout_loss": loss(pause), "natural_icl_score": natural_icl,
    })


class _Run:
    id = "run-under-test"

    def __init__(self, phase):
        self.phase = phase

    def table(self, name):
        assert name == "phase_change"
        return self.phase


def _detected(curve, **over):
    import pandas as pd

    from experiments.induction_formation.measure import _typed, detect

    cfg = get("induction-formation").config(**over)
    phase = _typed(pd.DataFrame([{"model": "L2", "n_layers": 2, **detect(curve, cfg)}]),
                   PHASE_CHANGE)
    PHASE_CHANGE.check(phase)  # what the run store would refuse
    return phase


def test_detect_reads_both_kinds_of_text_and_the_check_judges_the_plain_one():
    from experiments.induction_formation.checks import bump_and_icl_jump_coincide

    phase = _detected(synthetic_curve(natural_bump=False))
    r = phase.iloc[0]
    assert r.detected and (r.start_step, r.end_step) == (325, 425)
    assert r.icl_jump_in_window and r.loss_bump_tested and r.loss_bump and r.coincide
    assert r.loss_bump_shift < 0  # the descent sped up across the window
    assert (r.natural_icl_jump_start, r.natural_icl_jump_end) == (50, 75)
    assert r.natural_loss_bump_tested and not r.natural_loss_bump
    assert not r.natural_icl_jump_in_window and not r.natural_coincide
    m = bump_and_icl_jump_coincide(_Run(phase), n_layers=2)
    assert m.outcome == "fail"  # coincidence on repeated passages only does not count
    assert "plain text (the verdict)" in m.measured and "repeated-passage" in m.measured
    bumped = _detected(synthetic_curve(natural_bump=True)).iloc[0]
    assert bumped.natural_loss_bump and 350 <= bumped.natural_loss_bump_step <= 400
    assert bumped.natural_loss_bump_excess > 0  # above the smooth fit: a pause


def test_the_coincidence_is_undecided_when_the_plain_text_cannot_be_tested():
    from experiments.induction_formation.checks import bump_and_icl_jump_coincide

    curve = synthetic_curve(natural_bump=False)
    late = curve.assign(max_induction=0.02 + 0.5 / (1 + np.exp(-(curve.step - 900) / 20.0)))
    phase = _detected(late)  # a window near the end: too few checkpoints after it
    assert phase.detected.iloc[0] and not phase.natural_loss_bump_tested.iloc[0]
    assert phase.natural_coincide.isna().all() and phase.natural_loss_bump.isna().all()
    assert bump_and_icl_jump_coincide(_Run(phase), n_layers=2).outcome == "undecided"
    none = _detected(curve.assign(max_induction=0.02))
    assert not none.detected.iloc[0]
    assert bump_and_icl_jump_coincide(_Run(none), n_layers=2).outcome == "undecided"
    passing = phase.assign(natural_coincide=True, natural_loss_bump_tested=True,
                           natural_loss_bump=True, natural_loss_bump_z=9.0,
                           natural_loss_bump_step=900.0)
    assert bump_and_icl_jump_coincide(_Run(passing), n_layers=2).outcome == "pass"


# ---- the experiment end to end, tiny ---------------------------------------------------------

def tiny_overrides(tmp_path, **over):
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(f"{i}: {t}" for i, t in enumerate(TEXT * 3)))
    return {"sources": (), "text_files": (str(text),), "vocab_size": 320, "d_model": 16,
            "n_heads": 2, "n_ctx": 48, "steps": 6, "checkpoint_every": 3,
            "batch_size": 4, "warmup_steps": 2, "heldout_windows": 4, "icl_early": 5,
            "icl_band": 2, "icl_late": 44, "n_repeat_prompts": 3, "repeat_len": 10,
            "pattern_len": 6, "n_boot": 20, **over}


def test_tiny_run_end_to_end(tmp_path, runs_dir, monkeypatch):
    run = run_experiment("induction-formation", None, tiny_overrides(tmp_path))
    assert run.status == "complete" and run.meta.model is None
    curve = run.table("training_curve")
    assert sorted(set(curve.step)) == [0, 3, 6] and set(curve.model) == {"L1", "L2"}
    assert curve.tokens.max() == 6 * 4 * 48
    assert curve.train_loss.isna().sum() == 2  # step 0 has trained on nothing yet
    scores = run.table("head_scores")
    assert {"step", "layer", "head", "metric", "score", "null"} <= set(scores.columns)
    assert len(scores) == 3 * 2 * (1 + 2) * 2  # steps x metrics x layers x heads
    by_prompt = run.table("head_scores_by_prompt")
    assert len(by_prompt) == len(scores) * 3 and set(by_prompt.prompt) == {0, 1, 2}
    keys = ["model", "step", "layer", "head", "metric"]
    means = by_prompt.groupby(keys).score.mean()
    stored = scores.set_index(keys).score.loc[means.index]
    np.testing.assert_allclose(means.to_numpy(), stored.to_numpy(), rtol=1e-6, atol=1e-9)
    # the probes are the same at every checkpoint: one digest per prompt
    assert by_prompt.groupby("prompt").tokens.nunique().eq(1).all()
    again = compare(run, run, only="head_scores_by_prompt").differences
    assert (again.pairing == "same prompts").all() and (again.difference == 0).all()
    assert len(again) == len(scores)
    # trained otherwise on the same probes: paired prompt by prompt, and the scores moved
    other = run_experiment("induction-formation", None, tiny_overrides(tmp_path,
                                                                       warmup_steps=1))
    paired = compare(run, other, only="head_scores_by_prompt").differences
    assert (paired.pairing == "same prompts").all() and paired.p.notna().any()
    assert (paired[paired.key.str.contains("step=6")].difference != 0).any()
    # the training curve: each probe's values, averaged, are the stored ones
    curve_by = run.table("training_curve_by_prompt")
    assert set(curve_by.quantity) == set(CURVE_BY_PROMPT)
    sizes = curve_by.groupby(["model", "step", "quantity"]).size()
    assert set(sizes.xs("heldout_loss", level="quantity")) == {4}  # heldout_windows
    assert set(sizes.xs("first_repeat_loss", level="quantity")) == {3}  # n_repeat_prompts
    means = curve_by.pivot_table(index=["model", "step"], columns="quantity", values="value",
                                 aggfunc="mean")
    stored = curve.set_index(["model", "step"]).loc[means.index, list(means.columns)]
    np.testing.assert_allclose(means.to_numpy(), stored.to_numpy(), rtol=1e-5, atol=1e-6)
    curve_pairs = compare(run, other, only="training_curve_by_prompt").differences
    assert (curve_pairs.pairing == "same prompts").all() and curve_pairs.p.notna().all()
    assert len(curve_pairs) == len(means) * len(CURVE_BY_PROMPT)
    moved = curve_pairs[curve_pairs.key.str.contains("step=6")]
    assert (moved.difference != 0).any()
    itself = compare(run, run, only="training_curve_by_prompt").differences
    assert (itself.difference == 0).all()
    phase = run.table("phase_change")
    assert set(phase.model) == {"L1", "L2"} and list(phase.columns) == PHASE_CHANGE.names
    patterns = run.table("checkpoint_patterns")
    n_tokens = len(run.table("pattern_tokens"))
    one = patterns[(patterns.model == "L2") & (patterns.step == 6) & (patterns.layer == 1)
                   & (patterns["head"] == 0)]
    assert len(one) == n_tokens * (n_tokens + 1) // 2
    assert np.allclose(one.groupby("query").weight.sum(), 1, atol=1e-5)
    table = run.table("checkpoints")
    comp = run.table("composition")
    assert len(table) == 6 and len(comp) == 2
    comp_by = run.table("composition_by_prompt")
    assert len(comp_by) == len(comp) * 3  # n_repeat_prompts
    comp_means = comp_by.groupby("ablated_head").induction_after.mean()
    np.testing.assert_allclose(comp_means, comp.set_index("ablated_head").induction_after
                               .loc[comp_means.index], rtol=1e-6, atol=1e-9)
    comp_pairs = compare(run, other, only="composition_by_prompt").differences
    assert len(comp_pairs) and (comp_pairs.pairing == "same prompts").all()
    model = load_model(table.name.iloc[-1])
    assert model.info.name == f"{run.id}/L2:6"
    from workbench.harness.claims import CHECKS

    measured = CHECKS.get("formation_no_induction")(run, n_layers=1)
    assert "L1: max induction" in measured.measured
    # 6 steps, checkpoints every 3: no window, or one with no room for the bump test
    assert CHECKS.get("formation_coincide")(run, n_layers=2).outcome == "undecided"


def test_outside_a_run_store_nothing_is_kept(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    exp = get("induction-formation")
    # one layer and a rise no score can reach: no phase change, no composition
    cfg = apply_overrides(exp.config, tiny_overrides(tmp_path, layers=(1,), steps=3,
                                                     min_rise=1.0))
    result = exp.run(None, cfg)
    tables = result.tables()
    # no composition test, so none of its prompts' values (a per-prompt table is never empty)
    assert tables.keys() == TABLES.keys() - {"composition_by_prompt"}
    for name, df in tables.items():
        TABLES[name].check(df)  # what the run store would refuse
    assert tables["checkpoints"].empty and tables["composition"].empty
    phase = tables["phase_change"]
    assert not phase.detected.any() and phase.start_step.isna().all()
    assert sorted(set(tables["training_curve"].step)) == [0, 3]
    assert list(scratch.iterdir()) == []  # the scratch tokenizer folder is gone


@pytest.mark.parametrize("end", ["interrupted", "failed"])
def test_checkpoints_of_an_unfinished_run_are_not_results(tokenizer, tmp_path, monkeypatch,
                                                           capsys, end):
    """An interrupted (or failed) training run's checkpoints are refused by name and by a
    sweep's glob, with what to do; `workbench clean` lists and removes the interrupted."""
    run = _saved_run(tmp_path, tokenizer, layers=(1,), steps=(0,))
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", str(tmp_path / "runs"))
    meta = json.loads((run.path / "run.json").read_text())
    staged = tmp_path / "runs" / ".incomplete" / run.id
    if end == "interrupted":  # its process died before it finished
        staged.parent.mkdir(exist_ok=True)
        run.path.rename(staged)
        meta.update(status="running", **tiny.ended_writer())
    else:
        meta.update(status="failed", error="RuntimeError: out of memory")
    (staged if end == "interrupted" else run.path).joinpath("run.json").write_text(
        json.dumps(meta))
    with pytest.raises(WorkbenchError, match=f"run {run.id} is {end}: its checkpoints are "
                                             "not results of a finished run"):
        load_model(f"{run.id}:0")
    spec = parse_spec({"experiments": ["previous-token-heads"], "models": [f"{run.id}/L*:*"]})
    with pytest.raises(WorkbenchError, match=f"is {end}: its checkpoints are not results"):
        expand(spec, runs_dir=tmp_path / "runs")
    status, out, _ = tiny.cli(capsys, "clean")
    assert status == 0 and (run.id in "\n".join(out)) == (end == "interrupted")
    if end == "interrupted":
        status, out, _ = tiny.cli(capsys, "clean", "--yes")
        assert status == 0 and not staged.exists() and "removed 1 runs" in out[-1]
