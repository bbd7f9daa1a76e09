"""Real training against the on-device compute-only ceiling of the same model: input efficiency and MFU.

The compute-only ceiling is the same train step fed one batch that already lives in device memory
(placed there once, under the model's strategy), with no iterator and no host-to-device copy per step,
and the same one sync per call as `fit` (see `tfopt.profiling.timing`): only the input pipeline differs.
`input efficiency = ceiling step time / real step time`; a real step faster than the ceiling beyond the
measured spread is a measurement problem, never shown as more than 100%. MFU counts the step's FLOPs with
TensorFlow's own cost analysis of the step's graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfopt.errors import DataError, MeasurementError, describe_error, released
from tfopt.hardware import Hardware
from tfopt.profiling.timing import (
    StepTimes,
    check_step_counts,
    time_training_steps,
    training_state_restored,
    window_layout,
)
from tfopt.training.stopping import take_stop

if TYPE_CHECKING:
    import keras
    import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Real training speed next to the on-device compute-only ceiling of the same model.

    Attributes:
        real: Steps fed by the real input pipeline.
        ceiling: Steps fed one batch already in device memory.
        flops_per_step: Model FLOPs of one training step (TensorFlow's cost analysis of the step's
            graph), where counted.
        peak_flops_per_second: The devices' peak dense FLOP/s for the precision in use (all replicas),
            where the accelerator is in `peak_flops`' table.
        precision: The precision that peak is for ("bf16", "fp16", "tf32", "fp32"), where known.
    """

    real: StepTimes
    ceiling: StepTimes
    flops_per_step: float | None = None
    peak_flops_per_second: float | None = None
    precision: str | None = None

    @property
    def ceiling_ratio(self) -> float:
        """Ceiling step time / real step time as measured (above 1.0 only through noise or a fault)."""
        return self.ceiling.median_seconds / self.real.median_seconds

    @property
    def noise(self) -> float:
        """The larger relative spread (IQR / median) of the real and ceiling windows."""
        return max(times.spread_seconds / times.median_seconds for times in (self.real, self.ceiling))

    @property
    def measurement_problem(self) -> str | None:
        """Why the input efficiency cannot be read, or None: real steps beat the ceiling beyond the noise."""
        if self.ceiling_ratio <= 1.0 + 2.0 * self.noise:
            return None
        return (
            f"real steps ran {self.ceiling_ratio:.2f}x as fast as the compute-only ceiling, beyond twice the "
            f"measured spread ({self.noise:.1%}): the two runs saw different conditions (other load on the "
            "machine, clocks, a recompilation). Measure again with more steps."
        )

    @property
    def input_efficiency(self) -> float | None:
        """How close real training comes to the compute-only ceiling (1.0 = the input costs nothing).

        None where the reading is a measurement problem; a ratio above 1.0 within the noise reads 1.0.
        """
        if self.measurement_problem is not None:
            return None
        return min(1.0, self.ceiling_ratio)

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: model FLOPs per second of real training over the devices' peak."""
        if not self.flops_per_step or not self.peak_flops_per_second:
            return None
        return self.flops_per_step / self.real.median_seconds / self.peak_flops_per_second

    def to_dict(self) -> dict[str, Any]:
        return {
            "real": self.real.to_dict(),
            "ceiling": self.ceiling.to_dict(),
            "input_efficiency": self.input_efficiency,
            "measurement_problem": self.measurement_problem,
            "flops_per_step": self.flops_per_step,
            "peak_flops_per_second": self.peak_flops_per_second,
            "precision": self.precision,
            "mfu": self.mfu,
        }


@dataclasses.dataclass(frozen=True)
class CeilingStep:
    """What the compute-only ceiling runs: the train step and a batch already in device memory.

    Made once per measurement by `prepare_ceiling`, so the step is traced (and XLA-compiled) once and the
    pipeline is read once, however many rounds time it.

    Attributes:
        step: Runs `steps_per_call` training steps on a batch (as Keras' `steps_per_execution` does).
        batch: The dataset's first batch, placed on the model's devices.
        steps_per_call: Steps one call of `step` runs.
    """

    step: Callable[[Any], Any]
    batch: Any
    steps_per_call: int


def prepare_ceiling(model: keras.Model, dataset: tf.data.Dataset) -> CeilingStep:
    """The ceiling's step and device-resident batch for `model`, running as many steps per call as the
    model's `steps_per_execution` so that only the input pipeline differs from `fit`."""
    per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    try:
        batch = device_batch(model, dataset)
    except StopIteration:
        raise DataError(
            "Your pipeline gave no batch when tfopt read it again to measure, though its first read gave one: it "
            "cannot be read twice (from_generator handing out one generator object, which a pass spends). Plain "
            "fit would train its first epoch only, and tfopt's reads have taken some of its elements: give "
            "from_generator a function making a new generator at each call (from_generator(make_examples), not "
            "from_generator(lambda: examples)), make the dataset again, and rerun."
        ) from None
    except Exception as error:  # noqa: BLE001 - raised again as a tfopt error, in words
        raise MeasurementError(f"Reading the first batch failed: {describe_error(error)}") from released(error)
    return CeilingStep(step=train_step_function(model, steps_per_call=per_call), batch=batch, steps_per_call=per_call)


def time_ceiling_steps(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    steps: int,
    warmup_steps: int,
    batch_size: int,
    window_steps: int | None = None,
    sync: Callable[[Any], None] | None = None,
    prepared: CeilingStep | None = None,
) -> StepTimes:
    """Times the model's train step on the dataset's first batch, placed in device memory once.

    The step is Keras' own `train_step` under the model's strategy, compiled as Keras compiles it
    (`tf.function`, the model's `jit_compile`, `steps_per_execution` steps per call), called directly: no
    iterator, no host copy per step. Each call's output is read to the host, as `fit` reads each call's
    logs (see the module docstring), so the two differ by the input alone. What `fit` adds per call
    besides that (its callback loop, the iterator's `get_next`) still counts against the input: a few
    hundred microseconds on this project's CPU, which matters only for steps of about a millisecond.

    Args:
        model: A compiled Keras model.
        dataset: Its batched pipeline (only the first batch is read).
        steps: Steps to time, rounded up to whole windows.
        warmup_steps: Untimed steps first (tracing, compilation).
        batch_size: Examples per step.
        window_steps: Steps per window; by default `window_layout`'s choice for `steps`.
        sync: Waits for the device given a call's output, after every call; reads it to the host by default.
        prepared: The step and batch from `prepare_ceiling`; made here by default.

    Raises:
        MeasurementError: The arguments are out of range, or the step failed.
    """
    per_call = check_step_counts(model, steps, warmup_steps)
    windows, window_steps = window_layout(steps, steps_per_call=per_call, window_steps=window_steps)
    sync = sync or _read_to_host
    try:
        prepared = prepared or prepare_ceiling(model, dataset)
        for _ in range(-(-warmup_steps // per_call)):
            sync(prepared.step(prepared.batch))
            take_stop()
        seconds = []
        for _ in range(windows):
            start = time.perf_counter()
            for _ in range(window_steps // per_call):
                sync(prepared.step(prepared.batch))
                take_stop()  # a stop asked for while a command measures (tfopt.training.stopping)
            seconds.append((time.perf_counter() - start) / window_steps)
    except Exception as error:
        raise MeasurementError(f"The compute-only ceiling failed: {type(error).__name__}: {error}") from error
    return StepTimes(seconds=tuple(seconds), batch_size=batch_size, window_steps=window_steps)


def device_batch(model: keras.Model, dataset: tf.data.Dataset) -> Any:
    """The dataset's first batch, in the memory of the devices the model trains on.

    Under a tf.distribute strategy the distributed dataset places each replica's share on its device
    (that is what `experimental_distribute_dataset` does); under the default strategy the batch is
    copied once to the default device (the first GPU where there is one).
    """
    import tensorflow as tf

    strategy = model.distribute_strategy
    from tfopt.data.read_copy import copy_to_read

    first = copy_to_read(dataset).take(1)
    if strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy():
        batch = next(iter(first))
        with tf.device(_default_device()):
            return tf.nest.map_structure(tf.identity, batch)
    return next(iter(strategy.experimental_distribute_dataset(first)))


def train_step_function(model: keras.Model, *, steps_per_call: int = 1) -> Callable[[Any], Any]:
    """The model's train step as Keras runs it in `fit` (strategy.run inside a tf.function with the
    model's jit_compile; `steps_per_call` steps in one outer function, as `steps_per_execution` runs
    them), returning the last step's first logged value averaged over replicas."""
    import tensorflow as tf

    strategy = model.distribute_strategy

    def one_step(data: Any) -> Any:
        outputs = strategy.run(model.train_step, args=(data,))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, tf.nest.flatten(outputs)[0], axis=None)

    step = (
        one_step
        if model.run_eagerly
        else tf.function(one_step, jit_compile=model.jit_compile is True, reduce_retracing=True)
    )
    if steps_per_call == 1:
        return step

    def several_steps(data: Any) -> Any:
        # An explicit while_loop, not AutoGraph: AutoGraph may be off in the caller's process.
        _, output = tf.while_loop(
            lambda index, _: index < steps_per_call - 1,
            lambda index, _: (index + 1, step(data)),
            (tf.constant(0), step(data)),
        )
        return output

    return several_steps if model.run_eagerly else tf.function(several_steps)


def train_step_flops(
    model: keras.Model, dataset: tf.data.Dataset, *, prepared: CeilingStep | None = None
) -> float | None:
    """Model FLOPs of one training step on the dataset's batch, from TensorFlow's cost analysis.

    The step's graph (forward, backward and optimizer update, all replicas) is traced and TensorFlow's
    per-op FLOP statistics (the ones `tf.compat.v1.profiler` reports) are summed. Ops without a FLOP
    statistic count 0, so this is a lower bound dominated by matmuls and convolutions, as MFU is defined.

    Args:
        model: A compiled Keras model.
        dataset: Its batched pipeline (only the first batch is read).
        prepared: The ceiling's step and batch, reused where it runs one step per call.

    Returns:
        The FLOPs, or None where the step cannot be traced (a model that runs eagerly) or counts none.
    """
    import tensorflow as tf
    from tensorflow.python.profiler import model_analyzer, option_builder

    if model.run_eagerly:
        return None
    if prepared is None or prepared.steps_per_call != 1:
        prepared = CeilingStep(
            step=train_step_function(model),
            batch=prepared.batch if prepared else device_batch(model, dataset),
            steps_per_call=1,
        )
    graph = prepared.step.get_concrete_function(prepared.batch).graph
    options = (
        option_builder.ProfileOptionBuilder(option_builder.ProfileOptionBuilder.float_operation())
        .with_empty_output()
        .build()
    )
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")  # the v1 profiler warns about its own deprecated helpers on every call
    try:
        total = model_analyzer.profile(graph=graph, options=options).total_float_ops
    finally:
        logger.setLevel(level)
    return float(total) or None


def measure(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    steps: int,
    warmup_steps: int,
    batch_size: int,
    hardware: Hardware | None = None,
) -> Measurement:
    """Times real training and the on-device ceiling, counts the step's FLOPs, then restores the model.

    One side of `measure_side_by_side`; see there.

    Args:
        model: A compiled Keras model.
        dataset: Its batched training pipeline.
        steps: Steps timed on each side, in total over the rounds.
        warmup_steps: Untimed steps before each side's first round (later rounds warm up one step).
        batch_size: Examples per step.
        hardware: The machine; on accelerators the step's FLOPs are counted for MFU. Detected by default.

    Returns:
        The real and ceiling step times, and what MFU needs.
    """
    return measure_side_by_side(
        [Side(model, dataset, batch_size)], steps=steps, warmup_steps=warmup_steps, hardware=hardware
    ).measurements[0]


@dataclasses.dataclass(frozen=True)
class Side:
    """One training setup measured by `measure_side_by_side`.

    Attributes:
        model: A compiled Keras model.
        dataset: Its batched training pipeline.
        batch_size: Examples per step.
        before_round: Called before each of its rounds: puts in force a process setting the side runs under
            (TensorFlow's TF32 switch, read when kernels run), or None.
    """

    model: keras.Model
    dataset: tf.data.Dataset
    batch_size: int
    before_round: Callable[[], None] | None = None


@dataclasses.dataclass(frozen=True)
class SideBySide:
    """Setups measured in alternating rounds.

    Attributes:
        measurements: One per side, in order.
        rounds: Per side, the examples/s of each round (the median of the round's windows).
    """

    measurements: tuple[Measurement, ...]
    rounds: tuple[tuple[float, ...], ...]

    def ratios(self, side: int, other: int) -> tuple[float, ...]:
        """Examples/s of `side` over `other`, round by round.

        Each round's ratio compares the two sides measured moments apart, so a change of load on the machine
        falls on both; the range over rounds is the comparison's noise (`tfopt.profiling.metrics.spread`).
        """
        return tuple(a / b for a, b in zip(self.rounds[side], self.rounds[other]))


def measure_side_by_side(
    sides: list[Side], *, steps: int, warmup_steps: int, hardware: Hardware | None = None
) -> SideBySide:
    """Times several setups in alternating rounds (A, B, A, B, ...), then restores every model.

    On a shared machine a change of load between "before" and "after" reads as a recipe's effect when the two
    are measured one after the other. Here every round times each side in turn (its real training, then its
    on-device ceiling), so load changes hit all sides alike, and the spread of the per-round ratios says how
    much of a difference is noise. Each model's variables and its optimizer's are put back as they were.

    Args:
        sides: The setups, each timed at least `steps` steps over the rounds.
        steps: Steps timed on each side, in windows as `window_layout` splits them; a round holds one window,
            or two where windows are of one step. Every side is timed in as many rounds as the side with the
            most (a side running 16 steps per call makes fewer, longer windows of the same steps), so that each
            ratio has its rounds.
        warmup_steps: Untimed steps before each side's first round (later rounds warm up one step).
        hardware: The machine; on accelerators the step's FLOPs are counted for MFU. Detected by default.

    Returns:
        Each side's measurement and its examples/s per round.
    """
    from tfopt.profiling.peak_flops import peak_flops_per_second, precision_in_use

    if hardware is None:
        from tfopt.hardware import detect

        hardware = detect()
    layouts, rounds = [], 0
    for side in sides:
        per_call = check_step_counts(side.model, steps, warmup_steps)
        windows, window_steps = window_layout(steps, steps_per_call=per_call)
        # A round times whole windows, at least 2 steps (a timed fit needs 2): one window of 5 steps, two of 1.
        per_round = -(-2 // window_steps)
        layouts.append((per_round, window_steps))
        rounds = max(rounds, -(-windows // per_round))
    real: list[list[float]] = [[] for _ in sides]
    ceiling: list[list[float]] = [[] for _ in sides]
    per_round: list[list[float]] = [[] for _ in sides]
    with contextlib.ExitStack() as restored:
        # Sides may share a model (the baseline's model on two pipelines): its state is saved, and its ceiling
        # step traced, once.
        by_model: dict[int, CeilingStep] = {}
        for side in sides:
            if id(side.model) not in by_model:
                restored.enter_context(training_state_restored(side.model))
                by_model[id(side.model)] = prepare_ceiling(side.model, side.dataset)
        prepared = [by_model[id(side.model)] for side in sides]
        for index in range(rounds):
            for number, (side, (windows_per_round, window_steps)) in enumerate(zip(sides, layouts)):
                warmup = warmup_steps if index == 0 else 1
                timing = dict(batch_size=side.batch_size, window_steps=window_steps)
                if side.before_round is not None:
                    side.before_round()
                round_steps = windows_per_round * window_steps
                times = time_training_steps(
                    side.model, side.dataset, steps=round_steps, warmup_steps=warmup, **timing
                ).seconds
                real[number].extend(times)
                per_round[number].append(side.batch_size / statistics.median(times))
                ceiling[number].extend(
                    time_ceiling_steps(
                        side.model,
                        side.dataset,
                        steps=round_steps,
                        warmup_steps=warmup,
                        prepared=prepared[number],
                        **timing,
                    ).seconds
                )
    measurements = []
    for number, (side, (_, window_steps)) in enumerate(zip(sides, layouts)):
        flops = peak = precision = None
        if hardware.accelerator != "cpu":
            precision = precision_in_use(side.model, hardware)
            peak = peak_flops_per_second(
                hardware, precision, devices=side.model.distribute_strategy.num_replicas_in_sync
            )
            flops = train_step_flops(side.model, side.dataset, prepared=prepared[number])
        timing = dict(batch_size=side.batch_size, window_steps=window_steps)
        measurements.append(
            Measurement(
                real=StepTimes(tuple(real[number]), **timing),
                ceiling=StepTimes(tuple(ceiling[number]), **timing),
                flops_per_step=flops,
                peak_flops_per_second=peak,
                precision=precision,
            )
        )
    return SideBySide(measurements=tuple(measurements), rounds=tuple(tuple(values) for values in per_round))


def _read_to_host(value: Any) -> None:
    import tensorflow as tf

    for tensor in tf.nest.flatten(value):
        tensor.numpy()


def _default_device() -> str:
    import tensorflow as tf

    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
