"""Timed training steps and the compute-only ceiling, measured the same way on CPU, GPU and TPU.

The TF Profiler's step analysis reports "No step time measured" on CPU-only machines, so tfopt times
steps itself: it runs `model.fit` (the path users train with, including Keras' data iterator) and takes
the wall time between the ends of consecutive steps, reading the loss at each step end so that
asynchronous GPU dispatch cannot make a step look faster than it was.

The compute-only ceiling is the same model fed one batch, held in memory and repeated, so the input
pipeline costs nothing: `utilization = ceiling step time / real step time`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Iterator
from typing import Any

import keras

from tfopt.errors import MeasurementError


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """Wall times of measured training steps.

    Attributes:
        seconds: The wall time of every measured step, in order.
        batch_size: Examples per step.
    """

    seconds: tuple[float, ...]
    batch_size: int

    @property
    def median_seconds(self) -> float:
        """The median step time: robust against the odd slow step on a noisy machine."""
        return statistics.median(self.seconds)

    @property
    def spread_seconds(self) -> float:
        """The interquartile range of step times, a noise measure that ignores outliers."""
        if len(self.seconds) < 4:
            return max(self.seconds) - min(self.seconds)
        quartiles = statistics.quantiles(self.seconds, n=4)
        return quartiles[2] - quartiles[0]

    @property
    def steps_per_second(self) -> float:
        return 1.0 / self.median_seconds

    @property
    def examples_per_second(self) -> float:
        return self.batch_size / self.median_seconds

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": list(self.seconds), "batch_size": self.batch_size,
                "median_seconds": self.median_seconds, "spread_seconds": self.spread_seconds,
                "steps_per_second": self.steps_per_second, "examples_per_second": self.examples_per_second}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Real training speed next to the compute-only ceiling of the same model.

    Attributes:
        real: Steps fed by the real input pipeline.
        ceiling: Steps fed by one in-memory batch repeated.
    """

    real: StepTimes
    ceiling: StepTimes

    @property
    def utilization(self) -> float:
        """The fraction of the compute-only ceiling that real training reaches (1.0 = not input-bound)."""
        return self.ceiling.median_seconds / self.real.median_seconds

    def to_dict(self) -> dict[str, Any]:
        return {"real": self.real.to_dict(), "ceiling": self.ceiling.to_dict(), "utilization": self.utilization}


def one_batch_repeated(dataset: Any) -> Any:
    """The compute-only input: the dataset's first batch, held in memory and repeated forever.

    Example:
        >>> import tensorflow as tf
        >>> data = tf.data.Dataset.range(10).map(lambda i: (i, i)).batch(4)
        >>> [int(x[0]) for x, _ in one_batch_repeated(data).take(3)]
        [0, 0, 0]
    """
    import tensorflow as tf

    batch = next(iter(dataset.take(1)))
    return tf.data.Dataset.from_tensors(batch).repeat()


def time_training_steps(model: Any, dataset: Any, *, steps: int, warmup_steps: int, batch_size: int) -> StepTimes:
    """Trains `model` for `warmup_steps + steps` steps on `dataset` and times the last `steps`.

    The dataset is repeated so a short one does not run out. This trains the model: use
    `measure()` to keep its weights and optimizer state as they were.

    Args:
        model: A compiled Keras model.
        dataset: A batched tf.data pipeline.
        steps: Steps to time; at least 2.
        warmup_steps: Steps run first and not timed (tracing, compilation, pipeline warm-up); at least 1.
        batch_size: Examples per step, to report examples/s.

    Returns:
        The measured step times. A model compiled with `steps_per_execution=N` runs N steps per call,
        and Keras reports only the call's end: each of its steps gets an Nth of the call's time, and both
        counts are rounded up to whole calls.

    Raises:
        MeasurementError: The arguments are out of range, or training failed.
    """
    if steps < 2 or warmup_steps < 1:
        raise MeasurementError(f"Timing needs steps >= 2 and warmup_steps >= 1; received steps={steps}, "
                               f"warmup_steps={warmup_steps}.")
    per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    warmup_steps, steps = (-(-count // per_call) * per_call for count in (warmup_steps, steps))
    timer = StepTimer(warmup_steps, steps_per_execution=per_call)
    try:
        model.fit(dataset.repeat(), steps_per_epoch=warmup_steps + steps, epochs=1, verbose=0,
                  shuffle=False, callbacks=[timer])
    except Exception as error:
        raise MeasurementError(f"Training failed while timing steps: {type(error).__name__}: {error}") from error
    if not timer.seconds:
        raise MeasurementError(f"No step was timed ({steps} steps after {warmup_steps} warm-up steps were asked).")
    return StepTimes(seconds=tuple(timer.seconds), batch_size=batch_size)


def measure(model: Any, dataset: Any, *, steps: int, warmup_steps: int, batch_size: int) -> Measurement:
    """Times real training and the compute-only ceiling, then restores the model's state.

    The two are measured in alternating rounds (real, ceiling, real, ceiling) when there are at least 4
    steps, so a change in the machine's load during the measurement (other processes on a shared box)
    hits both sides alike instead of biasing their ratio. The model's weights and optimizer variables are
    put back as they were, so a model handed back to the user starts training where it would have
    without the measurement.

    Args:
        model: A compiled Keras model.
        dataset: Its batched training pipeline.
        steps: Steps timed on each side, in total over the rounds.
        warmup_steps: Untimed steps before each side's first round (later rounds warm up one step: the
            train step is already traced, only the input iterator starts afresh).
        batch_size: Examples per step.

    Returns:
        The real and ceiling step times.
    """
    ceiling_data = one_batch_repeated(dataset)
    rounds = [steps - steps // 2, steps // 2] if steps >= 4 else [steps]
    real: list[float] = []
    ceiling: list[float] = []
    with training_state_restored(model):
        for index, round_steps in enumerate(rounds):
            warmup = warmup_steps if index == 0 else 1
            for data, seconds in ((dataset, real), (ceiling_data, ceiling)):
                seconds.extend(time_training_steps(model, data, steps=round_steps, warmup_steps=warmup,
                                                   batch_size=batch_size).seconds)
    return Measurement(real=StepTimes(tuple(real), batch_size), ceiling=StepTimes(tuple(ceiling), batch_size))


@contextlib.contextmanager
def training_state_restored(model: Any) -> Iterator[None]:
    """Puts the model's weights and optimizer variables back as they were after a block that trains it.

    Measuring trains the model for a few steps; a model handed back to the user must not carry them.
    """
    optimizer = model.optimizer
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    state = [*model.weights, *optimizer.variables]
    saved = [variable.numpy() for variable in state]
    try:
        yield
    finally:
        for variable, value in zip(state, saved):
            variable.assign(value)


class StepTimer(keras.callbacks.Callback):
    """Records the wall time between consecutive step ends after the warm-up steps."""

    def __init__(self, warmup_steps: int, *, steps_per_execution: int = 1):
        super().__init__()
        self.warmup_steps = warmup_steps
        self.steps_per_execution = steps_per_execution
        self.seconds: list[float] = []
        self._last_end: float | None = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if logs and "loss" in logs:
            float(logs["loss"])  # waits for the step to finish on the device
        now = time.perf_counter()
        if batch >= self.warmup_steps and self._last_end is not None:
            # One call per `steps_per_execution` steps: each of them gets its share of the call's time.
            share = (now - self._last_end) / self.steps_per_execution
            self.seconds.extend([share] * self.steps_per_execution)
        self._last_end = now
