"""Bootstrap intervals over prompts, so every score says how sure it is."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

KEYS = ["layer", "head", "metric"]


def bootstrap_mean_ci(values: np.ndarray, *, n_boot: int = 1000, alpha: float = 0.05,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of the mean over axis 0 (the prompts).

    Args:
        values: ``[n_prompts, ...]``; NaNs (a prompt with nothing to score) are skipped.
        n_boot: resamples.
        alpha: 0.05 gives a 95% interval.
        seed: the resampling is reproducible.

    Returns:
        ``(low, high)``, each shaped like ``values[0]``.
    """
    n = values.shape[0]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns stay NaN
        means = np.nanmean(values[idx], axis=1)
        low, high = np.nanpercentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=0)
    return low, high


def bootstrap_ratio_ci(numerator: np.ndarray, denominator: np.ndarray, *, n_boot: int = 1000,
                       alpha: float = 0.05, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of a ratio of means over axis 0 (the prompts): each
    resample of prompts gives ``mean(numerator) / mean(denominator)``. A normalised patching
    metric, ``(patched - corrupted) / (clean - corrupted)``, is such a ratio: averaging
    per-prompt ratios would let a prompt whose clean and corrupted runs nearly agree
    dominate.

    Args:
        numerator: ``[n_prompts, ...]``.
        denominator: ``[n_prompts]``.
        n_boot, alpha, seed: as :func:`bootstrap_mean_ci`.

    Returns:
        ``(low, high)``, each shaped like ``numerator[0]`` (NaN where a resample's
        denominator is 0).
    """
    n = numerator.shape[0]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    num = numerator[idx].mean(axis=1)  # [n_boot, ...]
    den = denominator[idx].mean(axis=1).reshape((n_boot,) + (1,) * (numerator.ndim - 1))
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        ratios = num / den
        ratios[~np.isfinite(ratios)] = np.nan
        low, high = np.nanpercentile(ratios, [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=0)
    return low, high


def summarize(per_prompt: pd.DataFrame, *, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Mean over prompts with a 95% bootstrap interval, per (layer, head, metric).

    Args:
        per_prompt: long format with columns ``prompt, layer, head, metric, score``.

    Returns:
        ``layer, head, metric, score, ci_low, ci_high, n_prompts``.
    """
    wide = per_prompt.pivot_table(index="prompt", columns=KEYS, values="score", aggfunc="mean",
                                  dropna=False)
    values = wide.to_numpy(dtype=float)
    low, high = bootstrap_mean_ci(values, n_boot=n_boot, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(values, axis=0)
    out = wide.columns.to_frame(index=False)
    out["score"] = mean
    out["ci_low"] = low
    out["ci_high"] = high
    out["n_prompts"] = np.isfinite(values).sum(axis=0)
    return out.sort_values(KEYS, ignore_index=True)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (ties share their
    mean rank); NaN for fewer than two values or a constant side.

    Args:
        x, y: ``[n]`` values, paired.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"spearman takes two [n] arrays of one length, got {x.shape}, {y.shape}")
    if len(x) < 2:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return (np.bincount(inverse, weights=ranks) / counts)[inverse]


def hypergeometric_tail(population: int, marked: int, drawn: int, hits: int) -> float:
    """``P(X >= hits)`` for ``X`` hypergeometric: ``drawn`` items taken without replacement
    from ``population`` of which ``marked`` are marked (how likely an overlap at least this
    large is by chance), computed exactly with integer binomial coefficients.

    Args:
        population, marked, drawn, hits: whole numbers, ``marked`` and ``drawn`` at most
            ``population``.

    Examples:
        >>> hypergeometric_tail(10, 3, 2, 2)  # both drawn are among the 3: C(3,2)/C(10,2)
        0.06666666666666667
        >>> hypergeometric_tail(10, 3, 2, 0)
        1.0
    """
    if not 0 <= marked <= population or not 0 <= drawn <= population:
        raise ValueError(f"hypergeometric: marked {marked} and drawn {drawn} must be within "
                         f"0 .. population {population}")
    top = min(marked, drawn)
    if hits <= max(0, drawn - (population - marked)):
        return 1.0
    if hits > top:
        return 0.0
    tail = sum(math.comb(marked, i) * math.comb(population - marked, drawn - i)
               for i in range(hits, top + 1))
    return tail / math.comb(population, drawn)
