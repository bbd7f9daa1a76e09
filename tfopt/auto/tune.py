"""Auto mode: diagnose the baseline, try the candidate recipes on this machine, keep only what helps.

Rules of thumb (XLA pays off on GPUs, bf16 on hardware with bf16 units) are right on average and wrong on the
user's own machine often enough to matter: the XLA method card (docs/recipes/xla.md) records it making a small
CNN slower on a CPU-only machine while bf16 made it faster there. So auto mode measures, within a time budget,
and keeps a recipe only if its gain is larger than the noise of the machine and the loss stays where float32
puts it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfopt.auto.candidates import choose_candidates
from tfopt.auto.decide import LOSS_TOLERANCE, NOISE_FLOOR_FRACTION
from tfopt.auto.search import ProgressEvent, search
from tfopt.auto.table import TrialsTable
from tfopt.auto.trials import TrialRunner
from tfopt.errors import RecipeConfigError
from tfopt.plan import Plan
from tfopt.recipes.base import Recipe, chain
from tfopt.rewrites.batch_norm import fusable_batch_norms

if TYPE_CHECKING:
    import keras

    from tfopt.builder import Built
    from tfopt.profiling.diagnose import Diagnosis

_log = logging.getLogger("tfopt")

DEFAULT_BUDGET_SECONDS = 120.0
MAX_STEPS_FACTOR = 4
PROFILE_MIN_BUDGET_SECONDS = 60.0
"""A profiler trace and its analysis take seconds even on a small model: below this budget, the measured
input efficiency alone decides whether the input pipeline is a candidate."""


@dataclasses.dataclass(frozen=True)
class Tuning:
    """What auto mode chose and the evidence.

    Attributes:
        recipe: The kept recipes as one chain (empty where nothing beat the baseline).
        plan: The baseline plan with that chain applied, and one "auto" step per candidate decision.
        table: Every trial, with speed, spread, ratio, compile time, loss difference and verdict.
        diagnosis: The profiler's diagnosis of the baseline, or None where profiling was unavailable.
        input_efficiency: The baseline's on-device ceiling step time / real step time, None where the
            reading was a measurement problem.

    Example:
        >>> tuning = tune(plan, budget_seconds=120)  # doctest: +SKIP
        >>> print(tuning.table.to_markdown())  # doctest: +SKIP
    """

    recipe: Recipe
    plan: Plan
    table: TrialsTable
    diagnosis: Diagnosis
    input_efficiency: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": list(self.table.chosen),
            "input_efficiency": self.input_efficiency,
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis is not None else None,
            "trials": self.table.to_dict(),
        }


def tune(
    plan: Plan,
    *,
    budget_seconds: float = DEFAULT_BUDGET_SECONDS,
    steps: int = 10,
    warmup_steps: int = 3,
    numerics_steps: int = 5,
    loss_tolerance: float = LOSS_TOLERANCE,
    noise_floor: float = NOISE_FLOOR_FRACTION,
    profile: bool | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    built: Built | None = None,
) -> Tuning:
    """Finds the recipes that make this model train faster on this machine, by measuring them.

    Diagnoses the baseline (the profiler's diagnosis where it works, else the input efficiency measured
    against the compute-only ceiling), picks candidates from the diagnosis and the hardware, and runs
    short trials (see `tfopt.auto.search`): the baseline twice, each candidate alone, and the best
    combination found greedily. Every trial starts from the same weights on the same batches.

    Args:
        plan: The baseline plan (`tfopt.plan.make_plan`).
        budget_seconds: Time for all of it, diagnosis included; kept within about 10% (a compilation in
            progress cannot be interrupted).
        steps: Timed steps per trial at least; up to `MAX_STEPS_FACTOR` times more where the budget has
            room, since longer trials average out a noisy machine.
        warmup_steps: Untimed steps before them.
        numerics_steps: Steps of the loss trajectory compared with the float32 baseline.
        loss_tolerance: Largest accepted relative step-by-step loss difference.
        noise_floor: The smallest speed gain ever trusted.
        profile: Diagnose with the TF Profiler (True), by timing alone (False), or by the profiler when the
            budget is at least `PROFILE_MIN_BUDGET_SECONDS` (None).
        on_progress: Receives a `ProgressEvent` before and after each phase and trial.
        built: The baseline already built (`tfopt.builder.build(plan)`), so it is not built again.

    Returns:
        The chosen recipes, the plan they make, and the trials table.

    Raises:
        RecipeConfigError: The budget is not a positive number, or the model runs several steps per call.
        MeasurementError: The baseline itself could not be trained and timed.

    Example:
        >>> tuning = tune(make_plan(model, dataset, hardware=detect()), budget_seconds=60)  # doctest: +SKIP
        >>> print(tuning.table.to_text())  # doctest: +SKIP
    """
    if isinstance(budget_seconds, bool) or not isinstance(budget_seconds, (int, float)) or not budget_seconds > 0:
        raise RecipeConfigError(
            f"auto: tune budget {budget_seconds!r} is not valid. Expected a positive number "
            "of seconds, e.g. 120 (on the command line: --tune-budget 120s)."
        )
    steps_per_execution = plan.compile_config.get("steps_per_execution") or 1
    if steps_per_execution != 1:
        # Keras reports the loss once per call of steps_per_execution steps, so the per-step loss
        # trajectories that decide "same numerics" cannot be compared.
        raise RecipeConfigError(
            f"auto: the model is compiled with steps_per_execution={steps_per_execution}; auto mode compares "
            "losses step by step, which Keras only reports with steps_per_execution=1. Compile with "
            "steps_per_execution=1 for tuning, or choose the recipes yourself."
        )
    clock = time.monotonic
    start = clock()
    _progress(on_progress, "diagnosing the baseline", start, budget_seconds)
    runner = TrialRunner(
        plan, {}, steps=steps, warmup_steps=warmup_steps, numerics_steps=numerics_steps, clock=clock, built=built
    )
    if profile is None:
        profile = budget_seconds >= PROFILE_MIN_BUDGET_SECONDS
    baseline = runner.baseline(start + budget_seconds).model
    diagnosis, measurement = _diagnose(baseline, plan, steps=steps, warmup_steps=warmup_steps, profile=profile)
    input_efficiency = measurement.input_efficiency
    candidates = choose_candidates(
        plan.hardware,
        input_efficiency=input_efficiency,
        diagnosis=diagnosis,
        fusable_batch_norms=len(fusable_batch_norms(baseline)),
    )
    runner.steps = _steps_for_budget(
        steps,
        warmup_steps + numerics_steps,
        measurement.real.median_seconds,
        trials=1 + 2 * len(candidates.recipes),
        seconds_left=start + budget_seconds - clock(),
    )
    _log.info(
        "auto: candidates %s; not tried: %s",
        ", ".join(candidates.recipes) or "none",
        "; ".join(f"{name} ({why})" for name, why in candidates.not_tried.items()) or "none",
    )
    runner.recipes.update(candidates.recipes)  # the baseline model it built and compiled is shared
    table = search(
        list(candidates.recipes),
        runner,
        budget_seconds=budget_seconds,
        clock=clock,
        start=start,
        loss_tolerance=loss_tolerance,
        noise_floor=noise_floor,
        not_tried=candidates.not_tried,
        notes=candidates.notes,
        on_progress=on_progress,
        alternatives=candidates.alternatives,
    )
    recipe = chain(*(candidates.recipes[label] for label in table.chosen))
    tuned = recipe(plan)
    for decision in table.decisions:
        tuned = tuned.record("auto", str(decision), skipped=not decision.kept)
    return Tuning(recipe=recipe, plan=tuned, table=table, diagnosis=diagnosis, input_efficiency=input_efficiency)


def _diagnose(model: keras.Model, plan: Plan, *, steps: int, warmup_steps: int, profile: bool) -> tuple[Any, Any]:
    """The profiler's diagnosis and the baseline's measurement, or the measurement alone."""
    from tfopt.errors import TfoptError
    from tfopt.profiling.measurement import measure

    dataset = plan.dataset
    if profile:
        try:
            from tfopt.profiling.capture import profile as capture_profile

            # Half the trial's steps: the diagnosis only has to tell input-bound from not.
            result = capture_profile(
                model, dataset, steps=max(2, steps // 2), warmup_steps=warmup_steps, hardware=plan.hardware
            )
            return result.diagnosis, result.measurement
        except (ImportError, TfoptError) as error:
            _log.warning(
                "auto: profiling the baseline failed (%s); deciding by the measured input efficiency alone", error
            )
    measurement = measure(
        model,
        dataset,
        steps=max(2, steps // 2),
        warmup_steps=warmup_steps,
        batch_size=plan.batch_size,
        hardware=plan.hardware,
    )
    return None, measurement


def _steps_for_budget(steps: int, other_steps: int, step_seconds: float, *, trials: int, seconds_left: float) -> int:
    """More timed steps where the budget has room: longer trials average out a noisy machine.

    Plans on half the time left (compilation and slower candidates take the rest), never fewer than
    `steps` and at most `MAX_STEPS_FACTOR` times as many.

    Example:
        >>> _steps_for_budget(10, 8, 0.1, trials=5, seconds_left=100.0)
        40
    """
    affordable = int(0.5 * seconds_left / trials / step_seconds) - other_steps
    return max(steps, min(affordable, MAX_STEPS_FACTOR * steps))


def _progress(
    on_progress: Callable[[ProgressEvent], None] | None, message: str, start: float, budget_seconds: float
) -> None:
    _log.info("auto: %s", message)
    if on_progress is not None:
        on_progress(ProgressEvent(message, time.monotonic() - start, budget_seconds, 0, 0))
