"""The pure judgement of auto mode: how noisy the machine is, and whether a trial helped.

Everything here is a function of numbers already measured, so every rule (noise, ties, broken numerics,
failures) is tested with faked trial results. The rules:

- **Speed** is throughput over the timed steps (examples / total time), what an epoch costs. A median
  step would hide the slow steps of a starved pipeline, whose steps alternate between a batch that was
  ready and one that was not.
- **Noise** is how far two runs of the unchanged baseline differ (a shared or throttling machine shows
  up there), at least `NOISE_FLOOR_FRACTION`, which keeps a lucky 1% from counting as a gain. With a
  single baseline run (the budget ran out), twice the standard error of its mean step stands in.
- A configuration is **kept** only if its examples/s beat the reference (the baseline, or the best
  configuration so far when combining) by more than the noise, and its loss trajectory stays within
  `loss_tolerance` of the float32 baseline's, step by step, from the same weights on the same batches.
- A tie (within the noise) is rejected: a recipe has to earn its place, since each one adds something
  that can go wrong (numerics, memory, compile time).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from tfopt.profiling.timing import StepTimes

NOISE_FLOOR_FRACTION = 0.03
"""No gain below 3% is trusted, however quiet the machine looked."""

LOSS_TOLERANCE = 0.02
"""Largest step-by-step loss difference from the float32 baseline, as a fraction of the baseline's largest
loss, that still counts as the same training. bfloat16 keeps 8 significant bits, so after a few optimizer
steps its loss differs from float32's by well under 2% on healthy models; a recipe that breaks numerics
(overflow, NaN, a lost loss scale) differs by far more."""


def throughput(step_times: StepTimes) -> float:
    """Examples per second over all timed steps: total examples / total time.

    Example:
        >>> throughput(StepTimes((0.1, 0.3), 8))
        40.0
    """
    return step_times.batch_size * len(step_times.seconds) / sum(step_times.seconds)


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """What one trial of one configuration measured.

    Attributes:
        configuration: The candidate labels in this configuration; () is the baseline.
        step_times: The timed steps, or None where the trial did not get that far.
        compile_seconds: First-step time beyond a steady step (tracing, XLA compilation), or None where
            the trial reused an already compiled model.
        losses: The per-step loss on the fixed numerics batches, from the shared initial weights.
        wall_seconds: Everything the trial took: building, compiling, the numerics and the timed steps.
        error: Why the trial failed (the recipe raised, building or training failed), else None.
        skipped: Why a recipe declined to change anything (e.g. a layer without XLA support), else None.
        stopped_by_budget: The time budget ran out during the trial, so it measured too few steps.
    """

    configuration: tuple[str, ...]
    step_times: StepTimes | None = None
    compile_seconds: float | None = None
    losses: tuple[float, ...] | None = None
    wall_seconds: float = 0.0
    error: str | None = None
    skipped: str | None = None
    stopped_by_budget: bool = False

    @property
    def label(self) -> str:
        return " + ".join(self.configuration) or "baseline"

    @property
    def measured(self) -> bool:
        """Whether the trial produced a speed to compare."""
        return self.step_times is not None and not self.error and not self.skipped and not self.stopped_by_budget

    @property
    def examples_per_second(self) -> float | None:
        return throughput(self.step_times) if self.measured else None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The decision on one trial.

    Attributes:
        status: "kept", "rejected", "failed" (raised or declined), or "not measured" (budget).
        ratio: Examples/s relative to the reference configuration, where measured.
        loss_deviation: Largest loss difference from the float32 baseline, relative to its largest
            loss, where checked.
        reason: One line with the numbers behind the decision.
        numerics_ok: False where the loss left the tolerance (or was not finite).
    """

    status: str
    ratio: float | None
    loss_deviation: float | None
    reason: str
    numerics_ok: bool = True

    @property
    def kept(self) -> bool:
        return self.status == "kept"


def noise_fraction(baseline_runs: Sequence[StepTimes], *, floor: float = NOISE_FLOOR_FRACTION) -> float:
    """The relative speed difference that measurement noise alone can produce on this machine.

    Args:
        baseline_runs: Timed runs of the unchanged baseline (one or more).
        floor: The smallest noise ever assumed.

    Returns:
        A fraction: 0.05 means a configuration must be more than 5% faster to count as faster.

    Example:
        >>> from tfopt.profiling.timing import StepTimes
        >>> runs = [StepTimes((0.10,) * 9, 8), StepTimes((0.11,) * 9, 8)]
        >>> round(noise_fraction(runs), 3)
        0.1
    """
    if not baseline_runs:
        raise ValueError("noise_fraction needs at least one baseline run; received none.")
    speeds = [throughput(run) for run in baseline_runs]
    if len(speeds) > 1:
        return max(floor, max(speeds) / min(speeds) - 1.0)
    (run,) = baseline_runs
    mean = statistics.fmean(run.seconds)
    return max(floor, 2 * statistics.stdev(run.seconds) / (mean * math.sqrt(len(run.seconds))))


def loss_deviation(reference: Sequence[float], losses: Sequence[float]) -> float:
    """The largest step-by-step difference between two loss trajectories, relative to the reference's scale.

    The scale is the reference trajectory's largest loss, not each step's own: once a loss approaches
    zero (a small model fitting a few batches), a step-by-step ratio turns a difference of 0.003 into
    "30%", and bf16 would be rejected for rounding that does not matter. Inf where a loss is not finite.

    Example:
        >>> round(loss_deviation([2.0, 1.0], [2.02, 0.99]), 3)
        0.01
        >>> round(loss_deviation([1.6, 0.01], [1.6, 0.013]), 4)  # near zero: 0.003 of a 1.6 scale
        0.0019
    """
    if len(reference) != len(losses) or not reference:
        raise ValueError(
            f"Loss trajectories must have the same, nonzero length; received {len(reference)} and {len(losses)} steps."
        )
    if not all(math.isfinite(value) for value in losses):
        return math.inf
    scale = max([*(abs(ref) for ref in reference), 1e-12])
    return max(abs(value - ref) for ref, value in zip(reference, losses)) / scale


def judge(
    trial: TrialResult,
    *,
    reference_examples_per_second: float,
    reference_label: str = "baseline",
    reference_losses: Sequence[float] | None,
    noise: float,
    loss_tolerance: float = LOSS_TOLERANCE,
) -> Verdict:
    """Keeps a configuration only if it is faster than the reference beyond the noise, with sound numerics.

    Args:
        trial: The configuration's trial.
        reference_examples_per_second: The speed to beat (the baseline's, or the best so far).
        reference_label: How the reasons name the reference.
        reference_losses: The float32 baseline's loss trajectory on the same batches from the same
            weights; None skips the numerics check (no trajectory was recorded).
        noise: From `noise_fraction`.
        loss_tolerance: Largest accepted relative loss difference.

    Returns:
        The verdict, with the numbers in its reason.

    Example:
        >>> from tfopt.profiling.timing import StepTimes
        >>> slow = TrialResult(("xla",), StepTimes((0.2,) * 8, 8), losses=(1.0,))
        >>> judge(slow, reference_examples_per_second=80.0, reference_losses=(1.0,), noise=0.03).reason
        'rejected: 0.50x baseline on this machine (noise 3%)'
    """
    if trial.error:
        return Verdict("failed", None, None, f"failed: {trial.error}")
    if trial.skipped:
        return Verdict("failed", None, None, f"not applicable: {trial.skipped}")
    if not trial.measured:
        return Verdict("not measured", None, None, "not measured: the time budget ran out during the trial")
    deviation = None
    if reference_losses is not None and trial.losses is not None:
        deviation = loss_deviation(reference_losses, trial.losses)
    ratio = trial.examples_per_second / reference_examples_per_second
    versus = f"{ratio:.2f}x {reference_label}"
    if deviation is not None and deviation > loss_tolerance:
        what = "loss is not finite" if math.isinf(deviation) else f"loss differs {deviation:.1%} from float32"
        return Verdict(
            "rejected",
            ratio,
            deviation,
            f"rejected: {what} (tolerance {loss_tolerance:.0%}), although {versus}",
            numerics_ok=False,
        )
    if ratio - 1.0 <= noise:
        why = "slower" if ratio < 1.0 - noise else "within the noise"
        if why == "slower":
            return Verdict("rejected", ratio, deviation, f"rejected: {versus} on this machine (noise {noise:.0%})")
        return Verdict("rejected", ratio, deviation, f"rejected: {versus} is {why} ({noise:.0%})")
    numerics = "" if deviation is None else (", same numerics" if deviation == 0 else f", loss within {deviation:.2%}")
    return Verdict("kept", ratio, deviation, f"kept: {versus}{numerics}")
