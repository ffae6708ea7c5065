"""Two runs' values of the same prompts, compared: the mean difference with a paired
bootstrap interval and a two-sided sign-flip (paired permutation) p-value.

The difference of a scalar between run A and run B is ``B - A``. Where both runs scored
the same prompts, each prompt gives one difference ``d_i = b_i - a_i``, and

- the interval is the percentile bootstrap of ``mean(d)``: :data:`N_RESAMPLES` resamples
  of the prompts with replacement, seed :data:`SEED`
  (:func:`workbench.scores.stats.bootstrap_mean_ci`);
- the p-value is that of the sign-flip test of ``mean(d) = 0`` (each ``d_i`` as likely
  ``+`` as ``-`` under the null): ``(1 + #{|mean(s * d)| >= |mean(d)|}) / (1 + n)``
  over :data:`N_FLIPS` draws of random signs ``s``, seed :data:`SEED`
  (:func:`workbench.scores.classes.sign_flip_draws`). Its smallest value is
  ``1 / (1 + N_FLIPS)``; comparing a run with itself gives ``d = 0`` and ``p = 1``.

Where the prompts differ (other seeds, other prompt sets) the prompts cannot be paired:
:func:`unpaired_differences` resamples each run's prompts on its own and gives no p-value.

NaN values (a prompt a score is not defined on) are left out of that column's means.

Examples:
    >>> import numpy as np
    >>> a = np.array([[1.0], [2.0], [3.0], [4.0]])
    >>> out = paired_differences(a, a + 0.5)
    >>> float(out.difference[0]), float(out.ci_low[0]), float(out.ci_high[0])
    (0.5, 0.5, 0.5)
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from workbench.scores.classes import paired_mean, sign_flip_draws
from workbench.scores.stats import bootstrap_mean_ci

N_RESAMPLES = 2000
"""Bootstrap resamples of the prompts behind every interval of a comparison."""
N_FLIPS = 10_000
"""Sign-flip draws behind every p-value of a comparison (smallest p: 1 / 10,001)."""
SEED = 0
"""The fixed seed of the resamples and of the sign flips: a comparison is reproducible."""
CHUNK = 2048
"""Sign-flip draws made at once (memory only)."""
MAX_RESAMPLED = 1 << 23
"""Resampled values held at once by a bootstrap (memory only: 64 MiB of float64)."""


def paired_differences(a: np.ndarray, b: np.ndarray, *, n_boot: int = N_RESAMPLES,
                       n_flips: int = N_FLIPS, seed: int = SEED) -> pd.DataFrame:
    """Mean difference ``B - A`` of paired values, its bootstrap interval and p-value.

    Args:
        a, b: ``[n_prompts, n_tests]``, row ``i`` of both the same prompt.
        n_boot: bootstrap resamples of the prompts.
        n_flips: sign-flip draws.
        seed: of both.

    Returns:
        one row a test: ``a, b`` (their means), ``difference, ci_low, ci_high, p,
        n_prompts`` (the prompts where both are defined).
    """
    a, b = _two_dimensional(a), _two_dimensional(b)
    if a.shape != b.shape:
        raise ValueError(f"paired values must have one shape, got {a.shape} and {b.shape}")
    d = b - a
    low, high = _blocked_interval(d, n_boot, seed)
    return pd.DataFrame({"a": _nanmean(np.where(np.isfinite(d), a, np.nan)),
                         "b": _nanmean(np.where(np.isfinite(d), b, np.nan)),
                         "difference": paired_mean(d), "ci_low": low, "ci_high": high,
                         "p": sign_flip_p_two_sided(d, n_flips, seed=seed),
                         "n_prompts": np.isfinite(d).sum(0)})


def _blocked_interval(d: np.ndarray, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bootstrap_mean_ci` of the columns of ``d`` a block at a time (the resamples
    of every block the same: one seed), so that ``[n_boot, n_prompts, block]`` stays under
    :data:`MAX_RESAMPLED` values."""
    block = max(1, MAX_RESAMPLED // max(1, n_boot * len(d)))
    parts = [bootstrap_mean_ci(d[:, i:i + block], n_boot=n_boot, seed=seed)
             for i in range(0, d.shape[1], block)]
    return (np.concatenate([p[0] for p in parts]) if parts else np.empty(0),
            np.concatenate([p[1] for p in parts]) if parts else np.empty(0))


def sign_flip_p_two_sided(differences: np.ndarray, n_flips: int = N_FLIPS, *,
                          seed: int = SEED) -> np.ndarray:
    """Two-sided sign-flip p-value of ``mean(d) = 0`` for each column of ``differences``
    (``[n_prompts, n_tests]``): ``(1 + #{|mean(s * d)| >= |mean(d)|}) / (1 + n_flips)``,
    the same signs for every column; NaN for a column with no finite difference."""
    d = _two_dimensional(differences)
    observed = np.abs(paired_mean(d))
    reached = np.zeros(d.shape[1])
    for start in range(0, n_flips, CHUNK):
        size = min(CHUNK, n_flips - start)
        draws = np.abs(sign_flip_draws(d, size, seed=[seed, start], chunk=size))
        reached += _reached(observed, draws)
    return np.where(np.isfinite(observed), (1.0 + reached) / (1.0 + n_flips), np.nan)


def _reached(observed: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """How many draws reach the observed statistic; a draw equal to it up to float
    rounding counts (the identity flip is one of the draws' values), so a run compared
    with itself gets p = 1."""
    scale = np.maximum(draws.max(0, initial=0.0), np.nan_to_num(observed))
    return (draws >= observed - 1e-9 * np.maximum(scale, 1e-12)).sum(0)


def unpaired_differences(a: np.ndarray, b: np.ndarray, *, n_boot: int = N_RESAMPLES,
                         seed: int = SEED) -> pd.DataFrame:
    """Mean difference ``B - A`` of values on different prompts: each run's prompts
    resampled on their own (seeds ``seed`` and ``seed + 1``), the interval the percentiles
    of the resampled differences; no p-value (NaN).

    Args:
        a: ``[n_prompts_a, n_tests]``; b: ``[n_prompts_b, n_tests]``.

    Returns:
        as :func:`paired_differences`; ``n_prompts`` the smaller of the two counts.
    """
    a, b = _two_dimensional(a), _two_dimensional(b)
    means = _resampled_means(b, n_boot, seed + 1) - _resampled_means(a, n_boot, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanpercentile(means, [2.5, 97.5], axis=0)
    ma, mb = _nanmean(a), _nanmean(b)
    return pd.DataFrame({"a": ma, "b": mb, "difference": mb - ma, "ci_low": low,
                         "ci_high": high, "p": np.nan,
                         "n_prompts": np.minimum(np.isfinite(a).sum(0),
                                                 np.isfinite(b).sum(0))})


def _resampled_means(values: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """``[n_boot, n_tests]`` means of resamples of the rows of ``values``."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n_boot, len(values)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(values[idx], axis=1)


def _nanmean(values: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column stays NaN
        return np.nanmean(values, axis=0)


def _two_dimensional(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[:, None] if values.ndim == 1 else values
