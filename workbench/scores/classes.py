"""Head classes: which heads are induction (previous-token, duplicate-token, sink) heads,
at a declared false-discovery rate.

A head score says how much; a class says which heads, and how sure. For each positional
metric a class is declared once (:data:`CLASSES`), with the null that takes out the
structure the metric detects. Every head is tested against its null on the same prompts,
and the heads of a model whose Benjamini-Hochberg q-value is at most the declared rate
``fdr`` form the class: in expectation at most a share ``fdr`` of them are there by chance
(Benjamini & Hochberg 1995). A per-head 95% interval marks about 13 of smollm2's 270 heads
by chance alone; a class at 5% lets about 5% of its own members be wrong.

The test of one head is paired and one-sided. Each real prompt ``i`` has a null value
``y_i`` beside its score ``x_i``; under the null the sign of ``d_i = x_i - y_i`` is a coin
flip, so the observed mean ``mean(d)`` is compared with ``n_draws`` draws of ``mean(s d)``
for random signs ``s`` (:func:`sign_flip_draws`), and

    p = (1 + #{draws >= observed}) / (1 + n_draws)

(:func:`permutation_p`), which is never below ``1 / (1 + n_draws)`` and is a valid p-value
for any number of draws. The draws cost no forward pass (the null inputs are scored once,
batched with the real prompts), so ``n_draws`` can be large enough that BH can reach a head
even among a thousand: the smallest reportable p times the number of heads should be
below ``fdr``. With ``n`` prompts there are only ``2**n`` sign patterns, so with very few
prompts p cannot go below about ``2**-n`` whatever ``n_draws`` is. BH controls the
false-discovery rate for independent or positively dependent tests; heads scored on the
same prompts are dependent, mostly positively.

The nulls, and why (the kinds of :class:`HeadClass`):

- ``induction`` (``input``): Olsson et al.'s prefix-matching score on the same random
  tokens with every repeat after the first shuffled (a derangement,
  :func:`workbench.inputs.nulls.shuffled_repeats`), read at the real prompt's targets
  ``i - seq_len + 1``. There is no earlier copy there to continue. Recomputing the score's
  targets on the shuffled tokens would not remove anything: every token of a shuffled
  repeat still has an earlier occurrence, and a prefix-matching head still finds what
  followed it.
- ``duplicate-token`` (``input``): the second repeat onwards replaced by fresh random
  tokens that occur nowhere earlier (:func:`workbench.inputs.nulls.fresh_repeats`), read at
  the real prompt's targets (the earlier copy, ``seq_len`` back). Shuffling would leave
  every token's earlier copy in place.
- ``previous-token`` (``pattern``): the same head's total weight on the tokens 2 to 4 back
  (:data:`NEIGHBOURS`, together), against its weight on the token 1 back, on the same
  queries of the same natural text (queries 5 and later, so every neighbour exists and
  none is position 0). Input nulls do not remove this structure: permuting the tokens
  within a prompt leaves every previous-token head attending to position ``i - 1`` (on
  smollm2 the top previous-token heads score *higher* on shuffled text, L16H0 0.73 natural
  vs 0.85 shuffled, and the scores of all heads correlate at 0.97), and position ids
  cannot be permuted for every family (ALiBi and relative positions, and a causal mask
  carries order anyway). What makes a previous-token head is that it singles out the
  previous token: more weight on it than on the three tokens before it together. A head
  spread over the recent past (a local head), or one whose weight decays with distance,
  does not. (Against their mean instead of their sum, 160 of smollm2's 270 heads passed,
  down to 0.03 on the previous token; against the sum, 31, from 0.07 up.)
- ``sink`` (``threshold``): Gu et al. 2024's own definition, a head whose alpha_1 (mean
  weight on the first position) exceeds ``eps`` (0.3 in the paper), tested as the mean over
  prompts of ``alpha_1 - eps``. A sink is a matter of degree on every input (the first
  position is there in every prompt, and without a BOS the sink moves to the first content
  token), so the paper's threshold is the null.

Examples:
    >>> bh_qvalues(np.array([0.01, 0.04, 0.03, 0.5])).round(3).tolist()
    [0.04, 0.053, 0.053, 0.5]
    >>> get("induction").metric
    'induction'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from workbench.core.registry import Registry
from workbench.inputs import nulls
from workbench.recording.reductions import PatternContext, Reduction, query_mean
from workbench.scores.patterns import PerQuery, weight_at
from workbench.scores.stats import summarize

NullKind = Literal["input", "pattern", "threshold"]
SINK_EPS = 0.3
"""Gu et al. 2024's threshold on alpha_1 (their Sink_1^eps uses eps = 0.3)."""
NEIGHBOURS = (2, 3, 4)
"""The offsets back whose weight, together, is the previous-token null."""
FAR = max(NEIGHBOURS) + 1
"""The first query the previous-token test reads: every neighbour exists, none is
position 0."""
DEFAULT_FDR = 0.05
DEFAULT_DRAWS = 9999


@dataclass(frozen=True)
class HeadClass:
    """A kind of head and the test that puts a head in it.

    Attributes:
        name: the class (``induction``, ``previous-token``, ...).
        metric: the head metric whose score is tested (:mod:`workbench.scores.metrics`).
        kind: ``input`` (a null twin of every prompt, scored at the real prompt's targets),
            ``pattern`` (a null read from the same pattern), ``threshold`` (a constant).
        null: one line: the null the score is tested against.
    """

    name: str
    metric: str
    kind: NullKind
    null: str


CLASSES: Registry[HeadClass] = Registry("head class")
for _class in (
    HeadClass("previous-token", "previous_token", "pattern",
              "the same head's total weight on the tokens 2-4 back (queries 5 and later)"),
    HeadClass("duplicate-token", "duplicate_token", "input",
              "the repeats replaced by fresh tokens, read at the real earlier copies"),
    HeadClass("induction", "induction", "input",
              "the repeats shuffled (a derangement), read at the real induction targets"),
    HeadClass("sink", "first_token", "threshold", "Gu et al. 2024's threshold on alpha_1"),
):
    CLASSES.register(_class.name, _class)


def get(name: str) -> HeadClass:
    """The class ``name`` (an unknown name lists the known ones)."""
    return CLASSES.get(name)


def for_metrics(names: Iterable[str]) -> list[HeadClass]:
    """The classes that test any of the metrics ``names``, in name order."""
    wanted = set(names)
    return [c for c in (CLASSES.get(n) for n in CLASSES.names()) if c.metric in wanted]


@dataclass(frozen=True)
class Testing:
    """How the heads are tested: the false-discovery rate, the sign-flip draws, the seed
    of the draws (and of the null inputs), and the sink threshold."""

    fdr: float = DEFAULT_FDR
    n_draws: int = DEFAULT_DRAWS
    seed: int = 0
    eps: float = SINK_EPS

    def __post_init__(self) -> None:
        if not 0 < self.fdr < 1:
            raise ValueError(f"fdr must lie in (0, 1), got {self.fdr}")
        if self.floor >= self.fdr:
            raise ValueError(f"n_draws={self.n_draws} cannot reach p < fdr={self.fdr}: the "
                             f"smallest p is 1/(1 + n_draws) = {self.floor:.3g}")

    @property
    def floor(self) -> float:
        """The smallest p-value the draws can report."""
        return 1.0 / (1 + self.n_draws)


# ---- statistics -------------------------------------------------------------------------

def bh_qvalues(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg q-values: ``q_(k) = min_{j >= k} m p_(j) / j``, capped at 1.

    A test is rejected at rate ``alpha`` by the BH step-up procedure exactly when its q is at
    most ``alpha``. NaN p-values (no test) stay NaN and do not count in ``m``.
    """
    p = np.asarray(p, dtype=float)
    q = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    m = int(ok.sum())
    if m == 0:
        return q
    finite = p[ok]
    order = np.argsort(finite, kind="stable")
    scaled = finite[order] * m / np.arange(1, m + 1)
    running = np.minimum.accumulate(scaled[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(running, 1.0)
    q[ok] = out
    return q


def sign_flip_draws(differences: np.ndarray, n_draws: int, seed: int | list[int] = 0, *,
                    chunk: int = 4096) -> np.ndarray:
    """Null draws of the mean of paired differences: ``mean(s * d)`` for random signs.

    Args:
        differences: ``[n_prompts, n_tests]`` real minus null values; NaN (a prompt with
            nothing to score) is left out of that test's mean.
        n_draws: how many draws.
        seed: the signs are reproducible, and the same for every test (so tests on the same
            prompts keep their dependence).
        chunk: draws made at once (memory only).

    Returns:
        ``[n_draws, n_tests]``.
    """
    d = np.asarray(differences, dtype=float)
    finite = np.isfinite(d)
    count = np.maximum(finite.sum(0), 1)
    d = np.where(finite, d, 0.0)
    rng = np.random.default_rng(seed)
    out = np.empty((n_draws, d.shape[1]))
    for start in range(0, n_draws, chunk):
        size = min(chunk, n_draws - start)
        signs = rng.integers(0, 2, size=(size, d.shape[0])) * 2.0 - 1.0
        out[start:start + size] = signs @ d / count
    return out


def paired_mean(differences: np.ndarray) -> np.ndarray:
    """The observed statistic of :func:`sign_flip_draws`: the mean difference, NaN left
    out (NaN for a test with no prompt)."""
    d = np.asarray(differences, dtype=float)
    finite = np.isfinite(d)
    total = np.where(finite, d, 0.0).sum(0)
    return np.where(finite.any(0), total / np.maximum(finite.sum(0), 1), np.nan)


def permutation_p(observed: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """One-sided permutation p-values ``(1 + #{draws >= observed}) / (1 + n_draws)``.

    A draw equal to the observed value up to float rounding counts as reaching it (the
    identity of the permutation is one of the draws' values). NaN observed gives NaN.
    """
    observed = np.asarray(observed, dtype=float)
    draws = np.asarray(draws, dtype=float)
    p = (1.0 + _reached(observed, draws)) / (1.0 + len(draws))
    return np.where(np.isfinite(observed), p, np.nan)


def _reached(observed: np.ndarray, draws: np.ndarray) -> np.ndarray:
    scale = np.maximum(np.abs(draws).max(0, initial=0.0), np.abs(np.nan_to_num(observed)))
    return (draws >= observed - 1e-9 * np.maximum(scale, 1e-12)).sum(0)


def sign_flip_p(differences: np.ndarray, n_draws: int, seed: int = 0, *,
                chunk: int = 4096) -> np.ndarray:
    """:func:`permutation_p` of :func:`paired_mean` against :func:`sign_flip_draws`, the
    draws counted a chunk at a time (so a million draws over thousands of heads never
    stand in memory at once); the same p-values as building every draw."""
    observed = paired_mean(differences)
    reached = np.zeros(observed.shape)
    for start in range(0, n_draws, chunk):
        size = min(chunk, n_draws - start)
        draws = sign_flip_draws(differences, size, seed=[seed, start], chunk=size)
        reached += _reached(observed, draws)
    p = (1.0 + reached) / (1.0 + n_draws)
    return np.where(np.isfinite(observed), p, np.nan)


# ---- the previous-token null, read from the same pattern --------------------------------

@query_mean
def previous_token_far(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                       ctx: PatternContext) -> PerQuery:
    """Weight on the token 1 back, over the queries the previous-token test reads."""
    return weight_at(pattern, ctx, -1), ctx.real_queries & (ctx.queries >= FAR)


@query_mean
def neighbour_tokens(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                     ctx: PatternContext) -> PerQuery:
    """Total weight on the tokens :data:`NEIGHBOURS` back, over the same queries."""
    values = torch.stack([weight_at(pattern, ctx, -d) for d in NEIGHBOURS]).sum(0)
    return values, ctx.real_queries & (ctx.queries >= FAR)


PATTERN_NULLS: dict[str, tuple[str, str]] = {
    "previous-token": ("previous_token_far", "neighbour_tokens")}
"""A ``pattern`` class's (observed, null) reductions, by class."""
PATTERN_REDUCTIONS: dict[str, Reduction] = {
    "previous_token_far": previous_token_far, "neighbour_tokens": neighbour_tokens}
NULL_INPUTS = {"induction": nulls.shuffled_repeats, "duplicate-token": nulls.fresh_repeats}
"""An ``input`` class's null twin of a repeated-random prompt, by class."""
NULL_PROBLEMS = {"duplicate-token": nulls.fresh_problem}
"""Why an ``input`` class's null twin cannot be made for a prompt (``None``: it can)."""


# ---- the table --------------------------------------------------------------------------

def _wide(per_prompt: pd.DataFrame, prompts: list[int]) -> tuple[np.ndarray, pd.DataFrame]:
    """``[prompt, head]`` values of one metric in the order of ``prompts``, and the heads."""
    wide = per_prompt.pivot_table(index="prompt", columns=["layer", "head"], values="score",
                                  aggfunc="mean", dropna=False).reindex(prompts)
    return wide.to_numpy(dtype=float), wide.columns.to_frame(index=False)


def classify(head_class: HeadClass, real: pd.DataFrame, null: pd.DataFrame | float, *,
             testing: Testing, n_boot: int, seed: int, inputs: str,
             chance: pd.Series | pd.DataFrame | None = None) -> pd.DataFrame:
    """Test every head of a model for one class.

    A head is in the class when its score beats, on the same prompts, both its null and
    ``chance`` (the score of attention uniform over the keys each query sees): the paired
    differences are ``x_i - max(y_i, u_i)``. The structured null says the score depends on
    the structure; the uniform score says it is more than spreading attention evenly would
    give. (A null raised to chance can only make the test more conservative.)

    Args:
        head_class: the class.
        real: per-prompt scores on the real prompts: ``prompt, layer, head, score``.
        null: the null value of each (prompt, head), the same shape and prompt numbers as
            ``real`` (paired), or one constant (``threshold`` classes).
        chance: the uniform pattern's score on each prompt (by prompt number), the same for
            every head; or ``prompt, layer, score``, the same for every head of a layer (a
            sliding layer's uniform pattern covers only its window); none: no such floor.
        testing: the rate, draws and seed.
        n_boot: bootstrap resamples of the score's interval; ``seed`` its seed.
        inputs: what the scores were measured on.

    Returns:
        The ``head_classes`` rows of the class: one per head, see
        :data:`workbench.store.schema.HEAD_CLASSES` for the columns.
    """
    prompts = sorted(real.prompt.unique())
    x, heads = _wide(real, prompts)
    if isinstance(null, pd.DataFrame):
        y, null_heads = _wide(null, prompts)
        if not heads.equals(null_heads):
            raise ValueError(f"{head_class.name}: the null scores another set of heads")
    else:
        y = np.full_like(x, float(null))
    u = _chance(chance, prompts, heads)
    d = x - np.maximum(y, np.nan_to_num(u, nan=-np.inf))
    p = sign_flip_p(d, testing.n_draws, testing.seed)
    q = bh_qvalues(p)
    summary = summarize(real.assign(metric=head_class.metric), n_boot=n_boot, seed=seed)
    summary = heads.merge(summary, on=["layer", "head"], how="left")
    with np.errstate(invalid="ignore"):
        null_mean = np.nanmean(np.where(np.isfinite(x), y, np.nan), axis=0) \
            if np.isfinite(x).any() else np.full(len(heads), np.nan)
    return pd.DataFrame({
        "layer": heads.layer.astype(int), "head": heads["head"].astype(int),
        "metric": head_class.metric, "head_class": head_class.name,
        "score": summary.score, "ci_low": summary.ci_low, "ci_high": summary.ci_high,
        "null_mean": null_mean,
        "chance": np.nanmean(u, axis=0) if chance is not None else np.nan,
        "p": p, "q": q, "fdr": testing.fdr,
        "in_class": np.nan_to_num(q, nan=np.inf) <= testing.fdr,
        "n_prompts": summary.n_prompts.astype(int), "n_draws": testing.n_draws,
        "inputs": inputs,
        "null": head_class.null if isinstance(null, pd.DataFrame) else
        f"{head_class.null}, eps = {float(null):g}",
    })


def _chance(chance: pd.Series | pd.DataFrame | None, prompts: list[int],
            heads: pd.DataFrame) -> np.ndarray:
    """``[prompt, head]``: the uniform pattern's score each head is held to (-inf: none)."""
    if chance is None:
        return np.full((len(prompts), len(heads)), -np.inf)
    if isinstance(chance, pd.Series):
        return np.repeat(chance.reindex(prompts).to_numpy(dtype=float)[:, None],
                         len(heads), axis=1)
    wide = chance.pivot(index="prompt", columns="layer", values="score").reindex(prompts)
    return wide.reindex(columns=heads.layer.to_numpy()).to_numpy(dtype=float)


def at_rate(head_classes: pd.DataFrame, fdr: float | None = None) -> pd.DataFrame:
    """A ``head_classes`` table re-read at the false-discovery rate ``fdr``: ``in_class``
    is ``q <= fdr`` (a BH q-value is the least rate at which the head is rejected), and
    ``fdr`` says the rate. With no ``fdr`` each class keeps the rate it was declared at.

    A head with no q (not tested) is in no class at any rate.

    Examples:
        >>> table = pd.DataFrame({"head_class": ["sink"] * 3, "q": [0.001, 0.03, np.nan],
        ...                       "fdr": 0.05, "in_class": [True, True, False]})
        >>> at_rate(table, 0.01).in_class.tolist()
        [True, False, False]
    """
    rate = head_classes.fdr.to_numpy(dtype=float) if fdr is None else \
        np.full(len(head_classes), float(fdr))
    q = np.nan_to_num(head_classes.q.to_numpy(dtype=float), nan=np.inf)
    return head_classes.assign(fdr=rate, in_class=q <= rate)


def summary_line(head_classes: pd.DataFrame, name: str) -> str:
    """One line: how many heads are in a class at its rate, and where."""
    rows = head_classes[head_classes.head_class == name]
    if rows.empty:
        return f"{name}: not tested"
    fdr = float(rows.fdr.iloc[0])
    inside = rows[rows.in_class].sort_values("score", ascending=False)
    if inside.empty:
        return (f"{name} heads at FDR {fdr:g}: none of {len(rows)} "
                f"(smallest q {np.nanmin(rows.q.to_numpy(dtype=float)):.3g})"
                if rows.q.notna().any() else f"{name} heads at FDR {fdr:g}: none tested")
    layers = sorted(set(inside.layer.astype(int)))
    shown = ", ".join(f"L{r.layer}H{r.head}" for r in inside.head(8).itertuples())
    more = f" and {len(inside) - 8} more" if len(inside) > 8 else ""
    return (f"{name} heads at FDR {fdr:g}: {len(inside)} of {len(rows)} in layers "
            f"{_ranges(layers)} ({shown}{more})")


def _ranges(values: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1-3, 7``."""
    parts: list[str] = []
    for v in values:
        if parts and int(parts[-1].split("-")[-1]) == v - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{v}"
        else:
            parts.append(str(v))
    return ", ".join(parts)
