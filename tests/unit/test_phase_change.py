"""The phase-change detectors on synthetic curves with a known answer: the loss-bump test
holds its false-positive rate on smooth noisy power laws and finds planted bumps, and a
one-checkpoint spike moves neither the rise window nor the bump test."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.scores import phase_change

# the demo's checkpoint grid: every 25 steps of 32 x 128 tokens, to step 1000
STEPS = np.arange(0, 1001, 25)
TOKENS = STEPS * 4096
WIDTH = 7  # checkpoints in a window (the demo's widened window, 300-450, has 7)
N_DRAWS = 300


def power_law(rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """A smooth loss curve ``c + a t^-b`` (t in tokens; 2-4 nats above c at 1e5 tokens)
    and a noise SD of 0.001-0.03 nats, all drawn from ``rng``."""
    b, c = rng.uniform(0.15, 0.6), rng.uniform(1.5, 3.5)
    a = rng.uniform(2, 4) * 1e5 ** b
    return c + a * np.maximum(TOKENS, 1.0) ** -b, float(rng.uniform(0.001, 0.03))


def window_at(rng: np.random.Generator) -> tuple[int, int, int]:
    """A window with at least 6 checkpoints of context either side (after step 0)."""
    first = int(rng.integers(1 + phase_change.MIN_CONTEXT,
                             len(STEPS) - WIDTH - phase_change.MIN_CONTEXT + 1))
    return first, int(STEPS[first]), int(STEPS[first + WIDTH - 1])


def draws(planted=None):
    """``N_DRAWS`` seeded curves with noise, each with a window and (optionally) a
    departure ``planted(centre_step, noise_sd)`` added to it."""
    for seed in range(N_DRAWS):
        rng = np.random.default_rng(seed)
        smooth, sd = power_law(rng)
        first, lo, hi = window_at(rng)
        loss = smooth + sd * rng.standard_normal(len(STEPS))
        if planted is not None:
            loss = loss + planted(STEPS[first + WIDTH // 2], sd)
        yield loss, lo, hi


def rate(planted=None) -> float:
    found = [phase_change.loss_bump(STEPS, TOKENS, loss, lo, hi)
             for loss, lo, hi in draws(planted)]
    assert all(b.tested for b in found) and len(found) == N_DRAWS
    return sum(b.present for b in found) / len(found)


def test_false_positive_rate_on_smooth_noisy_power_laws_is_below_5_percent():
    assert rate() < 0.05  # 300 seeded curves (seeds 0-299) with no bump


def test_a_pause_of_10_noise_sds_is_found():
    # the descent pauses: a Gaussian hump of height 10 SDs and width one checkpoint
    def hump(centre, sd):
        return 10 * sd * np.exp(-0.5 * ((STEPS - centre) / 25.0) ** 2)
    assert rate(hump) > 0.8


def test_a_speed_up_of_20_noise_sds_is_found():
    # the descent speeds up and the loss stays lower: a sigmoid step down of 20 SDs
    def step_down(centre, sd):
        return -20 * sd / (1 + np.exp(-(STEPS - centre) / 15.0))
    assert rate(step_down) > 0.8


def test_a_one_checkpoint_spike_is_not_a_bump():
    rng = np.random.default_rng(7)
    smooth, sd = power_law(rng)
    loss = smooth + sd * rng.standard_normal(len(STEPS))
    lo, hi = 300, 450
    assert not phase_change.loss_bump(STEPS, TOKENS, loss, lo, hi).present
    for where in (325, 375, 450):
        spiked = loss.copy()
        spiked[list(STEPS).index(where)] += 100 * sd  # far above anything else but the start
        bump = phase_change.loss_bump(STEPS, TOKENS, spiked, lo, hi)
        assert bump.tested and not bump.present
        assert bump.step == where  # it is seen, and found not to persist


def test_the_test_needs_context_around_the_window():
    smooth, _ = power_law(np.random.default_rng(0))
    early = phase_change.loss_bump(STEPS, TOKENS, smooth, 50, 200)  # 1 checkpoint before
    late = phase_change.loss_bump(STEPS, TOKENS, smooth, 800, 950)  # 2 after
    assert not early.tested and not early.present and not late.tested
    assert np.isnan(early.z)
    flat = phase_change.loss_bump(STEPS, TOKENS, np.full(len(STEPS), 2.0), 300, 450)
    assert flat.tested and not flat.present  # no noise and no departure: no bump


def sigmoid(centre, width, low=0.02, high=0.7):
    return low + (high - low) / (1 + np.exp(-(STEPS - centre) / width))


def test_a_one_checkpoint_spike_does_not_move_the_rise_window():
    values = sigmoid(500, 30)
    window = phase_change.rise_window(STEPS, values, min_rise=0.3)
    # 20% and 80% of the rise are crossed at 500 -/+ 30 ln 4 = 458 and 542
    assert (window.start_step, window.end_step) == (450, 550)
    for where in (100, 800, 1000):  # before the rise, after it, the last checkpoint
        spiked = values.copy()
        spiked[list(STEPS).index(where)] = 0.95  # the global maximum, for one checkpoint
        again = phase_change.rise_window(STEPS, spiked, min_rise=0.3)
        assert (again.start_step, again.end_step) == (450, 550)
        assert again.peak == pytest.approx(0.7, abs=1e-3)
    lone = np.full(len(STEPS), 0.02)
    lone[STEPS == 600] = 0.9  # a rise that lasts one checkpoint is no phase change
    assert phase_change.rise_window(STEPS, lone, min_rise=0.3) is None


def test_a_rise_held_for_two_checkpoints_counts():
    values = np.full(len(STEPS), 0.02)
    values[(STEPS >= 600) & (STEPS <= 625)] = 0.9
    window = phase_change.rise_window(STEPS, values, min_rise=0.3)
    assert (window.start_step, window.end_step) == (575, 600)


def test_running_median_leaves_a_monotone_curve_alone():
    values = sigmoid(500, 60)
    np.testing.assert_array_equal(phase_change.running_median(values), values)
    assert phase_change.running_median([3.0, 1.0, 2.0, 9.0, 4.0]).tolist() == [
        2.0, 2.0, 2.0, 4.0, 4.0]  # ends: median(3, 2, 3*2-2*2=2), median(4, 4, 3*4-2*2=8)


@pytest.mark.parametrize("values", [np.full(len(STEPS), 0.3),
                                    np.linspace(0.9, 0.1, len(STEPS))])
def test_min_rise_zero_on_a_curve_that_never_rises_is_no_window(values):
    assert phase_change.rise_window(STEPS, values, min_rise=0) is None


def test_min_rise_zero_on_noise_is_a_defined_window():
    values = 0.03 + 0.02 * np.random.default_rng(0).random(len(STEPS))
    window = phase_change.rise_window(STEPS, values, min_rise=0)
    assert window is not None and window.start_step < window.end_step
    assert window.base < window.peak
