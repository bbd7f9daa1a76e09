"""Running one timed trial of one configuration: build (or reuse) the model, check numerics, time steps.

Every trial starts from the same weights and a fresh optimizer state, and its numerics run trains on
the same few batches, held in memory, so loss trajectories differ only by what the recipes changed.
Configurations that differ only in their input pipeline share one built and compiled model (their
numerics are the same by construction, so they reuse its loss trajectory too): the data pipeline trial
costs no rebuild and no recompilation. A configuration that offloads the pipeline (`data_service`) starts
its own tf.data service workers for its trial and stops them when it ends.

A configuration that changes the input pipeline first reads one epoch of it, untimed, where the
dataset is finite: a cache fills during the first epoch, and steady-state training, which is what the
trial should predict, reads from it. (The baseline has nothing to fill; a warm-up epoch would not
change its speed.)

Compile time (the first step's tracing and, under XLA, compilation) is reported apart from step time:
it is the first step's wall time beyond a steady step of the numerics run.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import keras

from tfopt.auto.decide import TrialResult
from tfopt.builder import Built, build
from tfopt.data.service_client import serve_offload
from tfopt.errors import MeasurementError
from tfopt.plan import Plan
from tfopt.policies import put_tf32_in_force
from tfopt.profiling.timing import StepTimes, time_training_steps, training_state_snapshot
from tfopt.recipes.base import Recipe, chain

if TYPE_CHECKING:
    import tensorflow as tf


@dataclasses.dataclass
class _Compiled:
    built: Built
    reset: Callable[[], None]
    losses: tuple[float, ...] | None = None
    compile_seconds: float | None = None
    stopped: bool = False
    compile_reported: bool = False


class TrialRunner:
    """Runs trials of configurations of `recipes` on top of a baseline plan; a `search` Runner.

    Args:
        plan: The baseline plan (the user's setup).
        recipes: Candidate label -> recipe.
        steps: Timed steps per trial; at least 2.
        warmup_steps: Untimed steps before them (pipeline warm-up; tracing was done by the numerics run).
        numerics_steps: Steps of the loss trajectory; at least 2.
        clock: Monotonic seconds; compared with the deadline `search` passes.
        built: The baseline plan already built, used as the baseline's model instead of another build.
    """

    def __init__(
        self,
        plan: Plan,
        recipes: Mapping[str, Recipe],
        *,
        steps: int,
        warmup_steps: int,
        numerics_steps: int,
        clock: Callable[[], float] = time.monotonic,
        built: Built | None = None,
    ):
        if steps < 2 or warmup_steps < 1 or numerics_steps < 2:
            raise ValueError(
                f"Trials need steps >= 2, warmup_steps >= 1 and numerics_steps >= 2; received "
                f"steps={steps}, warmup_steps={warmup_steps}, numerics_steps={numerics_steps}."
            )
        self.plan, self.recipes, self.clock = plan, dict(recipes), clock
        self.steps, self.warmup_steps, self.numerics_steps = steps, warmup_steps, numerics_steps
        self._models: dict[str, _Compiled] = {}
        self._batches, self._batch_sizes = _fixed_batches(plan.dataset, numerics_steps)
        self._initial_weights: list[Any] | None = None
        if built is not None:
            self._keep(self.plan, built)

    def baseline(self, deadline: float) -> Built:
        """The built baseline, its numerics run done (so its compile time is its own, not a profiler's).

        Built on first use and shared with the baseline's trials.
        """
        compiled = self._compiled(self.plan)
        self._check_numerics(compiled, deadline)
        return compiled.built

    def __call__(self, configuration: tuple[str, ...], deadline: float) -> TrialResult:
        try:
            return self._trial(configuration, deadline)
        finally:
            # What runs next (another trial, the baseline's profile, apply's "before") runs as the baseline.
            put_tf32_in_force(self.plan.tf32)

    def _trial(self, configuration: tuple[str, ...], deadline: float) -> TrialResult:
        began = self.clock()
        plan = chain(*(self.recipes[label] for label in configuration))(self.plan)
        declined = [str(step) for step in plan.applied[len(self.plan.applied) :] if step.skipped]
        if declined:
            return TrialResult(configuration, skipped="; ".join(declined), wall_seconds=self.clock() - began)
        compiled = self._compiled(plan)
        # The build declines too (XLA off where a layer cannot compile): that configuration is not what it says.
        declined = [str(step) for step in compiled.built.plan.applied[len(plan.applied) :] if step.skipped]
        if declined:
            return TrialResult(configuration, skipped="; ".join(declined), wall_seconds=self.clock() - began)
        self._check_numerics(compiled, deadline)
        compile_seconds = None if compiled.compile_reported else compiled.compile_seconds
        compiled.compile_reported = True
        stopped, times = compiled.stopped, None
        dataset, cluster = plan.dataset, None
        try:
            if not stopped and plan.data_service is not None:  # the trial's own workers, stopped with it
                dataset, cluster = serve_offload(plan.dataset, plan.data_service, batch_size=plan.batch_size)
            if not stopped and plan.dataset is not self.plan.dataset:
                stopped = _read_one_epoch(dataset, deadline, self.clock)
            if not stopped:
                times, stopped = _timed(
                    compiled.built.model,
                    dataset,
                    steps=self.steps,
                    warmup_steps=self.warmup_steps,
                    batch_size=plan.batch_size,
                    deadline=deadline,
                    clock=self.clock,
                )
        finally:
            if cluster is not None:
                cluster.close()
        compiled.reset()
        return TrialResult(
            configuration,
            step_times=times,
            compile_seconds=compile_seconds,
            losses=compiled.losses,
            wall_seconds=self.clock() - began,
            stopped_by_budget=stopped,
        )

    def _compiled(self, plan: Plan) -> _Compiled:
        key = _model_key(plan)
        # TensorFlow's TF32 switch is process-wide and the last build set it: a model built before runs
        # under its own plan's setting again (build() sets it for the model it builds).
        put_tf32_in_force(plan.tf32)
        if key not in self._models:
            self._keep(plan, build(plan.replace(data_service=None)))  # a trial serves its own data
        return self._models[key]

    def _keep(self, plan: Plan, built: Built) -> None:
        """Keeps a built configuration for its trials, starting from the first one's weights."""
        model = built.model
        if self._initial_weights is None:
            self._initial_weights = model.get_weights()
        else:
            # A model_fn without user weights starts from fresh random weights on every build: every
            # configuration starts from the baseline's instead.
            model.set_weights(self._initial_weights)
        self._models[_model_key(plan)] = _Compiled(built, training_state_snapshot(model))

    def _check_numerics(self, compiled: _Compiled, deadline: float) -> None:
        """Runs the loss trajectory once per built model (its first steps also trace and compile)."""
        if compiled.losses is None:
            compiled.reset()
            compiled.losses, compiled.compile_seconds, compiled.stopped = self._numerics(compiled.built.model, deadline)
        compiled.reset()

    def _numerics(self, model: keras.Model, deadline: float) -> tuple[tuple[float, ...], float, bool]:
        recorder = _Recorder(deadline, self.clock)
        model.fit(
            self._batches, steps_per_epoch=self.numerics_steps, epochs=1, verbose=0, shuffle=False, callbacks=[recorder]
        )
        losses = _per_step_losses(recorder.running_means, self._batch_sizes)
        steady = statistics.median(recorder.step_seconds[1:]) if len(recorder.step_seconds) > 1 else 0.0
        compile_seconds = max(recorder.step_seconds[0] - steady, 0.0) if recorder.step_seconds else 0.0
        return losses, compile_seconds, recorder.stopped


class _Recorder(keras.callbacks.Callback):
    """Records step end times and the losses logged (`running_means`); stops training at the deadline."""

    def __init__(self, deadline: float, clock: Callable[[], float]):
        super().__init__()
        self.deadline, self.clock = deadline, clock
        self.logged: dict[str, list[float]] = {}
        self.step_seconds: list[float] = []
        self.stopped = False

    @property
    def running_means(self) -> list[float]:
        """Keras' running-mean "loss", or where it holds nothing but zeros (a distiller's, whose train_step
        computes its losses itself: nothing was compiled to feed Keras' tracker), or is not logged (a GAN's),
        the first other loss that is not: `student_loss`, `d_loss`."""
        losses = [values for name, values in self.logged.items() if name == "loss"]
        losses += [values for name, values in self.logged.items() if name != "loss"]
        return next((values for values in losses if any(values)), losses[0] if losses else [])

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._last = self.clock()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        for name, value in (logs or {}).items():
            if "loss" in name:
                self.logged.setdefault(name, []).append(float(value))  # also waits for the step to finish
        now = self.clock()
        self.step_seconds.append(now - self._last)
        self._last = now
        if now > self.deadline:
            self.stopped = True
            self.model.stop_training = True


def _timed(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    steps: int,
    warmup_steps: int,
    batch_size: int,
    deadline: float,
    clock: Callable[[], float],
) -> tuple[StepTimes | None, bool]:
    """Times steps as every measurement does (windows, one sync at each end); (None, True) where the
    deadline stopped it before all of them were timed."""
    try:
        times = time_training_steps(
            model,
            dataset,
            steps=steps,
            warmup_steps=warmup_steps,
            batch_size=batch_size,
            deadline=deadline,
            clock=clock,
        )
    except MeasurementError:
        if clock() > deadline:
            return None, True
        raise
    if times.steps < steps:
        return None, True
    return times, False


def _read_one_epoch(dataset: tf.data.Dataset, deadline: float, clock: Callable[[], float]) -> bool:
    """Reads a finite dataset once (filling any cache in it); True where the deadline stopped it."""
    if int(dataset.cardinality()) <= 0:
        return False  # infinite or unknown length: there is no epoch to read
    return any(clock() > deadline for _ in dataset)


def _fixed_batches(dataset: tf.data.Dataset, count: int) -> tuple[Any, list[int]]:
    """The first `count` batches, cached in memory and read once, so every numerics run sees them.

    Taken from the dataset itself, so the element spec (and with it the traced train step) is the one
    the timed runs use: the numerics run's first step is the only one that traces.
    """
    import tensorflow as tf

    from tfopt.data.read_copy import copy_to_read

    fixed = copy_to_read(dataset).take(count).cache()
    sizes = [int(tf.nest.flatten(element)[0].shape[0]) for element in fixed]  # (x, y), a dict, x alone
    return fixed.repeat(), [sizes[index % len(sizes)] for index in range(count)]


def _per_step_losses(running_means: list[float], batch_sizes: list[int]) -> tuple[float, ...]:
    """Each step's loss, recovered from Keras' running mean weighted by batch size."""
    losses, total, previous = [], 0, 0.0
    for mean, size in zip(running_means, batch_sizes):
        losses.append(((total + size) * mean - total * previous) / size)
        total, previous = total + size, mean
    return tuple(losses)


def _model_key(plan: Plan) -> str:
    """What decides the built model: configurations with the same key differ only in their data. TF32 is
    part of it: float32 math in TF32 or IEEE float32 is another model to time (and, under XLA, to compile);
    so are the layers the build rewrites or keeps in float32, and the micro-batches it trains in."""
    return repr(
        (
            plan.dtype_policy,
            plan.tf32,
            plan.strategy,
            sorted(plan.strategy_options.items()),
            sorted(plan.compile_config.items()),
            plan.layer_rewrites,
            plan.float32_layers,
            plan.outputs_in_16_bits,
            plan.micro_batches,
        )
    )
