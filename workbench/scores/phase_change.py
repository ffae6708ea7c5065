"""Find a phase change in training curves measured at checkpoints.

Pure functions on ``(steps, values)`` arrays, so they can be checked on synthetic curves
with a known answer. Used by the ``induction-formation`` experiment (Olsson et al. 2022,
"In-context Learning and Induction Heads", section 3: induction heads form in a narrow
window of training, together with a jump in in-context learning and a bump in the loss).

- :func:`rise_window`: where a score rises fastest. The curve is first smoothed by a
  running median of 3 (each checkpoint and its two neighbours; the first and last take
  the median of themselves, their neighbour and the straight line through the next two,
  Tukey's end-point rule), so a change must persist over at least 2 consecutive
  checkpoints to count: a one-checkpoint spike, even the global maximum, moves nothing,
  and a monotone curve is left exactly as it is. On the smoothed curve, with ``base`` the
  lowest value up to the peak and ``rise = peak - base``, the window runs from the last
  checkpoint before the peak still at or below ``base + low * rise`` to the first
  checkpoint at or above ``base + high * rise`` (20% and 80% by default); no window when
  ``rise < min_rise`` or the curve never rises (``rise == 0``, whatever ``min_rise``).
  For a sigmoid-shaped rise the window is centred on its steepest part. ``mid_step`` is
  the end of the interval with the largest rise per step.
- :func:`fastest_drop`: the interval between consecutive checkpoints where a curve falls
  fastest per step (the jump of the in-context-learning score).
- :func:`descent_rates`: the rate at which the loss falls per e-fold of tokens,
  ``(L[j-1] - L[j]) / (log t[j] - log t[j-1])`` (descriptive only: dividing checkpoint
  noise by a small log-width makes it too noisy to test with).
- :func:`loss_bump`: does the loss depart, inside a window, from the smooth curve that
  its checkpoints *outside* the window follow, by more than checkpoint noise explains?
  With ``x = log tokens``, take up to ``CONTEXT`` (8) checkpoints on each side of the
  window (at least ``MIN_CONTEXT``, 6, each side, all with tokens > 0; otherwise the test
  cannot be run and says so) and fit, by least squares, a quadratic in ``x``. The noise
  ``sigma`` is the robust scale of the fit's residuals outside the window (1.4826 x their
  median absolute deviation, times ``sqrt(n / (n - p))`` for the ``p`` fitted
  parameters). Two departures count, each in units of that noise:

  * a *hump*: the loss inside the window lies on one side of the fit's interpolation
    (above: the descent pauses or reverses; below: it speeds up and recovers) by
    ``|z|``, and the statistic is the largest ``min(|z_j|, |z_j+1|)`` over consecutive
    inside checkpoints with the same sign, so a one-checkpoint spike never counts;
  * a *shift*: the same fit with one more term, a level ``h`` for the checkpoints after
    the window, finds the loss after the window offset from the smooth trend before it
    (the descent sped up, or slowed down, across the window); the statistic is
    ``|h| / se(h)`` with ``se`` from that fit's robust residual scale.

  A bump is ``max(hump, shift) > K`` with ``K = 3.5``. K was chosen on synthetic smooth
  curves ``L = c + a t^-b + noise`` (``b`` in 0.15..0.6, ``c`` in 1.5..3.5, Gaussian
  noise of SD 0.001..0.03 nats, checkpoints every 25 steps of 4,096 tokens, a 7-checkpoint
  window anywhere with >= 6 checkpoints of context each side): the 95th percentile of
  ``max(hump, shift)`` there is 3.0, and the measured false-positive rate at K = 3.5 is
  1.9% (8 checkpoints of context) to 3.0% (6), over 1,000 draws each; the unit test
  re-measures it on 300 seeded draws (``tests/unit/test_phase_change.py``). Planted
  departures of 10 noise SDs are found in 96-98% of draws for a hump (a Gaussian bump of
  width one checkpoint) and 67-86% for a shift (a sigmoid step of width 15 steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from jaxtyping import Float


@dataclass(frozen=True)
class Window:
    """A stretch of training between two checkpoints (steps; the end is included)."""

    start_step: int
    end_step: int
    mid_step: int
    base: float
    peak: float

    def contains(self, step: int, slack: int = 0, steps: Sequence[int] = ()) -> bool:
        """Whether ``step`` lies in the window widened by ``slack`` checkpoints each side."""
        lo, hi = self.widened(slack, steps)
        return lo <= step <= hi

    def widened(self, slack: int, steps: Sequence[int]) -> tuple[int, int]:
        """The window's ends moved out by ``slack`` checkpoints (within ``steps``)."""
        if not slack or not len(steps):
            return self.start_step, self.end_step
        s = list(steps)
        i, j = s.index(self.start_step), s.index(self.end_step)
        return s[max(0, i - slack)], s[min(len(s) - 1, j + slack)]


def _check(steps: Sequence[int], values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(steps, dtype=float)
    v = np.asarray(values, dtype=float)
    if s.shape != v.shape or s.ndim != 1 or len(s) < 2:
        raise ValueError("steps and values must be 1-d, of equal length, at least 2")
    if np.any(np.diff(s) <= 0):
        raise ValueError("steps must increase")
    return s, v


def running_median(values: Sequence[float]) -> Float[np.ndarray, " checkpoint"]:
    """Running median of 3, with Tukey's end-point rule (see the module docstring)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 3:
        return v.copy()
    out = v.copy()
    out[1:-1] = np.median(np.stack([v[:-2], v[1:-1], v[2:]]), axis=0)
    out[0] = np.median([v[0], out[1], 3 * out[1] - 2 * out[2]])
    out[-1] = np.median([v[-1], out[-2], 3 * out[-2] - 2 * out[-3]])
    return out


def rise_window(steps: Sequence[int], values: Sequence[float], *, min_rise: float,
                low: float = 0.2, high: float = 0.8) -> Window | None:
    """The window where ``values`` rise fastest (see the module docstring), or ``None``.

    Args:
        steps: checkpoint steps, increasing.
        values: e.g. the largest induction score of any head at each checkpoint.
        min_rise: below this total rise (of the smoothed curve) there is no phase change
            to find; a curve that never rises has none even with ``min_rise=0``.
        low, high: fractions of the rise that bound the window.

    Returns:
        The window, with ``base`` and ``peak`` read from the smoothed curve.
    """
    s, _ = _check(steps, values)
    v = running_median(values)
    peak_i = int(np.nanargmax(v))
    base_i = int(np.nanargmin(v[: peak_i + 1]))
    base, peak = float(v[base_i]), float(v[peak_i])
    rise = peak - base
    if not (rise >= min_rise and rise > 0):
        return None
    # base_i < peak_i since rise > 0, so base_i itself is below and the peak above
    start_i = max(i for i in range(base_i, peak_i) if v[i] <= base + low * rise)
    end_i = next(i for i in range(start_i + 1, peak_i + 1) if v[i] >= base + high * rise)
    rates = np.diff(v[start_i: end_i + 1]) / np.diff(s[start_i: end_i + 1])
    mid_i = start_i + 1 + int(np.argmax(rates))
    return Window(int(s[start_i]), int(s[end_i]), int(s[mid_i]), base, peak)


def fastest_drop(steps: Sequence[int], values: Sequence[float]) -> tuple[int, int, float]:
    """The interval ``(step_before, step_after, change per 1000 steps)`` where ``values``
    fall fastest per step."""
    s, v = _check(steps, values)
    rates = np.diff(v) / np.diff(s)
    j = int(np.nanargmin(rates))
    return int(s[j]), int(s[j + 1]), float(rates[j] * 1000)


def descent_rates(tokens: Sequence[int], loss: Sequence[float]
                  ) -> Float[np.ndarray, " interval"]:
    """Loss decrease per e-fold of tokens on each interval between checkpoints.

    Intervals that start at 0 tokens (the initialisation) have no log-width and get NaN.
    """
    t, v = _check(tokens, loss)
    with np.errstate(divide="ignore", invalid="ignore"):
        width = np.diff(np.log(t))
        rates = -np.diff(v) / width
    rates[~np.isfinite(width)] = np.nan
    return rates




CONTEXT = 8
"""Checkpoints each side of the window that the smooth fit uses, at most."""
MIN_CONTEXT = 6
"""Checkpoints each side needed to run the test at all."""
K = 3.5
"""Noise SDs a departure must exceed (false-positive rate <= 3% on smooth curves)."""
_DEGREE = 2


@dataclass(frozen=True)
class Bump:
    """The loss-bump test on one window (see :func:`loss_bump`)."""

    tested: bool
    """Whether there were enough checkpoints around the window to run the test."""
    present: bool
    """``max(hump, shift) > threshold``; false when not tested."""
    step: int
    """The checkpoint inside the window furthest from the smooth fit."""
    excess: float
    """The loss there minus the fit (nats; positive: above the smooth curve)."""
    shift: float
    """Offset ``h`` of the loss after the window from the trend before it (nats)."""
    noise: float
    """Robust residual scale of the fit outside the window (nats)."""
    hump_z: float
    shift_z: float
    threshold: float = K

    @property
    def z(self) -> float:
        """The test statistic, ``max(hump_z, shift_z)`` (noise SDs)."""
        return max(self.hump_z, self.shift_z)


def _robust_scale(residuals: np.ndarray, n_params: int) -> float:
    n = len(residuals)
    mad = float(np.median(np.abs(residuals - np.median(residuals))))
    return 1.4826 * mad * float(np.sqrt(n / (n - n_params)))


def _untested(end_step: int) -> Bump:
    nan = float("nan")
    return Bump(False, False, int(end_step), nan, nan, nan, nan, nan)


def loss_bump(steps: Sequence[int], tokens: Sequence[int], loss: Sequence[float],
              start_step: int, end_step: int, *, threshold: float = K,
              context: int = CONTEXT, min_context: int = MIN_CONTEXT) -> Bump:
    """Does the loss inside ``[start_step, end_step]`` depart from the smooth curve of the
    checkpoints around it by more than ``threshold`` noise SDs? (module docstring)

    Args:
        steps, tokens, loss: the curve at each checkpoint (steps increasing).
        start_step, end_step: the window (both ends included; at least 2 checkpoints).
        threshold: the noise SDs a departure must exceed; the default ``K`` holds the
            false-positive rate on smooth noisy curves at or below 3%.
        context, min_context: checkpoints each side the fit uses, at most and at least.

    Returns:
        The test's outcome; ``tested`` is false (and ``present`` false) when the window
        has fewer than 2 checkpoints or fewer than ``min_context`` checkpoints with
        tokens > 0 on either side.
    """
    s, v = _check(steps, loss)
    t = np.asarray(tokens, dtype=float)
    if t.shape != s.shape:
        raise ValueError("tokens must have one entry per step")
    inside = np.flatnonzero((s >= start_step) & (s <= end_step))
    before = np.flatnonzero((s < start_step) & (t > 0))[-context:]
    after = np.flatnonzero((s > end_step) & (t > 0))[:context]
    if len(inside) < 2 or min(len(before), len(after)) < min_context or np.any(t[inside] <= 0):
        return _untested(end_step)
    x = np.log(np.where(t > 0, t, 1.0))  # only checkpoints with tokens > 0 are used
    out = np.r_[before, after]
    x0 = float(x[out].mean())
    design = np.vander(x[out] - x0, _DEGREE + 1)
    coef, *_ = np.linalg.lstsq(design, v[out], rcond=None)
    floor = 1e-9 * max(1.0, float(np.max(np.abs(v[out]))))  # a noise-free curve: no 0/0
    noise = max(_robust_scale(v[out] - design @ coef, _DEGREE + 1), floor)
    excess = v[inside] - np.vander(x[inside] - x0, _DEGREE + 1) @ coef
    z = excess / noise
    same = np.sign(z[:-1]) == np.sign(z[1:])
    hump_z = float(np.max(np.where(same, np.minimum(abs(z[:-1]), abs(z[1:])), 0.0)))
    # the same fit with one more term: a level for the checkpoints after the window
    stepped = np.c_[design, np.r_[np.zeros(len(before)), np.ones(len(after))]]
    coef2, *_ = np.linalg.lstsq(stepped, v[out], rcond=None)
    se = max(_robust_scale(v[out] - stepped @ coef2, _DEGREE + 2), floor) * float(
        np.sqrt(np.linalg.inv(stepped.T @ stepped)[-1, -1]))
    shift_z = float(abs(coef2[-1]) / se)
    j = int(np.argmax(np.abs(excess)))
    return Bump(True, bool(max(hump_z, shift_z) > threshold), int(s[inside[j]]),
                float(excess[j]), float(coef2[-1]), noise, hump_z, shift_z, threshold)
