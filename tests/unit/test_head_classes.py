"""Head classes: Benjamini-Hochberg q-values against an independent implementation, the
permutation p-value's definition and calibration, false-discovery control over 200 seeded
draws of synthetic attention patterns with planted heads, the structured null inputs, and
the classes of a tiny model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.harness.experiment import run_experiment
from workbench.inputs import nulls
from workbench.inputs.prompts import Prompt, load_prompt_set
from workbench.recording.reductions import PatternContext, reduce_patterns
from workbench.scores import classes, metrics, patterns
from workbench.scores.heads import score_and_classify, score_heads
from workbench.store.schema import head_classes

# ---- Benjamini-Hochberg -----------------------------------------------------------------


def reference_qvalues(p: np.ndarray) -> np.ndarray:
    """BH q-values from their definition, one test at a time (a different algorithm from
    the library's sorted running minimum): the q of test i is the smallest rate alpha at
    which the step-up procedure rejects it, i.e. the least of ``m p_k / rank_k`` over
    every test k with ``p_k >= p_i``, where ``rank_k = #{j : p_j <= p_k}`` (ties share the
    highest rank, as the step-up procedure treats them)."""
    finite = [float(v) for v in p if np.isfinite(v)]
    m = len(finite)
    out = []
    for v in p:
        if not np.isfinite(v):
            out.append(np.nan)
            continue
        candidates = [m * pk / sum(pj <= pk for pj in finite) for pk in finite if pk >= v]
        out.append(min(1.0, min(candidates)))
    return np.array(out)


def step_up_rejections(p: np.ndarray, alpha: float) -> set[int]:
    """The BH step-up procedure itself: reject the k smallest, k = max{j : p_(j) <= j alpha / m}."""
    finite = [(v, i) for i, v in enumerate(p) if np.isfinite(v)]
    m = len(finite)
    ranked = sorted(finite)
    k = max((j for j in range(1, m + 1) if ranked[j - 1][0] <= j * alpha / m), default=0)
    threshold = ranked[k - 1][0] if k else -1.0
    return {i for v, i in finite if v <= threshold}


@pytest.mark.parametrize("seed", range(6))
def test_q_values_equal_an_independent_benjamini_hochberg(seed):
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.uniform(size=40), rng.uniform(0, 0.01, size=10),
                        np.round(rng.uniform(size=10), 2)])  # ties
    p[rng.integers(0, len(p), 3)] = np.nan  # untested heads stay out of m
    q = classes.bh_qvalues(p)
    np.testing.assert_allclose(q, reference_qvalues(p), rtol=1e-12, equal_nan=True)
    for alpha in (0.01, 0.05, 0.1, 0.25):
        assert set(np.flatnonzero(q <= alpha)) == step_up_rejections(p, alpha)


def test_q_values_of_nothing_and_of_one_test():
    assert classes.bh_qvalues(np.array([])).shape == (0,)
    assert np.isnan(classes.bh_qvalues(np.array([np.nan]))).all()
    assert classes.bh_qvalues(np.array([0.2])).tolist() == [0.2]


# ---- permutation p-values ---------------------------------------------------------------

def test_permutation_p_counts_draws_at_or_above_the_observed_value():
    draws = np.array([[0.1, 5.0], [0.3, 5.0], [0.5, 5.0], [0.7, 5.0]])
    p = classes.permutation_p(np.array([0.3, 1.0]), draws)
    assert p.tolist() == [(1 + 3) / 5, (1 + 4) / 5]
    assert classes.permutation_p(np.array([9.0]), draws[:, :1]).tolist() == [1 / 5]
    assert np.isnan(classes.permutation_p(np.array([np.nan]), draws[:, :1])).all()


def test_sign_flip_p_values_are_uniform_under_the_null_and_small_under_a_shift():
    rng = np.random.default_rng(0)
    d = rng.normal(size=(20, 2000))  # symmetric differences: no head has the structure
    p = classes.permutation_p(classes.paired_mean(d), classes.sign_flip_draws(d, 999, 1))
    for level in (0.01, 0.05, 0.2, 0.5):
        assert abs((p <= level).mean() - level) < 3 * np.sqrt(level * (1 - level) / 2000) + 2e-3
    shifted = classes.permutation_p(classes.paired_mean(d[:, :50] + 2),
                                    classes.sign_flip_draws(d[:, :50] + 2, 999, 1))
    assert (shifted <= 1 / 1000).all()


def test_chunked_p_values_equal_the_p_values_of_every_draw_at_once():
    rng = np.random.default_rng(3)
    d = rng.normal(0.2, 1, size=(12, 30))
    d[0, :5] = np.nan  # a prompt with nothing to score on some heads
    whole = classes.permutation_p(classes.paired_mean(d),
                                  np.concatenate([classes.sign_flip_draws(d, 100, [7, s], chunk=100)
                                                  for s in range(0, 1000, 100)]))
    np.testing.assert_array_equal(classes.sign_flip_p(d, 1000, 7, chunk=100), whole)


def test_the_draws_must_reach_below_the_rate():
    with pytest.raises(ValueError, match="cannot reach"):
        classes.Testing(fdr=0.05, n_draws=19)
    assert classes.Testing(fdr=0.05, n_draws=99).floor == 0.01


# ---- false-discovery control on synthetic patterns with planted heads -------------------

L, N_PROMPTS, N_NULL, N_OFFSET, N_PLANTED = 10, 16, 25, 5, 10


def _context(ids: torch.Tensor) -> PatternContext:
    n, t = ids.shape
    return PatternContext(input_ids=ids, lengths=torch.full((n,), t),
                          query_mask=torch.ones(n, t, dtype=torch.bool), layer=0, causal=True)


def _patterns(ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``[prompt, head, T, T]`` causal patterns of heads that read ``ids``: random heads
    (logits independent of the tokens), offset heads (a strong fixed offset ``L - 1`` back,
    what Olsson's score reads on two repeats, whatever the tokens), and planted
    prefix-matching heads (a boost on the key after each earlier occurrence of the query's
    token, of strengths 1 to 3)."""
    n, t = ids.shape
    heads = N_NULL + N_OFFSET + N_PLANTED
    logits = torch.randn(n, heads, t, t, generator=gen)
    queries, keys = torch.arange(t)[:, None], torch.arange(t)[None, :]
    offset = (keys == queries - (L - 1)).float()
    logits[:, N_NULL:N_NULL + N_OFFSET] += 3 * offset
    targets = patterns.induction_targets(_context(ids)).float()  # [prompt, query, key]
    strength = torch.linspace(1, 3, N_PLANTED)[None, :, None, None]
    logits[:, N_NULL + N_OFFSET:] += strength * targets[:, None]
    logits = logits.masked_fill(keys > queries, float("-inf"))
    return logits.softmax(-1)


def _planted_scores(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One draw: ``[prompt, head]`` induction scores of the real prompts, and of their
    shuffled twins read at the real prompts' targets."""
    gen = torch.Generator().manual_seed(seed)
    seqs = torch.stack([torch.randperm(200, generator=gen)[:L] + 10 for _ in range(N_PROMPTS)])
    real = torch.cat([torch.zeros(N_PROMPTS, 1, dtype=torch.long), seqs, seqs], 1)
    twin = real.clone()
    for i in range(N_PROMPTS):
        twin[i, 1 + L:] = seqs[i, nulls.derangement(L, gen)]
    ctx = _context(real)  # the twins are read at the real prompts' targets
    x = patterns.induction(_patterns(real, gen), ctx)
    y = patterns.induction(_patterns(twin, gen), ctx)
    return x.numpy().astype(float), y.numpy().astype(float)


def _classed(x: np.ndarray, y: np.ndarray, seed: int, fdr: float = 0.05) -> set[int]:
    """The heads whose q is at most ``fdr``: the library's statistics, without the table."""
    d = x - y
    p = classes.sign_flip_p(d, 1999, seed)
    return set(np.flatnonzero(classes.bh_qvalues(p) <= fdr))


def _frame(values: np.ndarray) -> pd.DataFrame:
    prompt, head = np.meshgrid(range(values.shape[0]), range(values.shape[1]), indexing="ij")
    return pd.DataFrame({"prompt": prompt.ravel(), "layer": 0, "head": head.ravel(),
                         "score": values.ravel()})


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_false_discovery_control_holds_over_200_draws_and_planted_heads_are_found(one_thread):
    planted = set(range(N_NULL + N_OFFSET, N_NULL + N_OFFSET + N_PLANTED))
    offset_heads = set(range(N_NULL, N_NULL + N_OFFSET))
    fdp, found, offsets = [], [], []
    for seed in range(200):
        classed = _classed(*_planted_scores(seed), seed)
        fdp.append(len(classed - planted) / max(len(classed), 1))
        found.append(len(classed & planted) / len(planted))
        offsets.append(len(classed & offset_heads))
    assert np.mean(fdp) <= 0.05
    assert np.mean(found) >= 0.95
    assert np.mean(offsets) < 0.05 * N_OFFSET


def test_the_table_classes_what_the_statistics_reject(one_thread):
    x, y = _planted_scores(0)
    table = classes.classify(classes.get("induction"), _frame(x), _frame(y),
                             testing=classes.Testing(fdr=0.05, n_draws=1999, seed=0),
                             n_boot=50, seed=0, inputs="synthetic")
    assert set(table[table.in_class]["head"]) == _classed(x, y, 0)
    np.testing.assert_allclose(table.score, x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(table.null_mean, y.mean(0), rtol=1e-12)
    # the offset heads score high on both inputs: a uniform null would class them
    offset = table[table["head"].between(N_NULL, N_NULL + N_OFFSET - 1)]
    assert (offset.score > 0.3).all() and (offset.null_mean > 0.3).all()
    assert (offset.score > offset.chance.fillna(0)).all()


# ---- the structured null inputs ---------------------------------------------------------

def test_shuffled_repeats_keep_the_tokens_and_move_every_one(llama):
    prompts = load_prompt_set("repeated-random", llama, n_prompts=4, seq_len=12, repeats=3)
    gen = torch.Generator().manual_seed(0)
    for prompt in prompts:
        real = list(prompt.token_ids)
        twin = list(nulls.shuffled_repeats(llama, prompt, 12, 3, gen).token_ids)
        assert len(twin) == len(real) and twin[:13] == real[:13]
        for r in (1, 2):
            part, first = twin[1 + 12 * r:13 + 12 * r], real[1:13]
            assert sorted(part) == sorted(first)
            assert all(a != b for a, b in zip(part, first, strict=True) if first.count(b) == 1)


def test_fresh_repeats_leave_no_earlier_copy(llama):
    prompt = load_prompt_set("repeated-random", llama, n_prompts=1, seq_len=10, repeats=2)[0]
    twin = list(nulls.fresh_repeats(llama, prompt, 10, 2, torch.Generator()).token_ids)
    assert twin[:11] == list(prompt.token_ids)[:11]
    assert not set(twin[11:]) & set(twin[:11]) and len(set(twin[11:])) == 10


def test_a_prompt_that_is_not_repeated_is_refused(llama):
    from workbench.core.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match="not 2 repeats"):
        nulls.shuffled_repeats(llama, Prompt(token_ids=(0, 5, 6, 7, 8)), 2, 2,
                               torch.Generator())


def test_reduce_patterns_reads_the_reference_tokens(llama):
    """A prompt scored with another's ids as reference reads that prompt's targets: the
    twin of a repeated prompt, read at the real targets, is not the twin read at its own."""
    real = load_prompt_set("repeated-random", llama, n_prompts=3, seq_len=8, repeats=2)
    gen = torch.Generator().manual_seed(0)
    twins = [nulls.shuffled_repeats(llama, p, 8, 2, gen) for p in real]
    red = metrics.reductions("induction")
    own = reduce_patterns(llama, twins, red)
    at_real = reduce_patterns(llama, twins, red, reference=real)
    same = reduce_patterns(llama, real, red, reference=real)
    pd.testing.assert_frame_equal(same, reduce_patterns(llama, real, red))
    assert not np.allclose(own.score, at_real.score)
    with pytest.raises(ValueError, match="tokens"):
        reduce_patterns(llama, twins, red, reference=[Prompt(token_ids=(0, 5))] * 3)


# ---- a tiny model ------------------------------------------------------------------------

def test_score_and_classify_matches_score_heads_and_declares_its_table(llama):
    prompts = load_prompt_set("repeated-random", llama, n_prompts=6, seq_len=8, repeats=2)
    red = metrics.reductions("induction", "duplicate_token", "previous_token", "first_token",
                             "entropy")
    testing = classes.Testing(n_draws=199)
    scored = score_and_classify(llama, prompts, red, inputs="rr", testing=testing,
                                repeats=(8, 2), n_boot=100)
    scores, table = scored.head_scores, scored.head_classes
    assert scored.untested == {}
    plain = score_heads(llama, prompts, red, inputs="rr", n_boot=100)
    pd.testing.assert_frame_equal(scores, plain, atol=1e-6, rtol=1e-5)
    head_classes().check(table)
    n_heads = llama.info.n_layers * llama.info.n_heads
    assert table.groupby("head_class").size().to_dict() == {
        "duplicate-token": n_heads, "induction": n_heads, "previous-token": n_heads,
        "sink": n_heads}
    assert (table.p >= testing.floor).all() and (table.q >= table.p).all()
    induction = table[table.head_class == "induction"].reset_index(drop=True)
    np.testing.assert_allclose(
        induction.score, scores[scores.metric == "induction"].score.to_numpy(), rtol=1e-5)
    assert (table[table.head_class == "sink"].null_mean == classes.SINK_EPS).all()
    assert classes.summary_line(table, "induction").startswith("induction heads at FDR 0.05")


def test_an_input_class_needs_the_repeats(llama):
    prompts = load_prompt_set("repeated-random", llama, n_prompts=2, seq_len=8, repeats=2)
    with pytest.raises(ValueError, match="seq_len, repeats"):
        score_and_classify(llama, prompts, metrics.reductions("induction"), inputs="rr",
                           testing=classes.Testing())


def test_a_class_whose_null_the_vocabulary_cannot_make_is_left_out_with_the_reason(llama):
    """A repeat longer than the tokens the prompt leaves unused has no fresh twin: the
    duplicate-token class is not tested, its metric is still scored, the others are kept."""
    from workbench.inputs.prompts import content_token_range

    low, high = content_token_range(llama)
    seq_len = (high - low) * 3 // 5  # uses at most 3/5 of the tokens, needs 3/5 fresh
    prompts = load_prompt_set("repeated-random", llama, n_prompts=2, seq_len=seq_len,
                              repeats=2)
    assert nulls.fresh_problem(llama, prompts[0], seq_len, 2) is not None
    with pytest.raises(WorkbenchError, match="too few"):
        nulls.fresh_repeats(llama, prompts[0], seq_len, 2, torch.Generator())
    scored = score_and_classify(llama, prompts, metrics.reductions("induction",
                                                                   "duplicate_token"),
                                inputs="rr", testing=classes.Testing(n_draws=199),
                                repeats=(seq_len, 2), n_boot=50)
    assert list(scored.untested) == ["duplicate-token"]
    assert f"too few for the {seq_len} fresh ones" in scored.untested["duplicate-token"]
    assert set(scored.head_classes.head_class) == {"induction"}
    assert set(scored.head_scores.metric) == {"induction", "duplicate_token"}


def test_previous_token_heads_says_which_class_it_could_not_test(llama, tmp_path):
    from workbench.inputs.prompts import content_token_range

    low, high = content_token_range(llama)
    run = run_experiment("previous-token-heads", llama,
                         {"n_prompts": 2, "n_repeated": 2, "seq_len": (high - low) * 3 // 5,
                          "n_boot": 20, "n_null_draws": 199}, runs_dir=tmp_path)
    assert run.status == "complete"
    (line,) = [s for s in run.meta.summary if s.startswith("duplicate-token heads")]
    assert line.startswith("duplicate-token heads: not tested (") and "too few" in line
    assert "duplicate_token" in set(run.table("head_scores").metric)


# ---- the nulls take out the structure --------------------------------------------------

def _prefix_matching(ids: torch.Tensor) -> torch.Tensor:
    """A hand-built induction head: every query with an earlier occurrence of its token
    attends only to the token after it; the others attend uniformly."""
    t = ids.shape[1]
    targets = patterns.induction_targets(_context(ids)).float()
    uniform = torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None]
    has = targets.sum(-1, keepdim=True) > 0
    weights = torch.where(has, targets / targets.sum(-1, keepdim=True).clamp_min(1), uniform)
    return weights[:, None]


def test_the_shuffled_repeat_null_puts_a_perfect_induction_head_at_chance():
    gen = torch.Generator().manual_seed(0)
    seqs = torch.stack([torch.randperm(200, generator=gen)[:L] + 10 for _ in range(8)])
    real = torch.cat([torch.zeros(8, 1, dtype=torch.long), seqs, seqs], 1)
    twin = real.clone()
    for i in range(8):
        twin[i, 1 + L:] = seqs[i, nulls.derangement(L, gen)]
    ctx = _context(real)
    assert torch.allclose(patterns.induction(_prefix_matching(real), ctx), torch.tensor(1.0))
    # read at the real targets, the twin gives the head nothing: the successor of each
    # token's first occurrence no longer sits where the real prompt had it
    at_real = patterns.induction(_prefix_matching(twin), ctx)
    assert torch.equal(at_real, torch.zeros_like(at_real))
    # read at its own targets it would still score 1: why the null is read at the real ones
    own = patterns.induction(_prefix_matching(twin), _context(twin))
    assert torch.allclose(own, torch.tensor(1.0))


@pytest.fixture(scope="module")
def copying_by_position(tmp_path_factory):
    """A 2-layer attention-only model trained (300 steps, seconds) on 12 random tokens
    repeated twice: it learns to copy by position, its layer-0 heads attending 11 tokens
    back whatever the tokens are (a fixed offset, not prefix matching)."""
    from tests import tiny
    from workbench.models import native
    from workbench.training import loop

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = tiny.tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    spec = native.ModelSpec(n_layers=2, d_model=64, n_heads=2, n_ctx=32, d_vocab=len(tok))
    bridge = native.build_bridge(spec, tok)
    gen = torch.Generator().manual_seed(0)

    def data():
        while True:
            seq = torch.randint(30, 270, (32, 12), generator=gen)
            yield torch.cat([torch.zeros(32, 1, dtype=torch.long), seq, seq], 1)

    loop.train(bridge, data(), loop.TrainSpec(steps=300, lr=3e-3, warmup_steps=20))
    yield native.as_model(bridge, tok, spec, name="copying-by-position")
    torch.set_num_threads(before)


def test_heads_that_copy_by_position_score_as_high_on_the_null_and_are_not_classed(
        copying_by_position):
    model = copying_by_position
    prompts = load_prompt_set("repeated-random", model, n_prompts=16, seq_len=12, repeats=2,
                              seed=1)
    table = score_and_classify(model, prompts, metrics.reductions("induction"), inputs="rr",
                               testing=classes.Testing(), repeats=(12, 2)).head_classes
    induction = table[table.head_class == "induction"]
    layer0 = induction[induction.layer == 0]
    # Olsson's score alone would call them induction heads, far above uniform attention
    assert (layer0.score > 0.5).all() and (layer0.score > 5 * layer0.chance).all()
    # the null keeps their offset and takes out only the copy: they score the same on it
    np.testing.assert_allclose(layer0.score, layer0.null_mean, atol=0.05)
    assert not induction.in_class.any()


# ---- the table of a run, and `workbench show --classes` ----------------------------------

def test_show_classes_prints_each_class_at_the_run_rate_or_another(capsys, runs_dir,
                                                                  llama_folder):
    from tests.tiny import cli

    status, out, _ = cli(capsys, "run", "previous-token-heads", "--model", str(llama_folder),
                         "--set", "n_prompts=4", "--set", "n_repeated=4", "--set", "seq_len=8",
                         "--set", "n_tokens=24", "--set", "n_boot=20", "--set",
                         "n_null_draws=199")
    assert status == 0
    run_id = out[-1].split("/")[-1]
    status, out, _ = cli(capsys, "show", run_id, "--classes")
    assert status == 0
    lines = [line for line in out if line.startswith("class      ")]
    assert [line.split()[1] for line in lines] == ["previous-token", "duplicate-token"]
    assert all(" at FDR 0.05: " in line and "199 draws, smallest p 0.005" in line
               for line in lines)
    status, wide, _ = cli(capsys, "show", run_id, "--classes", "--fdr", "0.5")
    assert status == 0 and any("at FDR 0.5: " in line for line in wide)
    status, _, err = cli(capsys, "show", run_id, "--fdr", "0.5")
    assert status != 0 and "--fdr goes with --classes" in err
    status, _, err = cli(capsys, "show", run_id, "--classes", "--fdr", "0.9")
    assert status == 2 and err.count("\n") == 1


def test_show_classes_of_a_run_without_them_is_one_line(capsys, runs_dir, llama_folder):
    from tests.tiny import cli

    status, out, _ = cli(capsys, "record", str(llama_folder), "--text", "the cat sat")
    status, _, err = cli(capsys, "show", out[-1].split("/")[-1], "--classes")
    assert status != 0 and "has no head_classes table" in err and err.count("\n") == 1


# ---- the claim checks that read classes ------------------------------------------------

class _Run:
    id = "run-1"
    experiment = "a stand-in"  # no experiment's: its table is read as it is given

    def __init__(self, table: pd.DataFrame) -> None:
        self._table = table

    def table(self, name: str) -> pd.DataFrame:
        assert name == "head_classes"
        return self._table


def _class_table(rows: list[tuple[str, int, int, float, float]]) -> pd.DataFrame:
    """``(class, layer, head, score, q)`` rows as a head_classes table at FDR 0.05."""
    frame = pd.DataFrame(rows, columns=["head_class", "layer", "head", "score", "q"])
    return frame.assign(fdr=0.05, in_class=frame.q <= 0.05)


def test_class_checks_count_place_and_name_the_heads():
    from workbench.harness.claims import CHECKS

    run = _Run(_class_table([
        ("induction", 0, 1, 0.9, 0.2), ("induction", 2, 0, 0.8, 0.01),
        ("induction", 3, 1, 0.5, 0.04), ("previous-token", 1, 0, 0.7, 0.001),
        ("previous-token", 0, 0, 0.1, 0.5)]))
    size = CHECKS.get("class_size_at_least")(run, head_class="induction", at_least=2)
    assert size.outcome == "pass" and "2 of 3 heads" in size.measured and size.value == 2
    share = CHECKS.get("class_size_at_least")(run, head_class="induction", at_least=70,
                                              share=True)
    assert share.outcome == "fail" and share.value == pytest.approx(200 / 3)
    at_rate = CHECKS.get("class_size_at_least")(run, head_class="induction", at_least=3,
                                                fdr=0.25)
    assert at_rate.outcome == "pass"
    named = CHECKS.get("heads_in_class")
    assert named(run, head_class="induction", heads=["2.0", "3.1"]).outcome == "pass"
    assert named(run, head_class="induction", heads=["2.0", "0.1"]).outcome == "fail"
    assert named(run, head_class="induction", heads=["9.9"]).outcome == "undecided"
    above = CHECKS.get("class_above_layer")
    assert above(run, head_class="induction", layer=0).outcome == "pass"
    assert above(run, head_class="induction", layer=2).outcome == "fail"
    below = CHECKS.get("class_below_class")
    assert below(run, earlier="previous-token", later="induction").outcome == "pass"
    assert below(run, earlier="induction", later="previous-token").outcome == "fail"
    empty = _Run(_class_table([("induction", 1, 0, 0.1, 0.9), ("sink", 0, 0, 0.5, 0.01)]))
    assert above(empty, head_class="induction", layer=0).outcome == "undecided"
    from workbench.core.errors import UnknownNameError, WorkbenchError

    with pytest.raises(WorkbenchError, match="tested no head"):
        above(empty, head_class="duplicate-token", layer=0)
    with pytest.raises(UnknownNameError, match="known"):
        above(empty, head_class="inductoin", layer=0)
