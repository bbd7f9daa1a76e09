"""`tfopt.apply`: plan, apply the recipes, build once, and measure before and after.

The user's model and dataset are only read: the baseline ("before") is a copy built from the same
plan with no recipe applied, so both sides are measured the same way, over the same number of steps, in
alternating rounds.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tfopt.builder import build, without_mixed_precision
from tfopt.errors import DataError, MeasurementError, RecipeConfigError, StorageError, storage_error
from tfopt.fidelity import Outcome, first_batch_checked, reference_outcome
from tfopt.hardware import Hardware, detect
from tfopt.plan import Plan, make_plan
from tfopt.policies import put_tf32_in_force
from tfopt.profiling import capture
from tfopt.profiling.measurement import Measurement
from tfopt.profiling.metrics import Metrics, compared, describe_rounds, headline_speedup, spread
from tfopt.recipes.base import Recipe, chain
from tfopt.recipes.distribution import several_steps_refused
from tfopt.recipes.steps_per_execution import steps_choices
from tfopt.training.micro_batches import fitted
from tfopt.verdict import built_again, candidates, decided, decided_alone

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfopt.builder import Built
    from tfopt.data.source import DataSource
    from tfopt.profiling.report import Report

_log = logging.getLogger("tfopt")


@dataclasses.dataclass(frozen=True, repr=False)
class ApplyResult:
    """The optimized training setup and the evidence that it is faster.

    Attributes:
        model: The rebuilt, compiled model (the user's class) with the user's weights; train it with
            `model.fit(dataset.repeat(), steps_per_epoch=steps, epochs=...)` where `dataset.cardinality()`
            gives the steps and they are a multiple of `model.steps_per_execution` (one iterator for all
            epochs; see `tfopt.training.fit`; Keras runs each call whole; a seeded reshuffle then gives other
            orders than plain `fit` draws), else `model.fit(dataset, epochs=...)`.
        dataset: The optimized input pipeline.
        strategy: The tf.distribute strategy the model lives under.
        plan: The applied plan; `plan.applied` says what each recipe did and why.
        baseline_plan: The plan of the "before" measurement (the user's setup, no recipe).
        before: The baseline's measurement, or None when measuring was turned off.
        after: The optimized setup's measurement, or None when measuring was turned off.
        before_profile: The baseline's profile (trace, breakdown, diagnosis) with profile=True.
        after_profile: The optimized setup's profile with profile=True.
        tuning: With recipes="auto", the `tfopt.auto.Tuning` whose `.table` holds every trial and decision.
        speedup_rounds: The speedup of each round where before and after were measured side by side, in
            alternating rounds (`speedup_range` gives their range).
        service: The tf.data service workers started on this machine for the dataset (`data_service:
            {workers: N}`), or None; they serve `dataset` until `close()` or the end of the process.

    Example:
        >>> import keras, tensorflow as tf
        >>> from tfopt.hardware import Hardware
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
        ...                           keras.layers.Dense(3, activation="softmax")])
        >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        >>> data = tf.data.Dataset.from_tensor_slices((tf.zeros((16, 4)), tf.zeros(16, "int32"))).batch(8)
        >>> result = apply(model, data, hardware=Hardware(cpu_flags=frozenset({"avx512_bf16"})), measure_speed=False)
        >>> [(step.recipe, step.skipped) for step in result.plan.applied]  # no BatchNormalization: nothing to fuse
        [('data_pipeline', False), ('mixed_precision', False), ('fused_layers', True), ('xla', True)]
        >>> [layer.compute_dtype for layer in result.model.layers]  # the output layer stays float32
        ['bfloat16', 'float32']
    """

    model: keras.Model
    dataset: tf.data.Dataset
    strategy: tf.distribute.Strategy
    plan: Plan
    baseline_plan: Plan
    before: Measurement | None
    after: Measurement | None
    before_profile: capture.Profile | None = None
    after_profile: capture.Profile | None = None
    tuning: Any = None
    speedup_rounds: tuple[float, ...] = ()
    service: Any = None

    def close(self) -> None:
        """Stops the tf.data service workers started for `dataset`, if any (after that `dataset` must not be read)."""
        if self.service is not None:
            self.service.close()

    def __enter__(self) -> ApplyResult:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def report(self, *, price_per_hour: float | None = None, steps_per_epoch: int | None = None) -> Report:
        """The before/after report of an `apply(..., profile=True)` run; `.save("report.html")` writes it.

        Raises:
            MeasurementError: apply() ran without profile=True, so there is nothing to report.
        """
        from tfopt.profiling.report import compare

        if self.before_profile is None or self.after_profile is None:
            raise MeasurementError("No profiles to report: call tfopt.apply(..., profile=True).")
        return compare(
            self.before_profile,
            self.after_profile,
            applied=self.plan.applied,
            price_per_hour=price_per_hour,
            steps_per_epoch=steps_per_epoch,
            speedup_rounds=self.speedup_rounds,
        )

    @property
    def speedup_range(self) -> tuple[float, float] | None:
        """The lowest and highest speedup of the rounds measured side by side: the speedup's noise."""
        return spread(self.speedup_rounds)[1:] if self.speedup_rounds else None

    @property
    def speedup(self) -> float | None:
        """Of examples/s (the batch may differ): the median of the rounds measured side by side, or after over
        before with fewer than 3 (`tfopt.profiling.metrics.headline_speedup`); None if not measured."""
        if self.before is None or self.after is None:
            return None
        return headline_speedup(
            self.before.real.examples_per_second, self.after.real.examples_per_second, self.speedup_rounds
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe summary: hardware, what each recipe did, and both measurements."""
        return {
            "hardware": self.plan.hardware.describe(),
            "applied": [dataclasses.asdict(step) for step in self.plan.applied],
            "dtype_policy": self.plan.dtype_policy,
            "jit_compile": self.plan.jit_compile,
            "strategy": self.plan.strategy,
            "before": self.before.to_dict() if self.before else None,
            "after": self.after.to_dict() if self.after else None,
            "metrics": (
                {side: self._metrics(side).to_dict() for side in ("before", "after")}
                if self.before and self.after
                else None
            ),
            "speedup": self.speedup,
            "speedup_rounds": list(self.speedup_rounds),
            "tuning": self.tuning.to_dict() if self.tuning else None,
        }

    def summary(self) -> str:
        """One line: examples/s before and after on the hardware measured, then accelerator busy %, MFU, input
        wait % and input efficiency where measured (busy % and input wait need profile=True)."""
        if self.before is None or self.after is None:
            applied = list(dict.fromkeys(step.recipe for step in self.plan.applied if not step.skipped))
            return (
                f"applied {', '.join(applied) or 'no recipe'} as planned, not measured (measure_speed=False): "
                "none was timed against your setup"
            )
        ratio = f"{self.speedup:.2f}x" + (describe_rounds(self.speedup_rounds) if self.speedup_rounds else "")
        return (
            f"{self.before.real.examples_per_second:.1f} -> {self.after.real.examples_per_second:.1f} "
            f"examples/s ({ratio}) on {self.plan.hardware.describe()}; "
            f"{compared(self._metrics('before'), self._metrics('after'))}"
        )

    def _metrics(self, side: str) -> Metrics:
        profile = getattr(self, f"{side}_profile")
        return Metrics.of(self.plan.hardware, getattr(self, side), profile.breakdown if profile else None)

    def __repr__(self) -> str:
        # Not the dataclass repr: that prints the model, the dataset and the sample batch (a whole tensor).
        return f"ApplyResult({self.summary()}; model={self.model.name!r}, {self.plan!r})"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(step.recipe)}</td><td>{'skipped' if step.skipped else 'applied'}"
            f"</td><td>{html.escape(step.detail)}</td></tr>"
            for step in self.plan.applied
        )
        return (
            f"<div><b>tfopt</b>: {html.escape(self.summary())}<br>"
            f"<small>{html.escape(self.plan.hardware.describe())}</small>"
            f"<table><tr><th>recipe</th><th></th><th>what and why</th></tr>{rows}</table></div>"
        )


def resolve_recipes(recipes: str | Recipe | Sequence[Any]) -> Recipe:
    """Turns what `apply` accepts into one recipe: "default", a recipe, or a list of recipes/YAML items.

    Example:
        >>> [recipe.name for recipe in resolve_recipes("default").recipes]
        ['data_pipeline', 'mixed_precision', 'fused_layers', 'xla']
    """
    from tfopt.recipes import DataPipeline, FusedLayers, MixedPrecision, Xla
    from tfopt.registry import from_item

    if isinstance(recipes, Recipe):
        return recipes
    if recipes == "default":
        return chain(DataPipeline(), MixedPrecision(), FusedLayers(), Xla())
    if recipes == "auto":
        raise RecipeConfigError(
            "recipes='auto' is decided by timing trials of the model on its data, so it has "
            "no fixed recipe list: pass it to tfopt.apply(model, dataset, recipes='auto'), or "
            "call tfopt.auto.tune(plan)."
        )
    if isinstance(recipes, str) or not isinstance(recipes, Sequence):
        raise RecipeConfigError(
            f"recipes={recipes!r} is not valid. Pass 'default', 'auto', a recipe, or a list "
            "of recipes (objects, names, or {name: {settings}} items)."
        )
    return chain(*(item if isinstance(item, Recipe) else from_item(item) for item in recipes))


def apply(
    model: keras.Model,
    dataset: tf.data.Dataset | DataSource,
    recipes: str | Recipe | Sequence[Any] = "default",
    *,
    model_fn: Callable[[], Any] | None = None,
    compile: Mapping[str, Any] | None = None,
    batch_size: int | None = None,
    steps: int = 20,
    warmup_steps: int = 5,
    measure_speed: bool = True,
    hardware: Hardware | None = None,
    profile: bool = False,
    logdir: str | None = None,
    tune_budget_seconds: float = 120.0,
    on_tune_progress: Callable[[Any], None] | None = None,
) -> ApplyResult:
    """Applies recipes to a model and its input pipeline, and measures the setup before and after.

    Args:
        model: A compiled Keras model of any class; copied in process with its weights (see
            `tfopt.model_copy`), never modified.
        dataset: A batched `tf.data.Dataset` of (inputs, targets), or a `tfopt.data` source (then
            `batch_size` is required and tfopt builds the pipeline itself).
        recipes: "default" (data pipeline, mixed precision, fused layers, XLA, each deciding by the hardware), "auto"
            (time each candidate on this machine and keep only what helps; see `tfopt.auto.tune`), a
            recipe, or a list of recipes, names or `{name: {settings}}` items.
        model_fn: Creates the model afresh instead of a copy of `model` (whose weights it starts from).
        compile: Compile arguments, when the model is not compiled or should train differently.
        batch_size: Examples per batch, for a `tfopt.data` source.
        steps: Timed training steps for each measurement.
        warmup_steps: Untimed steps before each measurement (tracing, compilation, warm-up).
        measure_speed: Measure before and after (two short training runs each); False only builds.
        hardware: The hardware to plan for; detected when None.
        profile: Also capture a TF Profiler trace of both setups, analyse and diagnose them
            (`result.before_profile`, `result.after_profile`, `result.report()`).
        logdir: Where the traces go (`<logdir>/before`, `<logdir>/after`); temporary directories by default.
        tune_budget_seconds: With recipes="auto": the time its trials may take (they time their own steps,
            as many as the budget has room for; `steps` is the before-and-after measurement's).
        on_tune_progress: With recipes="auto": receives a `tfopt.auto.ProgressEvent` per phase and trial.

    Returns:
        An `ApplyResult` with the optimized model, dataset and strategy, the plan, and the measurements.

    TensorFlow's TF32 switch is process-wide: the returned model trains under its plan's setting, so apply
    leaves that in force (restoring yours if it fails); the next apply's baseline still reads the setting
    you had (`tfopt.policies.users_tf32_setting`).

    Raises:
        TfoptError: Bad input (not a Keras model or tf.data.Dataset, unknown or clashing recipes), with
            a message that says how to fix it.

    Example:
        >>> import keras, tensorflow as tf
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        >>> data = tf.data.Dataset.from_tensor_slices((tf.random.normal((64, 4)), tf.zeros(64, "int32"))).batch(8)
        >>> result = apply(model, data, steps=3, warmup_steps=1)
        >>> result.after.real.batch_size
        8
    """
    import tensorflow as tf

    _check_arguments(steps=steps, warmup_steps=warmup_steps, hardware=hardware, compile=compile)
    auto = isinstance(recipes, str) and recipes == "auto"
    recipe = None if auto else resolve_recipes(recipes)
    hardware = hardware or detect()
    source = None
    if _is_source(dataset):
        if not batch_size:
            raise DataError(
                "A tfopt.data source was passed as the dataset: give batch_size= so tfopt can build the pipeline."
            )
        source, dataset = dataset, dataset.pipeline(batch_size=batch_size, optimized=False)
    if profile and logdir is not None:
        _made_directory(logdir)
    from tfopt.data.python_generators import python_generators_kept
    from tfopt.data.read_copy import copies_kept
    from tfopt.keras_seed import keras_seed_kept

    # tfopt reads copies of a pipeline that reading moves on (a seeded shuffle's seeds): the one handed back
    # starts where yours stands, as `fit(dataset)` would have started.
    tf32_in_force = bool(tf.config.experimental.tensor_float_32_execution_enabled())
    with copies_kept(), keras_seed_kept(), python_generators_kept():  # Python's put back first: Keras' draws from it
        baseline = make_plan(model, dataset, hardware=hardware, model_fn=model_fn, compile=compile, source=source)
        if recipe is not None:
            _checked(recipe, baseline, model)  # before anything is built: a recipe that cannot serve it costs nothing
        try:
            return _applied(
                baseline,
                recipe,
                measuring=measure_speed or profile,
                verifying=_left_to_tfopt(recipe),
                tune_budget_seconds=tune_budget_seconds,
                on_tune_progress=on_tune_progress,
                profile=profile,
                steps=steps,
                warmup_steps=warmup_steps,
                hardware=hardware,
                logdir=logdir,
            )
        except BaseException:
            # Builds switched TF32 for models a failed apply never returns: back to what was in force, under which
            # an earlier result's model may train.
            put_tf32_in_force(tf32_in_force)
            raise


def _check_arguments(*, steps: Any, warmup_steps: Any, hardware: Any, compile: Any) -> None:
    """Refuses arguments of the wrong kind before anything is built: each would fail later, deep in a build or
    a measurement, in other words than these."""
    for name, value, least in (("steps", steps, 2), ("warmup_steps", warmup_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise RecipeConfigError(f"apply: {name}={value!r} must be a whole number >= {least} (steps timed).")
    if hardware is not None and not isinstance(hardware, Hardware):
        raise RecipeConfigError(
            f"apply: hardware={hardware!r} is not a tfopt.hardware.Hardware: pass tfopt.hardware.detect() (the "
            "default), or a Hardware(...) describing the machine to plan for."
        )
    if compile is not None and not isinstance(compile, Mapping):
        raise RecipeConfigError(
            f"apply: compile={compile!r} must be a dict of Keras compile arguments, e.g. "
            "compile={'optimizer': 'adam', 'loss': 'sparse_categorical_crossentropy'}."
        )


def _checked(recipe: Recipe, plan: Plan, model: keras.Model | None) -> None:
    """`recipe.check(plan)`; where it fails on data the model does not take (an unbatched dataset, which a
    rebatch cannot split), the error says so, as the first batch's check would."""
    from tfopt import data_mismatch
    from tfopt.data.read_copy import copy_to_read
    from tfopt.errors import TfoptError

    try:
        recipe.check(plan)
    except TfoptError:
        raise
    except Exception as error:
        mismatch = None if model is None else data_mismatch.explain(model, next(iter(copy_to_read(plan.dataset))))
        if mismatch is None:
            raise
        raise mismatch from error


def _applied(
    baseline: Plan,
    recipe: Recipe | None,
    *,
    measuring: bool,
    verifying: frozenset[str],
    tune_budget_seconds: float,
    on_tune_progress: Callable[[Any], None] | None,
    **evidence: Any,
) -> ApplyResult:
    """`apply` from the baseline plan on, in phases each handing its result to the next: the baseline built and
    run on the first batch, the plan (trials included; recipe None: "auto"), the optimized build checked on
    that batch (a recipe that breaks the model is left out, or the error raised, before minutes of measuring),
    the setups measured side by side, and the verdict on the recipes left to tfopt. Where the device runs out
    of memory on the first batch, a setup trains in micro-batches (`tfopt.training.micro_batches`)."""
    from tfopt.data.read_copy import copy_to_read

    batch = next(iter(copy_to_read(baseline.dataset).take(1)))

    def baseline_run(plan: Plan) -> tuple[Built, Outcome]:
        built = build(plan)
        return built, reference_outcome(built.model, batch, plan.micro_batches)

    # A batch that does not fit the device trains in micro-batches (both setups, the optimized one from as many).
    fitting, (built_baseline, reference) = fitted(baseline, baseline_run)
    if baseline.weights_from is None:
        # A model from model_fn alone: every later build (trials, the optimized setup) starts from the
        # baseline's initial weights, so what is compared trains the same model. Measuring restores them.
        baseline = baseline.replace(weights_from=built_baseline.model)
        fitting = fitting.replace(weights_from=built_baseline.model)
    # "auto" times its trials from the baseline as it fits; recipes plan for the user's batches.
    optimized, tuning = _planned(
        baseline if recipe else fitting, recipe, built_baseline, tune_budget_seconds, on_tune_progress
    )

    def optimized_run(plan: Plan) -> Built:
        built = build(plan)
        try:
            checked = first_batch_checked(built, reference, batch, baseline_policy=baseline.dtype_policy)
            if checked.xla_fails is not None:  # built again from the plan: XLA made its batches static
                built.close()
                _log.warning("xla: left out: %s", checked.xla_fails)
                return optimized_run(plan.with_compile(jit_compile=False).left_out("xla", f"off: {checked.xla_fails}"))
            if checked.mixed_precision_fails is None:
                return checked.built
            built = without_mixed_precision(checked.built, baseline.dtype_policy, checked.mixed_precision_fails)
            # Checked again at the user's precision: a failure that is not the 16 bits' (a model Keras cannot
            # build under a strategy) is said as such, not handed back as a setup that cannot train.
            return first_batch_checked(built, reference, batch, baseline_policy=baseline.dtype_policy).built
        except BaseException:
            built.close()
            raise

    _, built = fitted(optimized, optimized_run, pieces=fitting.micro_batches)
    if "steps_per_execution" in verifying and (refused := several_steps_refused(built.plan)):
        # "auto" was planned before distribution placed the model: under this strategy there is nothing to measure.
        why = f"{refused}: {built.plan.steps_per_call} step(s) per call, as before"
        built = dataclasses.replace(built, plan=built.plan.left_out("steps_per_execution", why))
    before = after = before_profile = after_profile = None
    rounds: tuple[float, ...] = ()
    try:  # past the build, a failure stops what it started for the dataset (tf.data service workers)
        if measuring:
            if "fused_layers" in verifying and built.plan.layer_rewrites:
                sides = [
                    ("without fused_layers", built_again(built, built.plan.replace(layer_rewrites=()))),
                    ("", built),
                ]
                built = decided_alone("fused_layers", sides, _measured_alone(sides, evidence))
            if "steps_per_execution" in verifying and steps_choices(built.plan):
                sides = [(f"at {built.plan.steps_per_call} step(s) per call", built)]
                for steps in steps_choices(built.plan):
                    plan = built.plan.with_compile(steps_per_execution=steps)
                    sides.append((f"{steps} steps per call", built_again(built, plan)))
                built = decided_alone("steps_per_execution", sides, _measured_alone(sides, evidence))
            setups = candidates(built_baseline, built, verifying)
            side_by_side = _measured_side_by_side(list(setups.setups.values()), **evidence)
            verdict = decided(setups, side_by_side)
            built = verdict.built
            chosen = list(setups.setups).index(verdict.chosen)
            before, after = side_by_side.measurements[0], side_by_side.measurements[chosen]
            rounds = side_by_side.ratios(chosen, 0)
            if evidence["profile"]:
                before_profile, after_profile = (
                    _profiled(side, name, measured, **evidence)
                    for side, name, measured in ((built_baseline, "before", before), (built, "after", after))
                )
            put_tf32_in_force(built.plan.tf32)  # the model handed back trains under its own setting
    except BaseException:
        built.close()
        raise
    if not measuring and "steps_per_execution" in verifying and steps_choices(built.plan):
        why = f"not measured (measure_speed=False): {built.plan.steps_per_call} step(s) per call, as before"
        built = dataclasses.replace(built, plan=built.plan.left_out("steps_per_execution", why))
    # The functions traced to check and measure the setup are not handed on: the user's fit traces its own from
    # the pipeline it is given, as plain Keras does (a trace reused from a batch of unknown size does other
    # work where a pipeline of unknown length with a fixed batch size runs out: Keras' loss mean and step count).
    built.model.train_function = built.model.test_function = built.model.predict_function = None
    # The build may have changed what the recipes planned (XLA off where a layer cannot compile): its plan.
    return ApplyResult(
        model=built.model,
        dataset=built.dataset,
        strategy=built.strategy,
        plan=built.plan,
        baseline_plan=fitting,
        before=before,
        after=after,
        before_profile=before_profile,
        after_profile=after_profile,
        tuning=tuning,
        speedup_rounds=rounds,
        service=built.service,
    )


def _made_directory(logdir: str) -> None:
    """The traces' directory made before anything is built: a file in its place, or a write the storage
    refuses, fails now, not once every setup has been measured."""
    import os

    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise StorageError(
            f"logdir {logdir} is a file, not a directory: pass a directory (made if needed) for the traces."
        )
    try:
        os.makedirs(logdir, exist_ok=True)
    except OSError as error:
        refused = storage_error(error, os.path.join(logdir, "before"), "Nothing was built or measured.")
        if refused:
            raise refused from error
        raise


def _planned(
    baseline: Plan,
    recipe: Recipe | None,
    built_baseline: Built,
    tune_budget_seconds: float,
    on_tune_progress: Callable[[Any], None] | None,
) -> tuple[Plan, Any]:
    """The optimized plan, and the tuning that chose it where recipe is None ("auto": one step per candidate,
    kept or rejected and why). Timed trials (a batch-size search) run here, never in a recipe call."""
    tuning = None
    if recipe is None:
        from tfopt.auto import tune

        tuning = tune(baseline, budget_seconds=tune_budget_seconds, on_progress=on_tune_progress, built=built_baseline)
        optimized = tuning.plan
    else:
        recipe, optimized = recipe.measured_and_applied(baseline)
    for step in optimized.applied:
        _log.info("%s", step)
    return optimized, tuning


def _left_to_tfopt(recipe: Recipe | None) -> frozenset[str]:
    """The recipes whose choice was left to tfopt: a pipeline rewrite with its default settings (the default's,
    or `data_pipeline` named alone), `policy: auto`, `jit_compile: auto`, fused_layers' and steps_per_execution's
    "auto". They are kept only where they measure faster (`tfopt.verdict`). A setting the user chose is kept as
    asked; "auto" mode (recipe None) has decided by timing already."""
    from tfopt.recipes import DataPipeline, FusedLayers, MixedPrecision, StepsPerExecution, Xla

    items = getattr(recipe, "recipes", (recipe,)) if recipe is not None else ()
    items = [getattr(item, "requested", item) for item in items]  # as given, before a chain adapted them
    return frozenset(
        item.name
        for item in items
        if (isinstance(item, DataPipeline) and item == DataPipeline())
        or (isinstance(item, MixedPrecision) and item.policy == "auto")
        or (isinstance(item, Xla) and item.jit_compile == "auto")
        or (isinstance(item, (FusedLayers, StepsPerExecution)) and item.verified)
    )


def _measured_alone(sides: list[tuple[str, Built]], evidence: dict[str, Any]) -> Any:
    """A recipe's choices measured side by side (`tfopt.verdict.decided_alone`): the setups of (name, setup)."""
    return _measured_side_by_side([built for _, built in sides], **evidence)


def _measured_side_by_side(
    sides: list[Any], *, profile: bool, steps: int, warmup_steps: int, hardware: Hardware, logdir: str | None
) -> Any:
    """Measures the setups in alternating rounds, each under its own TF32 setting."""
    from tfopt.profiling.measurement import Side, measure_side_by_side

    _log.info("measuring %d setups side by side (%d warm-up + %d steps each)", len(sides), warmup_steps, steps)
    return measure_side_by_side(
        [
            Side(
                side.model,
                side.dataset,
                side.plan.batch_size,
                before_round=functools.partial(put_tf32_in_force, side.plan.tf32),
            )
            for side in sides
        ],
        steps=steps,
        warmup_steps=warmup_steps,
        hardware=hardware,
    )


def _profiled(
    built: Built,
    side: str,
    measurement: Measurement,
    *,
    profile: bool,
    steps: int,
    warmup_steps: int,
    hardware: Hardware,
    logdir: str | None,
) -> capture.Profile:
    """A TF Profiler capture of one side ("before" or "after"), analysed and diagnosed with its measurement."""
    put_tf32_in_force(built.plan.tf32)  # trials built since this model was may have switched TF32
    _log.info("profiling %s (%d warm-up + %d steps under the TF Profiler)", side, warmup_steps, steps)
    profiled = capture.profile(
        built.model,
        built.dataset,
        steps=steps,
        warmup_steps=warmup_steps,
        hardware=hardware,
        logdir=f"{logdir}/{side}" if logdir else None,
        measurement=measurement,
    )
    if built.plan.data_service is None:
        return profiled
    return dataclasses.replace(profiled, served_bytes_per_batch=built.plan.data_service.batch_bytes)


def _is_source(dataset: tf.data.Dataset | DataSource) -> bool:
    import tensorflow as tf

    return not isinstance(dataset, tf.data.Dataset) and callable(getattr(dataset, "pipeline", None))
