"""The batch-size search over timed trials: which sizes to try, when to stop, and the trial table.

Kept apart from the timing (in `tfopt.recipes.batch_size`) so its decisions, including a GPU running out
of memory, are tested with faked trials on any machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tfopt.errors import MeasurementError


@dataclasses.dataclass(frozen=True)
class Trial:
    """One timed batch size.

    Attributes:
        batch_size: Examples per step.
        status: "ok", "over_budget" (ran, but its peak memory broke the budget), "out_of_memory" (the
            device ran out), "failed" (training failed at this size: a model that fixes its batch), or
            "skipped" (predicted to break the budget, not run).
        examples_per_second: Median throughput, or None where it did not run to the end.
        median_step_seconds: Median step time, or None.
        peak_memory_bytes: Peak memory during the trial (or the prediction, for "skipped").
    """

    batch_size: int
    status: str
    examples_per_second: float | None = None
    median_step_seconds: float | None = None
    peak_memory_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BatchSizeSearch:
    """The trial table of a batch-size search and its choice.

    Attributes:
        trials: Every trial, in the order run.
        memory_kind: "host RSS" or "GPU memory": what `peak_memory_bytes` and the budget measure.
        memory_budget_bytes: The bound a trial's peak had to stay under, or None (GPU: out of memory).
    """

    trials: tuple[Trial, ...]
    memory_kind: str
    memory_budget_bytes: int | None

    @property
    def best(self) -> Trial:
        """The trial with the highest examples/s among those within the bound."""
        ok = [trial for trial in self.trials if trial.status == "ok"]
        if not ok:
            raise MeasurementError(
                f"No batch size ran within the memory bound ({self.memory_kind}); trials: "
                f"{[(trial.batch_size, trial.status) for trial in self.trials]}. Lower min_batch_size, or "
                "raise memory_budget_bytes."
            )
        return max(ok, key=lambda trial: trial.examples_per_second)

    @property
    def best_batch_size(self) -> int:
        return self.best.batch_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "trials": [trial.to_dict() for trial in self.trials],
            "memory_kind": self.memory_kind,
            "memory_budget_bytes": self.memory_budget_bytes,
            "best_batch_size": self.best_batch_size,
        }

    def to_markdown(self) -> str:
        """The trial table as Markdown, the fastest row marked."""
        from tfopt.training.peak_memory import describe_bytes

        best = self.best
        rows = ["| batch | examples/s | step ms | peak memory | status |", "|---:|---:|---:|---:|---|"]
        for trial in sorted(self.trials, key=lambda trial: trial.batch_size):
            speed = f"{trial.examples_per_second:,.0f}" if trial.examples_per_second else "-"
            step = f"{trial.median_step_seconds * 1000:.1f}" if trial.median_step_seconds else "-"
            mark = " (best)" if trial is best else ""
            rows.append(
                f"| {trial.batch_size} | {speed} | {step} | {describe_bytes(trial.peak_memory_bytes)} | "
                f"{trial.status}{mark} |"
            )
        return "\n".join(rows)


def search_batch_sizes(
    run_trial: Callable[[int], Trial],
    *,
    min_batch_size: int,
    max_batch_size: int,
    memory_budget_bytes: int | None,
    baseline_bytes: int = 0,
    refine: bool = True,
    dividing: int | None = None,
) -> list[Trial]:
    """The search itself, over any trial function: powers of two, then 3/4 and 3/2 of the best; with
    `dividing`, the sizes that divide it, each at least twice the last, then those nearest 3/4 and 3/2.

    Separate from the timing so that its decisions (when to stop, what to skip) are tested with faked
    trials, including GPU out-of-memory ones on a machine without a GPU.
    """
    trials: list[Trial] = []
    tried: set[int] = set()
    ceiling = max_batch_size + 1  # the smallest size known not to fit

    def attempt(batch_size: int) -> Trial | None:
        nonlocal ceiling
        if batch_size in tried or not min_batch_size <= batch_size < ceiling:
            return None
        tried.add(batch_size)
        predicted = _predicted_peak(trials, batch_size, baseline_bytes)
        if memory_budget_bytes is not None and predicted is not None and predicted > memory_budget_bytes:
            trial = Trial(batch_size, "skipped", peak_memory_bytes=predicted)
        else:
            trial = run_trial(batch_size)
        trials.append(trial)
        if trial.status != "ok":
            ceiling = min(ceiling, batch_size)
        return trial

    allowed = None if dividing is None else [size for size in range(1, dividing + 1) if dividing % size == 0]

    def near(size: float) -> int | None:
        """`size` as tried: rounded (`_round_batch`), or the allowed size nearest to it."""
        if allowed is None:
            return _round_batch(size)
        inside = [allowed_size for allowed_size in allowed if min_batch_size <= allowed_size <= max_batch_size]
        return min(inside, key=lambda allowed_size: abs(allowed_size - size)) if inside else None

    def doubled(size: int) -> int:
        if allowed is None:
            return size * 2
        return next((allowed_size for allowed_size in allowed if allowed_size >= 2 * size), max_batch_size + 1)

    batch_size = min_batch_size if allowed is None else next((a for a in allowed if a >= min_batch_size), 0)
    best_speed, slower_in_a_row = 0.0, 0
    while 1 <= batch_size <= max_batch_size and slower_in_a_row < 2:
        trial = attempt(batch_size)
        if trial is None or trial.status != "ok":
            break
        slower_in_a_row = 0 if trial.examples_per_second > best_speed else slower_in_a_row + 1
        best_speed = max(best_speed, trial.examples_per_second)
        batch_size = doubled(batch_size)
    if refine and any(trial.status == "ok" for trial in trials):
        best = max((trial for trial in trials if trial.status == "ok"), key=lambda trial: trial.examples_per_second)
        for size in (near(best.batch_size * 3 / 4), near(best.batch_size * 3 / 2)):
            if size is not None:
                attempt(size)
    return trials


def _predicted_peak(trials: list[Trial], batch_size: int, baseline_bytes: int) -> int | None:
    """A trial's peak from the last two that ran (a line through them), or the last one and the baseline."""
    ran = [trial for trial in trials if trial.status == "ok" and trial.peak_memory_bytes is not None]
    if not ran:
        return None
    last = ran[-1]
    if len(ran) >= 2 and ran[-2].batch_size != last.batch_size:
        previous = ran[-2]
        per_example = (last.peak_memory_bytes - previous.peak_memory_bytes) / (last.batch_size - previous.batch_size)
    else:
        per_example = (last.peak_memory_bytes - baseline_bytes) / last.batch_size
    return int(last.peak_memory_bytes + max(per_example, 0.0) * (batch_size - last.batch_size))


def _round_batch(size: float) -> int:
    """Multiples of 8 from 16 up (tensor-core and vector-width friendly), plain integers below."""
    return round(size / 8) * 8 if size >= 16 else max(1, round(size))
