"""Find a phase change in training curves measured at checkpoints.

Pure functions on ``(steps, values)`` arrays, so they can be checked on synthetic curves
with a known answer. Used by the ``induction-formation`` experiment (Olsson et al. 2022,
"In-context Learning and Induction Heads", section 3: induction heads form in a narrow
window of training, together with a jump in in-context learning and a bump in the loss).

- :func:`rise_window`: where a score rises fastest. With ``base`` the lowest value up to
  the peak and ``rise = peak - base``, the window runs from the last checkpoint before the
  peak still at or below ``base + low * rise`` to the first checkpoint at or above
  ``base + high * rise`` (20% and 80% by default); no window when ``rise < min_rise``.
  For a sigmoid-shaped rise the window is centred on its steepest part. ``mid_step`` is
  the end of the interval with the largest rise per step.
- :func:`fastest_drop`: the interval between consecutive checkpoints where a curve falls
  fastest per step (the jump of the in-context-learning score).
- :func:`descent_rates` and :func:`loss_bump`: the rate at which the loss falls per
  e-fold of tokens, ``(L[j-1] - L[j]) / (log t[j] - log t[j-1])``. For a smooth
  power-law curve ``L = c + a t^-b`` this rate only ever decreases, so a *bump* is the
  rate rising again: the largest rate over the intervals inside a window exceeds the
  mean rate over the ``before`` intervals that precede it.
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


def rise_window(steps: Sequence[int], values: Sequence[float], *, min_rise: float,
                low: float = 0.2, high: float = 0.8) -> Window | None:
    """The window where ``values`` rise fastest (see the module docstring), or ``None``.

    Args:
        steps: checkpoint steps, increasing.
        values: e.g. the largest induction score of any head at each checkpoint.
        min_rise: below this total rise there is no phase change to find.
        low, high: fractions of the rise that bound the window.
    """
    s, v = _check(steps, values)
    peak_i = int(np.nanargmax(v))
    base_i = int(np.nanargmin(v[: peak_i + 1]))
    base, peak = float(v[base_i]), float(v[peak_i])
    rise = peak - base
    if not rise >= min_rise:
        return None
    below = [i for i in range(base_i, peak_i) if v[i] <= base + low * rise]
    start_i = below[-1]
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


@dataclass(frozen=True)
class Bump:
    """Whether the loss descent speeds up inside a window."""

    present: bool
    step: int
    rate_in: float
    rate_before: float

    @property
    def ratio(self) -> float:
        return self.rate_in / self.rate_before if self.rate_before > 0 else float("nan")


def loss_bump(steps: Sequence[int], tokens: Sequence[int], loss: Sequence[float],
              start_step: int, end_step: int, *, before: int = 2) -> Bump:
    """Does the loss fall faster (per e-fold of tokens) inside ``[start_step, end_step]``
    than in the ``before`` intervals just before it?

    Returns:
        ``present`` (the largest rate inside exceeds the mean rate before), the step that
        ends the fastest interval inside, and both rates. With no interval before the
        window (it starts at the first checkpoints) there is nothing to compare and
        ``present`` is false.
    """
    s = np.asarray(steps)
    rates = descent_rates(tokens, loss)
    inside = [j for j in range(len(rates)) if s[j] >= start_step and s[j + 1] <= end_step]
    prior = [j for j in range(len(rates)) if s[j + 1] <= start_step][-before:]
    prior = [j for j in prior if np.isfinite(rates[j])]
    if not inside:
        return Bump(False, int(end_step), float("nan"), float("nan"))
    j = inside[int(np.nanargmax(rates[inside]))]
    rate_in = float(rates[j])
    if not prior:
        return Bump(False, int(s[j + 1]), rate_in, float("nan"))
    rate_before = float(np.mean(rates[prior]))
    return Bump(bool(rate_in > rate_before), int(s[j + 1]), rate_in, rate_before)
