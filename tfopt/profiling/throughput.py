"""Windows of training steps and their rates: the arithmetic behind `tfopt.Monitor`, free of Keras and TensorFlow.

A `Throughput` holds one open window at a time. The caller says when a step ended (`update`), when the
clock stops and starts again (`pause`, `resume`: the time between epochs is in no window), and reads the
window's rates (`compute`) or ends it (`close`). Times are plain seconds from any monotonic clock, passed
in, so the rules are tested with plain numbers.

Example:
    >>> meter = Throughput(every_steps=2, batch_size=32)
    >>> meter.open(now=10.0, first_step=2)
    >>> meter.update(step=2, fetch_seconds=0.1)
    >>> meter.update(step=3, fetch_seconds=0.1)
    >>> meter.is_due(now=11.0)
    True
    >>> meter.compute(now=11.0)
    {'steps_per_second': 2.0, 'examples_per_second': 64.0, 'input_wait_percent': 20.0}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tfopt.errors import RecipeConfigError

# A window of a step or two is noise on a shared machine: one slow fetch (a new epoch's iterator filling its
# buffer) is all of it, and three such windows in a row alert. A partial window at the end of `fit` needs
# this many steps to be kept, and `tfopt-recipe run` sizes no window below it.
MIN_WINDOW_STEPS = 3


@dataclasses.dataclass(frozen=True)
class WindowStats:
    """A closed window: where it ended, how much it held, and its rates.

    Attributes:
        step: The window's last global step.
        steps: Training steps in it.
        seconds: Its training time (pauses left out).
        rates: `steps_per_second`, and where they apply `examples_per_second`, `input_wait_percent` and
            `mfu_percent`, in that order.
    """

    step: int
    steps: int
    seconds: float
    rates: dict[str, float]


class Throughput:
    """Tumbling windows of training steps: when one is full, and its examples/s, input wait % and MFU.

    Args:
        window_seconds: A window closes after this much training time...
        every_steps: ...or after this many steps, when given (exact window sizes).
        batch_size: Examples in one step (the global batch); None or 0 for no examples/s.
        measure_input_wait: Whether `update`'s fetch seconds are the step's whole wait for input. False
            where the fetch is out of sight (no `input_wait_percent`).
        flops_per_step: Model FLOPs of one step; with `peak_flops_per_second`, MFU.
        peak_flops_per_second: The devices' peak for the precision in use; None off accelerators.

    Raises:
        RecipeConfigError: `window_seconds` is not positive, or `every_steps` is not a whole number >= 1.
    """

    def __init__(
        self,
        *,
        window_seconds: float = 30.0,
        every_steps: int | None = None,
        batch_size: int | None = None,
        measure_input_wait: bool = True,
        flops_per_step: float | None = None,
        peak_flops_per_second: float | None = None,
    ):
        if not window_seconds > 0:
            raise RecipeConfigError(f"Monitor: window_seconds={window_seconds!r} must be > 0 (e.g. 30.0).")
        if every_steps is not None and (not isinstance(every_steps, int) or every_steps < 1):
            raise RecipeConfigError(f"Monitor: every_steps={every_steps!r} must be a whole number >= 1, or None.")
        self.window_seconds = window_seconds
        self.every_steps = every_steps
        self.batch_size = batch_size
        self.measure_input_wait = measure_input_wait
        self.flops_per_step = flops_per_step
        self.peak_flops_per_second = peak_flops_per_second
        self._first_step = self._last_step = 0
        self._seconds = self._fetch_seconds = 0.0
        self._started_at: float | None = None
        self._open = False

    @property
    def is_open(self) -> bool:
        """Whether a window is open (paused or not)."""
        return self._open

    @property
    def is_running(self) -> bool:
        """Whether a window is open and its clock runs (not paused)."""
        return self._open and self._started_at is not None

    @property
    def steps(self) -> int:
        """Steps in the open window so far."""
        return self._last_step - self._first_step + 1 if self._open else 0

    def open(self, *, now: float, first_step: int) -> None:
        """Opens a window at clock time `now` whose first step will be the global step `first_step`."""
        self._open = True
        self._first_step, self._last_step = first_step, first_step - 1
        self._seconds = self._fetch_seconds = 0.0
        self._started_at = now

    def update(self, *, step: int, fetch_seconds: float = 0.0) -> None:
        """Counts the steps up to the global step `step` into the open window, and the wait for their input.

        Several steps at once (`steps_per_execution`) count by passing the last one's number.
        """
        if not self._open:
            raise RuntimeError("Throughput.update: no window is open; call open() first.")
        self._last_step = step
        self._fetch_seconds += fetch_seconds

    def pause(self, *, now: float) -> None:
        """Stops the open window's clock at `now` (training steps stop); no-op when none runs."""
        if self.is_running:
            self._seconds += now - self._started_at
            self._started_at = None

    def resume(self, *, now: float) -> None:
        """Starts a paused window's clock again at `now`; no-op when none is paused."""
        if self._open and self._started_at is None:
            self._started_at = now

    def seconds(self, *, now: float) -> float:
        """The open window's training time up to `now` (its pauses left out)."""
        running = now - self._started_at if self._started_at is not None else 0.0
        return self._seconds + running

    def is_due(self, *, now: float) -> bool:
        """Whether the open window is full at `now`: `every_steps` steps, else `window_seconds` of training."""
        if not self._open:
            return False
        if self.every_steps:
            return self.steps >= self.every_steps
        return self.seconds(now=now) >= self.window_seconds

    def is_worth_keeping(self) -> bool:
        """Whether a window cut short (at the end of `fit`) holds enough steps to mean anything."""
        return self.steps >= MIN_WINDOW_STEPS

    def compute(self, *, now: float) -> dict[str, float]:
        """The open window's rates up to `now`: steps/s, and where they apply examples/s, input wait %, MFU."""
        steps, seconds = self.steps, self.seconds(now=now)
        if seconds <= 0:
            raise RuntimeError(f"Throughput.compute: the window has {seconds!r} s of training; it needs > 0.")
        return {name: rate(steps, seconds) for name, rate in self._rates().items()}

    def rate_names(self) -> list[str]:
        """The rates a window closed now would carry: `compute`'s keys."""
        return list(self._rates())

    def _rates(self) -> dict[str, Callable[[int, float], float]]:
        """Each rate that applies, from a window's steps and seconds."""
        rates = {"steps_per_second": lambda steps, seconds: steps / seconds}
        if self.batch_size:
            rates["examples_per_second"] = lambda steps, seconds: steps * self.batch_size / seconds
        if self.measure_input_wait:
            rates["input_wait_percent"] = lambda steps, seconds: 100.0 * self._fetch_seconds / seconds
        if self.flops_per_step and self.peak_flops_per_second:
            rates["mfu_percent"] = lambda steps, seconds: (
                100.0 * self.flops_per_step * steps / seconds / self.peak_flops_per_second
            )
        return rates

    def close(self, *, now: float) -> WindowStats:
        """Ends the open window at `now` and returns it."""
        stats = WindowStats(
            step=self._last_step, steps=self.steps, seconds=self.seconds(now=now), rates=self.compute(now=now)
        )
        self.discard()
        return stats

    def discard(self) -> None:
        """Drops the open window unrecorded (e.g. its steps are traced by the profiler)."""
        self._open = False
        self._started_at = None
