"""The Monitor's alerts: a run that became input-bound, or whose MFU fell against its own median.

A condition must hold for `alert_windows` windows in a row (one slow window is noise on a shared
machine), and each episode alerts once: the rule re-arms only after a window where the condition is gone.
Input wait uses the profiler's own threshold (`diagnose.INPUT_BOUND_HIGH_PERCENT`), so the Monitor and
`tfopt-recipe diagnose` call the same run input-bound, and counts only where a step waits at least
`INPUT_WAIT_FLOOR_SECONDS`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from tfopt.errors import RecipeConfigError
from tfopt.profiling.diagnose import INPUT_BOUND_HIGH_PERCENT

INPUT_FIX = (
    "Fix: the data_pipeline recipe (parallel maps, autotune, prefetch; TFRecord for slow storage); "
    "`tfopt-recipe diagnose <recipe.yaml>` profiles the run and names the cause."
)
MFU_FIX = (
    "Something in the run changed (input, other load on the machine, clocks): "
    "`tfopt-recipe diagnose <recipe.yaml>` or Monitor(profile_every=...) shows where the step's time goes."
)
# Windows before the MFU median means anything.
MFU_BASELINE_WINDOWS = 3
# Less waiting than this per step is the fetch's own varying cost and the scheduler's on a loaded host (a 0.7 ms
# CPU step read 36% with its pipeline cached and prefetched), which no pipeline change removes.
INPUT_WAIT_FLOOR_SECONDS = 0.5e-3


@dataclasses.dataclass(frozen=True)
class Alert:
    """One alert, as the `on_alert` hook receives it.

    Attributes:
        kind: "input_wait" or "mfu_drop".
        step: The global step of the window that raised it.
        message: The warning logged: the numbers and the fix.
        values: The windows' readings behind it (percentages, the median for an MFU drop).
    """

    kind: str
    step: int
    message: str
    values: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class AlertRules:
    """Decides, after each window, whether an alert starts.

    Args:
        alert_windows: Consecutive windows a condition must hold.
        mfu_drop_fraction: MFU below (1 - this) x the median of all earlier windows is a drop.
    """

    alert_windows: int = 3
    mfu_drop_fraction: float = 0.3
    _raised: set[str] = dataclasses.field(default_factory=set)

    def __post_init__(self) -> None:
        if not isinstance(self.alert_windows, int) or self.alert_windows < 1:
            raise RecipeConfigError(
                f"Monitor: alert_windows={self.alert_windows!r} must be a whole number >= 1 (e.g. 3)."
            )
        if not 0 < self.mfu_drop_fraction < 1:
            raise RecipeConfigError(
                f"Monitor: mfu_drop_fraction={self.mfu_drop_fraction!r} must be between 0 and 1 "
                "(0.3 alerts when MFU falls 30% below the run's median)."
            )

    def check(self, windows: Sequence[dict[str, Any]]) -> list[Alert]:
        """The alerts that start with the last of `windows` (each a Monitor window record)."""
        alerts = [self._input(windows), self._mfu(windows)]
        return [alert for alert in alerts if alert is not None]

    def _input(self, windows: Sequence[dict[str, Any]]) -> Alert | None:
        recent = windows[-self.alert_windows :]
        waits = [window.get("input_wait_percent") for window in recent]
        holds = len(recent) == self.alert_windows and all(
            wait is not None
            and wait > INPUT_BOUND_HIGH_PERCENT
            and wait / 100 * window["seconds"] / window["steps"] >= INPUT_WAIT_FLOOR_SECONDS
            for wait, window in zip(waits, recent)
        )
        if not self._starts("input_wait", holds):
            return None
        readings = ", ".join(f"{wait:.0f}%" for wait in waits)
        message = (
            f"tfopt.Monitor: training waited for its input {readings} of the time in the last "
            f"{self.alert_windows} windows (steps {recent[0]['step'] - recent[0]['steps'] + 1}-"
            f"{recent[-1]['step']}; input-bound above {INPUT_BOUND_HIGH_PERCENT:.0f}%), at "
            f"{_rate(recent[-1])}. {INPUT_FIX}"
        )
        return Alert("input_wait", recent[-1]["step"], message, {"input_wait_percent": waits})

    def _mfu(self, windows: Sequence[dict[str, Any]]) -> Alert | None:
        earlier = [window["mfu_percent"] for window in windows[: -self.alert_windows] if "mfu_percent" in window]
        recent = [window.get("mfu_percent") for window in windows[-self.alert_windows :]]
        median = statistics.median(earlier) if len(earlier) >= MFU_BASELINE_WINDOWS else None
        limit = median * (1 - self.mfu_drop_fraction) if median else None
        holds = (
            limit is not None
            and len(recent) == self.alert_windows
            and all(value is not None and value < limit for value in recent)
        )
        if not self._starts("mfu_drop", holds):
            return None
        readings = ", ".join(f"{value:.1f}%" for value in recent)
        message = (
            f"tfopt.Monitor: MFU fell to {readings} in the last {self.alert_windows} windows, more than "
            f"{self.mfu_drop_fraction:.0%} below the run's median of {median:.1f}% (up to step "
            f"{windows[-1]['step']}, at {_rate(windows[-1])}). {MFU_FIX}"
        )
        return Alert("mfu_drop", windows[-1]["step"], message, {"mfu_percent": recent, "median_percent": median})

    def _starts(self, kind: str, holds: bool) -> bool:
        """True once per episode: when the condition first holds; re-armed when it stops holding."""
        if not holds:
            self._raised.discard(kind)
            return False
        if kind in self._raised:
            return False
        self._raised.add(kind)
        return True


def _rate(window: dict[str, Any]) -> str:
    if "examples_per_second" in window:
        return f"{window['examples_per_second']:.0f} examples/s"
    return f"{window['steps_per_second']:.1f} steps/s"
