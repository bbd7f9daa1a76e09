"""The numbers of a run, each named for what it is, and the lines that show them.

- **accelerator busy %**: device-active time (the union of what its streams ran) over the *wall* step,
  the wait for the next batch included. From a profiler capture; the headline on accelerators.
- **MFU**: model FLOPs per second over the devices' peak dense FLOP/s for the precision in use.
- **input wait %**: the share of the wall step spent waiting for the next batch (from a capture).
- **input efficiency**: on-device ceiling step time / real step time: how close training comes to the
  same step fed a batch already in device memory. It says nothing about how busy the accelerator is
  (an H100 computing 12% of each step read 97% here), so it is never called "utilization".

On a CPU-only machine busy % and MFU do not apply: input efficiency and input wait carry the story.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tfopt.hardware import Hardware

if TYPE_CHECKING:
    from tfopt.profiling.measurement import Measurement

CPU_NOTE = "CPU only: accelerator busy % and MFU do not apply"


@dataclasses.dataclass(frozen=True)
class Metrics:
    """A run's headline numbers, in percent; None where not measured or not applicable.

    Attributes:
        accelerator: "gpu", "tpu" or "cpu".
        busy_percent: Accelerator busy % of the wall step (needs a capture).
        mfu_percent: Model FLOPs utilization (needs an accelerator in the peak table).
        input_wait_percent: Input wait % of the wall step (needs a capture).
        input_efficiency_percent: Ceiling step time / real step time, at most 100.
        measurement_problem: Why the input efficiency could not be read, or None.
    """

    accelerator: str
    busy_percent: float | None = None
    mfu_percent: float | None = None
    input_wait_percent: float | None = None
    input_efficiency_percent: float | None = None
    measurement_problem: str | None = None

    @classmethod
    def of(cls, hardware: Hardware, measurement: Measurement | None = None, breakdown: Any = None) -> Metrics:
        """The metrics of a `measurement.Measurement` and, where captured, a `StepBreakdown`."""
        efficiency = measurement.input_efficiency if measurement is not None else None
        mfu = measurement.mfu if measurement is not None else None
        accelerator = hardware.accelerator
        return cls(
            accelerator=accelerator,
            busy_percent=breakdown.busy_percent if breakdown is not None and accelerator != "cpu" else None,
            mfu_percent=100.0 * mfu if mfu is not None else None,
            input_wait_percent=breakdown.input_percent if breakdown is not None else None,
            input_efficiency_percent=100.0 * efficiency if efficiency is not None else None,
            measurement_problem=measurement.measurement_problem if measurement is not None else None,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metrics:
        return cls(**{field.name: data.get(field.name) for field in dataclasses.fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def headline(self) -> str:
        """One run's numbers, e.g. "accelerator busy 12%, MFU 3.1%, input wait 0.4%, input efficiency 95%"."""
        return _line(self.accelerator, [self])


def compared(before: Metrics, after: Metrics) -> str:
    """Two runs' numbers side by side, e.g. "accelerator busy 12% -> 80%, MFU 3.1% -> 25%, ..."."""
    return _line(after.accelerator, [before, after])


_LABELS = {
    "busy_percent": "accelerator busy",
    "mfu_percent": "MFU",
    "input_wait_percent": "input wait",
    "input_efficiency_percent": "input efficiency",
}
_ACCELERATOR_ONLY = ("busy_percent", "mfu_percent")


def _line(accelerator: str, runs: list[Metrics]) -> str:
    """The measured metrics of `runs` ("a -> b" for two); metrics no run measured are left out, with the
    reason where it is not the hardware (no capture, a measurement problem)."""
    parts = []
    for name, label in _LABELS.items():
        values = [getattr(run, name) for run in runs]
        if (accelerator == "cpu" and name in _ACCELERATOR_ONLY) or all(value is None for value in values):
            continue
        parts.append(f"{label} {' -> '.join(_percent(value) for value in values)}")
    notes = [CPU_NOTE] if accelerator == "cpu" else []
    if accelerator != "cpu" and all(run.busy_percent is None and run.input_wait_percent is None for run in runs):
        notes.append("accelerator busy % and input wait need a profiler capture: profile=True")
    if any(run.measurement_problem for run in runs):
        notes.append("input efficiency not read where n/a: the diagnosis notes say why")
    return ", ".join(parts) + (f" ({'; '.join(notes)})" if notes else "")


def _percent(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}%" if value < 10 else f"{value:.0f}%"


def spread(ratios: tuple[float, ...]) -> tuple[float, float, float]:
    """The median of per-round ratios, and their lowest and highest.

    Example:
        >>> spread((1.2, 0.9, 1.1))
        (1.1, 0.9, 1.2)
    """
    return statistics.median(ratios), min(ratios), max(ratios)


def headline_speedup(
    before_examples_per_second: float, after_examples_per_second: float, rounds: Sequence[float]
) -> float:
    """The speedup a summary leads with: the median of the rounds measured side by side where they give a range
    (3 or more), so that the range said after it brackets it and it is the figure the recipes were judged by;
    else examples/s after over before. (The runs' own examples/s are medians over all their windows: their ratio
    can fall outside the rounds' range.)

    Example:
        >>> headline_speedup(100.0, 125.0, (1.11, 1.14, 1.16)), headline_speedup(100.0, 125.0, (1.1,))
        (1.14, 1.25)
    """
    if len(rounds) >= 3:
        return spread(tuple(rounds))[0]
    return after_examples_per_second / before_examples_per_second


def describe_rounds(ratios: tuple[float, ...] | list[float]) -> str:
    """What the per-round ratios say of a speedup, to follow "1.05x": their range, and whether it is noise.

    Example:
        >>> describe_rounds((1.2, 0.9, 1.1))
        ' [0.90-1.20], within noise: no measurable gain on this machine'
        >>> describe_rounds((1.3,))
        ', 1 round side by side: too few for a spread'
    """
    if len(ratios) < 3:
        return f", {len(ratios)} round{'' if len(ratios) == 1 else 's'} side by side: too few for a spread"
    _, low, high = spread(tuple(ratios))
    verdict = (
        ", within noise: no measurable gain on this machine" if low <= 1.0 <= high else ", slower" if high < 1.0 else ""
    )
    return f" [{low:.2f}-{high:.2f}]{verdict}"
