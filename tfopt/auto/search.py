"""The order of trials and the greedy search for the best combination, within a time budget.

`search` knows nothing about TensorFlow: it calls `run(configuration, deadline)` for each trial and a
`clock` for the time, so the whole search (noise, ties, broken numerics, failures, running out of time)
is tested with faked trials and a faked clock. The order:

1. the baseline, which also gives the time a trial takes;
2. every candidate alone;
3. the baseline again: the difference between its two runs is the machine's noise, and measuring it
   after the candidates spreads slow drift (thermal throttling, other processes) over both sides;
4. greedily, starting from the fastest candidate kept alone, add each remaining candidate that ran and
   kept the numerics, fastest alone first, and keep it if the combination beats the best so far beyond
   the noise. Candidates that did not help alone are tried too: a faster model is invisible while the
   input pipeline is the bottleneck (on a small CPU the pipeline's threads even take its cores), and
   shows once the pipeline is fixed.

A trial is started only if the time left covers the time the baseline trial took (and, until it has
run, the baseline's repeat as well); the runner stops a trial at the deadline. So the budget is kept up
to the overrun of one trial's compilation, which cannot be interrupted.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections.abc import Callable, Mapping, Sequence

from tfopt.auto.decide import LOSS_TOLERANCE, NOISE_FLOOR_FRACTION, TrialResult, Verdict, judge, noise_fraction
from tfopt.auto.table import Decision, TrialRow, TrialsTable
from tfopt.errors import MeasurementError

_log = logging.getLogger("tfopt")

Runner = Callable[[tuple[str, ...], float], TrialResult]
"""Runs one configuration (candidate labels; () is the baseline) and stops by the deadline (clock time)."""


@dataclasses.dataclass(frozen=True)
class ProgressEvent:
    """Where tuning is, for a progress bar: `tqdm(total=event.budget_seconds)` updated to `elapsed_seconds`.

    Attributes:
        message: What starts now, or what just finished.
        elapsed_seconds: Time since tuning started.
        budget_seconds: The tuning budget.
        trials_done: Trials finished so far.
        trials_planned: Trials the search will run if the budget allows.
    """

    message: str
    elapsed_seconds: float
    budget_seconds: float
    trials_done: int
    trials_planned: int


def search(
    candidates: Sequence[str],
    run: Runner,
    *,
    budget_seconds: float,
    clock: Callable[[], float],
    start: float | None = None,
    loss_tolerance: float = LOSS_TOLERANCE,
    noise_floor: float = NOISE_FLOOR_FRACTION,
    not_tried: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
    on_progress: Callable[[ProgressEvent], None] | None = None,
    alternatives: Mapping[str, str] | None = None,
) -> TrialsTable:
    """Measures the baseline and the candidates, combines the ones that help, and returns the trials table.

    Args:
        candidates: Candidate labels, most promising first (that order breaks ties).
        run: Runs one trial; see `Runner`. An exception it raises counts as that configuration failing.
        budget_seconds: Time for the whole search, counted from `start`.
        clock: Monotonic seconds (`time.monotonic`, or a fake in tests).
        start: When the budget started (e.g. before a diagnosis that shares it); now by default.
        loss_tolerance: Largest accepted relative loss difference from the float32 baseline.
        noise_floor: The smallest speed difference ever trusted.
        not_tried: Candidates left out before the search, with the reason; they get rows and decisions.
        notes: Context lines for the table (the diagnosis).
        on_progress: Called before and after each trial.
        alternatives: Candidate label -> the recipe it sets, where several candidates are settings of one
            recipe (`data_service` with 1 or 2 workers): each is tried alone, and only the fastest kept joins
            a combination.

    Returns:
        The trials table; `table.chosen` is the configuration to use.

    Raises:
        MeasurementError: The baseline itself could not be measured (the user's setup does not train).
    """
    state = _Search(candidates, run, budget_seconds, clock, clock() if start is None else start, on_progress)
    first = state.trial(())
    if not first.measured:
        raise MeasurementError(
            f"auto mode could not measure the baseline, the setup as given: "
            f"{first.error or first.skipped or 'the time budget ran out'}. Check that "
            "model.fit(dataset) trains, or give a larger tune budget."
        )
    alone: dict[str, TrialResult] = {}
    for candidate in candidates:
        if state.affordable(repeats_left=1):
            alone[candidate] = state.trial((candidate,))
    repeat = state.trial(()) if state.affordable(repeats_left=0) else None
    baseline_runs = [trial for trial in (first, repeat) if trial is not None and trial.measured]
    noise = noise_fraction([trial.step_times for trial in baseline_runs], floor=noise_floor)
    baseline_speed = statistics.fmean(trial.examples_per_second for trial in baseline_runs)

    def verdict(trial: TrialResult, speed: float, label: str) -> Verdict:
        return judge(
            trial,
            reference_examples_per_second=speed,
            reference_label=label,
            reference_losses=first.losses,
            noise=noise,
            loss_tolerance=loss_tolerance,
        )

    rows = [_row(first, "baseline", "baseline", "baseline: first run", baseline_speed)]
    decisions: dict[str, Decision] = {}
    verdicts = {candidate: verdict(trial, baseline_speed, "baseline") for candidate, trial in alone.items()}
    for candidate in candidates:
        if candidate not in alone:
            rows.append(TrialRow(candidate, "alone", "not run", "not run: the time budget ran out"))
            decisions[candidate] = Decision(candidate, False, "not run: the time budget ran out")
            continue
        judged = verdicts[candidate]
        rows.append(_row(alone[candidate], "alone", judged.status, judged.reason, baseline_speed, judged))
        decisions[candidate] = Decision(candidate, False, judged.reason.replace("kept:", "faster alone:", 1))
    if repeat is not None:
        repeat_status = "baseline" if repeat.measured else "not measured"
        rows.append(_row(repeat, "baseline", repeat_status, f"baseline: repeat; noise {noise:.0%}", baseline_speed))

    # Greedy combination, fastest alone first. Only failing or numerics-breaking candidates are out: a
    # starved pipeline hides (and its CPU threads can even reverse) a faster model's gain until it is fixed.
    eligible = sorted(
        (c for c, v in verdicts.items() if v.ratio is not None and v.status in ("kept", "rejected") and v.numerics_ok),
        key=lambda c: -verdicts[c].ratio,
    )
    kept_alone = [c for c in eligible if verdicts[c].kept]
    chosen: tuple[str, ...] = ()
    chosen_speed = baseline_speed
    if kept_alone:
        chosen, chosen_speed = (kept_alone[0],), alone[kept_alone[0]].examples_per_second
        decisions[kept_alone[0]] = Decision(kept_alone[0], True, verdicts[kept_alone[0]].reason)
        recipe_of = dict(alternatives or {})
        for candidate in eligible:
            if candidate in chosen:
                continue
            rival = next((c for c in chosen if c in recipe_of and recipe_of[c] == recipe_of.get(candidate)), None)
            if rival is not None:  # a setting of a recipe already chosen, which was faster alone
                decisions[candidate] = Decision(
                    candidate, False, f"another setting of {recipe_of[rival]}, {rival}, was chosen"
                )
                continue
            combination = tuple(c for c in candidates if c in chosen or c == candidate)
            label = " + ".join(combination)
            if not state.affordable(repeats_left=0):
                rows.append(TrialRow(label, "combination", "not run", "not run: the time budget ran out"))
                continue
            trial = state.trial(combination)
            judged = verdict(trial, chosen_speed, " + ".join(chosen))
            rows.append(_row(trial, "combination", judged.status, judged.reason, baseline_speed, judged))
            if judged.kept:
                chosen, chosen_speed = combination, trial.examples_per_second
                decisions[candidate] = Decision(
                    candidate, True, f"{judged.reason} ({chosen_speed / baseline_speed:.2f}x baseline)"
                )
            else:
                decisions[candidate] = Decision(candidate, False, f"on top of {' + '.join(chosen)}: {judged.reason}")
    for candidate in candidates:
        if not decisions[candidate].kept and decisions[candidate].reason.startswith("faster alone"):
            decisions[candidate] = Decision(
                candidate, False, f"{decisions[candidate].reason}; not combined: the time budget ran out"
            )
    for candidate, reason in (not_tried or {}).items():
        rows.append(TrialRow(candidate, "candidate", "not tried", reason))
        decisions[candidate] = Decision(candidate, False, f"not tried: {reason}")
    state.report(f"chose {' + '.join(chosen) or 'the baseline'}")
    return TrialsTable(
        rows=tuple(rows),
        decisions=tuple(decisions.values()),
        chosen=chosen,
        baseline_examples_per_second=baseline_speed,
        noise_fraction=noise,
        loss_tolerance=loss_tolerance,
        budget_seconds=budget_seconds,
        elapsed_seconds=clock() - state.start,
        notes=tuple(notes),
    )


class _Search:
    """The clock, the budget and the trial count that every step of `search` consults."""

    def __init__(
        self,
        candidates: Sequence[str],
        run: Runner,
        budget_seconds: float,
        clock: Callable[[], float],
        start: float,
        on_progress: Callable[[ProgressEvent], None] | None,
    ):
        self.run, self.budget_seconds, self.clock, self.start = run, budget_seconds, clock, start
        self.on_progress = on_progress
        self.planned = 2 + 2 * len(candidates) - (1 if candidates else 0)
        self.done = 0
        self.trial_seconds = 0.0

    @property
    def deadline(self) -> float:
        return self.start + self.budget_seconds

    def affordable(self, *, repeats_left: int) -> bool:
        """Whether one more trial (plus `repeats_left` baseline repeats still owed) fits the time left."""
        return self.clock() + self.trial_seconds * (1 + repeats_left) <= self.deadline

    def trial(self, configuration: tuple[str, ...]) -> TrialResult:
        label = " + ".join(configuration) or "baseline"
        self.report(f"trial {self.done + 1}: {label}")
        began = self.clock()
        try:
            result = self.run(configuration, self.deadline)
        except Exception as error:  # noqa: BLE001 - a candidate that raises is a rejected candidate, not a failed search
            result = TrialResult(
                configuration, error=f"{type(error).__name__}: {error}", wall_seconds=self.clock() - began
            )
        if not configuration and result.measured and not self.trial_seconds:
            self.trial_seconds = result.wall_seconds
        self.done += 1
        speed = (
            f"{result.examples_per_second:.1f} examples/s"
            if result.measured
            else (result.error or result.skipped or "stopped by the budget")
        )
        self.report(f"{label}: {speed}")
        return result

    def report(self, message: str) -> None:
        _log.info("auto: %s (%.0f of %.0f s)", message, self.clock() - self.start, self.budget_seconds)
        if self.on_progress is not None:
            self.on_progress(
                ProgressEvent(
                    message, self.clock() - self.start, self.budget_seconds, self.done, max(self.planned, self.done)
                )
            )


def _row(
    trial: TrialResult, role: str, status: str, reason: str, baseline_speed: float, verdict: Verdict | None = None
) -> TrialRow:
    times = trial.step_times if trial.measured else None
    speed = spread = None
    if times is not None:
        speed = trial.examples_per_second
        spread = speed * times.spread_seconds / times.median_seconds
    return TrialRow(
        configuration=trial.label,
        role=role,
        status=status,
        reason=reason,
        examples_per_second=speed,
        spread_examples_per_second=spread,
        ratio=speed / baseline_speed if times else None,
        step_seconds=times.median_seconds if times else None,
        compile_seconds=trial.compile_seconds,
        loss_deviation=verdict.loss_deviation if verdict else None,
    )
