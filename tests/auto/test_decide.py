"""The pure verdicts of auto mode: noise, ties, broken numerics, failures."""

import math

import pytest

from tfopt.auto.decide import TrialResult, judge, loss_deviation, noise_fraction, throughput
from tfopt.profiling.timing import StepTimes

LOSSES = (2.0, 1.8, 1.6, 1.5)


def trial(step_seconds, losses=LOSSES, **fields):
    return TrialResult(("candidate",), StepTimes((step_seconds,) * 8, 16), losses=losses, **fields)


def test_throughput_is_examples_over_total_time():
    # A starved pipeline alternates ready and waiting batches: the median (0.1 s) would claim 160/s.
    assert throughput(StepTimes((0.1, 0.1, 0.1, 0.5, 0.5), 16)) == pytest.approx(16 * 5 / 1.3)


def test_noise_is_the_difference_between_baseline_runs():
    runs = [StepTimes((0.100,) * 8, 16), StepTimes((0.108,) * 8, 16)]
    assert noise_fraction(runs) == pytest.approx(0.08)


def test_noise_never_below_the_floor():
    runs = [StepTimes((0.1,) * 8, 16), StepTimes((0.1,) * 8, 16)]
    assert noise_fraction(runs, floor=0.03) == 0.03


def test_single_baseline_run_uses_twice_the_standard_error_of_its_mean():
    run = StepTimes((0.1, 0.3) * 4, 16)  # mean 0.2, sample stdev 0.1069, n=8
    assert noise_fraction([run], floor=0.0) == pytest.approx(2 * 0.106904 / (0.2 * math.sqrt(8)), rel=1e-4)


def test_noise_needs_a_run():
    with pytest.raises(ValueError, match="at least one baseline run"):
        noise_fraction([])


def test_loss_deviation_is_the_largest_step_difference_relative_to_the_loss_scale():
    assert loss_deviation((2.0, 1.0), (2.0, 1.05)) == pytest.approx(0.025)
    assert loss_deviation((2.0, 1.0), (2.1, 1.0)) == pytest.approx(0.05)
    # A loss near zero does not blow a rounding difference up into a large relative one.
    assert loss_deviation((1.6, 0.01), (1.6, 0.013)) == pytest.approx(0.003 / 1.6)
    assert loss_deviation((2.0, 1.0), (2.0, float("nan"))) == math.inf
    with pytest.raises(ValueError, match="same, nonzero length"):
        loss_deviation((2.0,), (2.0, 1.0))


def test_faster_beyond_noise_with_sound_numerics_is_kept():
    verdict = judge(
        trial(0.08, losses=(2.0, 1.81, 1.6, 1.5)),
        reference_examples_per_second=160.0,
        reference_losses=LOSSES,
        noise=0.05,
        loss_tolerance=0.02,
    )
    assert verdict.kept and verdict.ratio == pytest.approx(1.25)
    assert verdict.loss_deviation == pytest.approx(0.01 / 2.0)  # relative to the largest baseline loss
    assert verdict.reason == "kept: 1.25x baseline, loss within 0.50%"


def test_gain_within_noise_is_a_tie_and_rejected():
    verdict = judge(trial(0.097), reference_examples_per_second=160.0, reference_losses=LOSSES, noise=0.05)
    assert verdict.status == "rejected" and verdict.ratio == pytest.approx(1 / 0.97)
    assert "within the noise (5%)" in verdict.reason


def test_exact_noise_boundary_is_not_a_gain():
    # ratio - 1 == noise: not *beyond* the noise.
    verdict = judge(trial(0.08), reference_examples_per_second=200.0 / 1.25, reference_losses=LOSSES, noise=0.25)
    assert not verdict.kept


def test_slower_is_rejected_with_the_ratio():
    verdict = judge(trial(0.2), reference_examples_per_second=160.0, reference_losses=LOSSES, noise=0.03)
    assert verdict.reason == "rejected: 0.50x baseline on this machine (noise 3%)"


def test_faster_but_broken_numerics_is_rejected():
    broken = trial(0.05, losses=(2.0, 1.8, 2.4, 3.1))
    verdict = judge(
        broken, reference_examples_per_second=160.0, reference_losses=LOSSES, noise=0.03, loss_tolerance=0.02
    )
    assert not verdict.kept and not verdict.numerics_ok and verdict.ratio == pytest.approx(2.0)
    assert "loss differs 80.0% from float32" in verdict.reason


def test_nan_loss_is_rejected():
    verdict = judge(
        trial(0.05, losses=(2.0, math.nan, math.nan, math.nan)),
        reference_examples_per_second=160.0,
        reference_losses=LOSSES,
        noise=0.03,
    )
    assert not verdict.numerics_ok and "loss is not finite" in verdict.reason


def test_failed_declined_and_unfinished_trials():
    failed = judge(
        TrialResult(("xla",), error="InvalidArgumentError: no XLA kernel"),
        reference_examples_per_second=1.0,
        reference_losses=LOSSES,
        noise=0.03,
    )
    declined = judge(
        TrialResult(("xla",), skipped="xla: layer 'lookup' does not support XLA"),
        reference_examples_per_second=1.0,
        reference_losses=LOSSES,
        noise=0.03,
    )
    unfinished = judge(
        TrialResult(("xla",), stopped_by_budget=True),
        reference_examples_per_second=1.0,
        reference_losses=LOSSES,
        noise=0.03,
    )
    assert (failed.status, failed.reason) == ("failed", "failed: InvalidArgumentError: no XLA kernel")
    assert declined.status == "failed" and declined.reason.startswith("not applicable: xla: layer")
    assert unfinished.status == "not measured" and unfinished.ratio is None
