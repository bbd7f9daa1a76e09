"""Timed training steps, the same way on CPU, GPU and TPU: windows of steps with one sync at each end.

The TF Profiler's step analysis reports "No step time measured" on CPU-only machines, so tfopt times
steps itself. Steps are timed in *windows*: tfopt waits for the device (reads the loss) once at each
window's ends and adds no wait of its own in between. Each window gives one per-step time (its wall time
over its steps); the median and spread are taken over windows.

Keras 3 itself, on the TensorFlow backend, converts every call's logs to Python floats before the
callbacks see them (`CallbackList._on_train_batch_end` -> `pythonify_logs`: the backend is not marked
thread-safe, so the asynchronous dispatch Keras has for other backends never applies). That is a host-device
sync per call of `fit`, whatever tfopt does: real training pays it, `steps_per_execution=N` pays it once
per N steps.

Measuring trains the model, so its training state is saved and put back (`training_state_restored`).
Real training against the on-device ceiling is `tfopt.profiling.measurement`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import keras

from tfopt.errors import MeasurementError, describe_error, released
from tfopt.training.stopping import take_stop

if TYPE_CHECKING:
    import tensorflow as tf

# Steps are split into about this many windows: enough for a spread, few enough that each window holds
# several steps whose dispatch and compute overlap.
WINDOWS = 4


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """Per-step wall times of timed windows of training steps.

    Attributes:
        seconds: For every window, its wall time divided by its steps, in order.
        batch_size: Examples per step.
        window_steps: Steps in each window (1 where every step was timed on its own).
    """

    seconds: tuple[float, ...]
    batch_size: int
    window_steps: int = 1

    @property
    def steps(self) -> int:
        """How many steps were timed."""
        return len(self.seconds) * self.window_steps

    @property
    def median_seconds(self) -> float:
        """The median step time over windows: robust against the odd slow window on a noisy machine."""
        return statistics.median(self.seconds)

    @property
    def spread_seconds(self) -> float:
        """The interquartile range of the windows' step times (the range below 4 windows)."""
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
        return {
            "seconds": list(self.seconds),
            "batch_size": self.batch_size,
            "window_steps": self.window_steps,
            "median_seconds": self.median_seconds,
            "spread_seconds": self.spread_seconds,
            "steps_per_second": self.steps_per_second,
            "examples_per_second": self.examples_per_second,
        }


def one_batch_repeated(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The dataset's first batch, held in host memory and repeated forever (for benchmarks' inputs).

    Example:
        >>> import tensorflow as tf
        >>> data = tf.data.Dataset.range(10).map(lambda i: (i, i)).batch(4)
        >>> [int(x[0]) for x, _ in one_batch_repeated(data).take(3)]
        [0, 0, 0]
    """
    import tensorflow as tf

    from tfopt.data.read_copy import copy_to_read

    batch = next(iter(copy_to_read(dataset).take(1)))
    return tf.data.Dataset.from_tensors(batch).repeat()


def window_layout(steps: int, *, steps_per_call: int = 1, window_steps: int | None = None) -> tuple[int, int]:
    """How `steps` timed steps split into windows: (number of windows, steps per window).

    Windows hold whole calls of `steps_per_call` steps (Keras' `steps_per_execution`), and the steps
    are rounded up to whole windows. `window_steps` fixes the window size (else about `WINDOWS` windows).

    Example:
        >>> window_layout(20), window_layout(3), window_layout(6, steps_per_call=4)
        ((4, 5), (3, 1), (2, 4))
    """
    size = window_steps or max(1, steps // WINDOWS)
    size = -(-size // steps_per_call) * steps_per_call
    return -(-steps // size), size


def read_loss(logs: Mapping[str, Any] | None) -> None:
    """Waits for the device: reading a step's loss to the host blocks until that step computed it. Any value a
    train step returns that Keras takes is read: the first of a nested dict's, a per-example vector whole."""
    if logs:
        value = logs["loss"] if "loss" in logs else next(iter(logs.values()))
        for tensor in keras.tree.flatten(value)[:1]:
            keras.ops.convert_to_numpy(tensor)


class WindowTimer(keras.callbacks.Callback):
    """Times windows of training steps with one device sync at each window's ends, none in between.

    Args:
        warmup_steps: Steps before the first window (not timed).
        windows: How many windows to time.
        window_steps: Steps in each window.
        sync: Waits for the device given a step's logs; `read_loss` by default.
        deadline: A `clock()` time after which training stops at the next window's end (`stopped` says so).
        clock: Monotonic seconds, compared with `deadline`.
    """

    def __init__(
        self,
        *,
        warmup_steps: int,
        windows: int,
        window_steps: int,
        sync: Callable[[Mapping[str, Any] | None], None] = read_loss,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self.boundaries = {warmup_steps + index * window_steps for index in range(windows + 1)}
        self.window_steps = window_steps
        self.sync = sync
        self.deadline, self.clock = deadline, clock
        self.seconds: list[float] = []
        self.sync_times: list[float] = []
        self.stopped = False

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        take_stop()  # a stop asked for while a command measures (tfopt.training.stopping)
        # Keras passes the index of the last step the call ran: steps completed = batch + 1.
        if batch + 1 not in self.boundaries:
            return
        self.sync(logs)
        now = time.perf_counter()
        if self.sync_times:
            self.seconds.append((now - self.sync_times[-1]) / self.window_steps)
        self.sync_times.append(now)
        if self.deadline is not None and self.clock() > self.deadline:
            self.stopped = True
            self.model.stop_training = True


def time_training_steps(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    steps: int,
    warmup_steps: int,
    batch_size: int,
    window_steps: int | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> StepTimes:
    """Trains `model` for `warmup_steps + steps` steps on `dataset` with `fit` and times the last `steps`.

    The dataset is repeated so a short one does not run out. This trains the model: use `measure()` to
    keep its weights and optimizer state as they were.

    Args:
        model: A compiled Keras model.
        dataset: A batched tf.data pipeline.
        steps: Steps to time; at least 2. Rounded up to whole windows (`window_layout`).
        warmup_steps: Steps run first and not timed (tracing, compilation, pipeline warm-up); at least 1.
        batch_size: Examples per step, to report examples/s.
        window_steps: Steps per window; by default `window_layout`'s choice for `steps`.
        deadline: A `clock()` time after which timing stops at the next window's end.
        clock: Monotonic seconds, compared with `deadline`.

    Returns:
        The windows' per-step times (fewer windows than asked where the deadline stopped them).

    Raises:
        MeasurementError: The arguments are out of range, training failed, or no window was timed.
    """
    per_call = check_step_counts(model, steps, warmup_steps)
    warmup_steps = -(-warmup_steps // per_call) * per_call
    windows, window_steps = window_layout(steps, steps_per_call=per_call, window_steps=window_steps)
    timer = WindowTimer(
        warmup_steps=warmup_steps, windows=windows, window_steps=window_steps, deadline=deadline, clock=clock
    )
    from tfopt.data.read_copy import copy_to_read

    try:
        model.fit(
            copy_to_read(dataset).repeat(),
            steps_per_epoch=warmup_steps + windows * window_steps,
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[timer],
        )
    except Exception as error:  # noqa: BLE001 - raised again as a tfopt error, in words
        raise MeasurementError(f"Training failed while timing steps: {describe_error(error)}") from released(error)
    if not timer.seconds:
        raise MeasurementError(f"No step was timed ({steps} steps after {warmup_steps} warm-up steps were asked).")
    return StepTimes(seconds=tuple(timer.seconds), batch_size=batch_size, window_steps=window_steps)


def training_state_snapshot(model: keras.Model) -> Callable[[], None]:
    """Saves the model's variables (weights, seed-generator states, and those Keras does not list: a stateful
    RNN's states, a `tf.Variable` attribute), its mutable hash tables and its optimizers'; the returned function
    puts them back.

    Measuring trains the model for a few steps; a model handed back to the user must not carry them, and
    every auto-mode trial must start where the others did. `model.optimizer` is built (when it is not yet)
    inside the model's strategy scope: variables created outside it fail under any strategy but the
    default one. The optimizers the model holds besides (`held_optimizers`: a GAN's `d_optimizer`, those in a
    dict, its sub-models' compiled ones) are its training state too; one not built yet cannot be built here
    (only the model's `train_step` knows their variables), so it is put back as an unbuilt copy and the model's
    traced functions, which hold the one that trained, are traced again on the next call.
    """
    from tfopt.model_copy import copy_keras_object
    from tfopt.training.held_optimizers import held_optimizers
    from tfopt.training.optimizer_build import build_as_fit_does

    optimizer = model.optimizer
    held = held_optimizers(model)
    if not optimizer.built:
        build_as_fit_does(optimizer, model)
    with model.distribute_strategy.scope():
        unbuilt = [(one.put, copy_keras_object(one.optimizer)) for one in held if not one.optimizer.built and one.put]
        # model.variables, not model.weights: the states of its seed generators too (dropout, a VAE's
        # sampling), so that training after a measurement draws the numbers it would have drawn.
        built = [value for value in (optimizer, *(one.optimizer for one in held)) if value.built]
        state = [*model.variables, *(variable for value in built for variable in value.variables)]
        unlisted, tables = _unlisted_state(model, state)
        state += unlisted
        saved = [variable.numpy() for variable in state]
        contents = [table.export() for table in tables]

    def restore() -> None:
        with model.distribute_strategy.scope():
            for variable, value in zip(state, saved):
                variable.assign(value)
            for table, (keys, values) in zip(tables, contents):
                table.remove(table.export()[0])
                table.insert(keys, values)
            for put, spare in unbuilt:  # its variables made in the model's strategy scope
                put(copy_keras_object(spare))
                model.train_function = model.test_function = model.predict_function = None

    return restore


def _unlisted_state(model: keras.Model, listed: list[Any]) -> tuple[list[Any], list[Any]]:
    """What the model's layers hold that training writes and `model.variables` does not list: variables kept as
    attributes outside Keras' tracking (a step counter in a `tf.Variable`, a stateful RNN's states) and mutable
    hash tables (a count of the ids seen)."""
    import keras
    import tensorflow as tf

    seen = {id(variable) for variable in listed}
    variables, tables = [], []

    def visit(value: Any, depth: int) -> None:
        if id(value) in seen:
            return
        if isinstance(value, (keras.Variable, tf.Variable)):
            seen.add(id(value))
            variables.append(value)
        elif isinstance(value, tf.lookup.experimental.MutableHashTable):
            seen.add(id(value))
            tables.append(value)
        elif depth < 2 and isinstance(value, (list, tuple)):  # a layer's list of them (an RNN's states)
            for item in value:
                visit(item, depth + 1)
        elif depth < 2 and isinstance(value, dict):
            for item in value.values():
                visit(item, depth + 1)

    for layer in (model, *model._flatten_layers(include_self=False)):
        for value in vars(layer).values():
            visit(value, 0)
    return variables, tables


@contextlib.contextmanager
def training_state_restored(model: keras.Model) -> Iterator[None]:
    """Puts the model's weights and optimizer variables back as they were after a block that trains it."""
    restore = training_state_snapshot(model)
    try:
        yield
    finally:
        restore()


def check_step_counts(model: keras.Model, steps: int, warmup_steps: int) -> int:
    """Refuses too few steps to time; returns the steps one call of the model's train function runs."""
    if steps < 2 or warmup_steps < 1:
        raise MeasurementError(
            f"Timing needs steps >= 2 and warmup_steps >= 1; received steps={steps}, warmup_steps={warmup_steps}."
        )
    return max(1, int(getattr(model, "steps_per_execution", 1) or 1))
