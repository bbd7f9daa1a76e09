"""The Plan: what `build()` must do, decided before anything is built.

Two recipes cannot be applied to a model that already exists: Keras layers read their dtype policy when
they are created (mixed precision) and variables must be created inside `strategy.scope()`
(distribution). So recipes never rebuild anything; each returns a new immutable Plan and `build(plan)`
builds once. `make_plan` turns the user's model and dataset into the first Plan and rejects bad input
with a message that says how to fix it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tfopt.errors import DataError, IncompatibleModelError, TfoptError, describe_error, released
from tfopt.hardware import Hardware
from tfopt.model_copy import copy_model
from tfopt.policies import model_dtype_policy, users_tf32_setting

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfopt.data.source import DataSource


# Compile settings Keras reads from the compiled model's attributes when it makes the train function: the build
# sets them on the model, and compiling again is never needed for them.
SET_ON_THE_MODEL = ("jit_compile", "steps_per_execution")


@dataclasses.dataclass(frozen=True)
class Step:
    """What one recipe did to a plan, or why it did nothing.

    Attributes:
        recipe: The recipe's registered name.
        detail: One sentence: what changed and why, or why it was skipped.
        skipped: True where the recipe left the plan as it was.
    """

    recipe: str
    detail: str
    skipped: bool = False

    def __str__(self) -> str:
        return f"{self.recipe}: {'skipped: ' if self.skipped else ''}{self.detail}"


@dataclasses.dataclass(frozen=True, repr=False)
class Plan:
    """An immutable description of the model, data and settings that `build()` turns into a training setup.

    Attributes:
        model_fn: Creates a fresh, uncompiled model. `build()` calls it inside the dtype-policy and
            strategy scopes, so it must create its variables when called: the user's function, or an
            in-process copy of the user's model (`tfopt.model_copy.copy_model`).
        dataset: The batched training pipeline, yielding what Keras' `fit` takes: inputs alone, (inputs,
            targets) or (inputs, targets, weights), each a tensor or a structure of them.
        compile_config: Keras compile arguments in `model.get_compile_config()` form: the settings recipes
            read and change (the optimizer's learning rate, `jit_compile`).
        hardware: The machine the plan is for.
        sample_inputs: One batch of model inputs, used to build subclassed models and check XLA.
        batch_size: Examples per step (the global batch under a distribution strategy).
        micro_batches: How many steps of `batch_size` each batch of the user's pipeline is cut into, their
            gradients accumulated into one update, because the whole batch did not fit the device
            (`tfopt.training.micro_batches`); 1 where it fits.
        weights_from: A built model whose weights the new model starts from, or None. Never modified.
        compile_objects: The compile arguments as the user gave them (loss functions, metric and optimizer
            objects): what `build()` compiles with where the plan left a setting as it was, so custom
            losses and metrics are the user's own and not looked up again by name.
        source: The `tfopt.data` source the dataset came from, when tfopt knows it, else None.
        keeps_users_compile: A model built compiled (a copy of the user's compiled model, or a model_fn's that
            compiles) keeps what its compile made (optimizers with their state, loss and metric objects,
            whatever an overridden `compile` set): the build changes only what recipes changed. False where
            `compile=` was given: the build compiles with `compile_objects`.
        dtype_policy: The Keras dtype policy name the model is built under.
        strategy: The tf.distribute strategy name that `tfopt.distribute.make_strategy` understands.
        strategy_options: Keyword arguments for that strategy.
        tf32: Whether float32 matmuls and convolutions may run in TF32 where the GPU has it (TensorFlow's
            process setting `enable_tensor_float_32_execution`, which `build()` applies).
        data_service: How `build()` offloads the pipeline to tf.data service workers (a
            `tfopt.data.service.Offload`), or None to run it in this process.
        layer_rewrites: The rewrites `build()` makes on the model's layers (`tfopt.rewrites.REWRITES`: e.g.
            "batch_norm", BatchNormalization through the fused kernel).
        float32_layers: Names of layers `build()` keeps in float32 under a mixed policy because they failed in
            16 bits on the first batch (`tfopt.fidelity.first_batch_checked`), so a setup built again from the
            plan keeps them so too.
        outputs_in_16_bits: Whether `build()` leaves the layers producing the outputs on a mixed policy, as
            Keras' own mixed policy does, instead of float32: where the model's own code mixes their results
            with 16-bit ones and fails with them in float32 (`tfopt.fidelity.first_batch_checked`).
        applied: What every recipe did, in order.

    Example:
        >>> import keras, tensorflow as tf
        >>> from tfopt.hardware import Hardware
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> data = tf.data.Dataset.from_tensor_slices((tf.zeros((8, 4)), tf.zeros((8, 2)))).batch(4)
        >>> plan = make_plan(model, data, hardware=Hardware())
        >>> plan.batch_size, plan.dtype_policy, plan.jit_compile
        (4, 'float32', False)
        >>> bf16 = plan.replace(dtype_policy="mixed_bfloat16").record("mine", "why it changed")
        >>> str(bf16.applied[-1]), plan.applied
        ('mine: why it changed', ())
    """

    model_fn: Callable[[], Any]
    dataset: tf.data.Dataset
    compile_config: Mapping[str, Any]
    hardware: Hardware
    sample_inputs: Any
    batch_size: int
    micro_batches: int = 1
    weights_from: Any = None
    compile_objects: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    source: DataSource | None = None
    keeps_users_compile: bool = False
    dtype_policy: str = "float32"
    strategy: str = "default"
    strategy_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tf32: bool = True
    data_service: Any = None
    layer_rewrites: tuple[str, ...] = ()
    float32_layers: tuple[str, ...] = ()
    outputs_in_16_bits: bool = False
    applied: tuple[Step, ...] = ()

    def __post_init__(self) -> None:
        # Mappings are frozen too, so a recipe cannot change a plan it was handed.
        object.__setattr__(self, "compile_config", types.MappingProxyType(dict(self.compile_config)))
        object.__setattr__(self, "strategy_options", types.MappingProxyType(dict(self.strategy_options)))
        object.__setattr__(self, "compile_objects", types.MappingProxyType(dict(self.compile_objects)))

    @property
    def whole_batch_size(self) -> int:
        """Examples in each batch of the user's pipeline: one update's, whatever micro-batches it trains as."""
        return self.batch_size * self.micro_batches

    @property
    def copies_users_model(self) -> bool:
        """Whether the plan's model is an in-process copy of the user's (its `model_fn.args[0]`), not model_fn's."""
        return isinstance(self.model_fn, functools.partial) and self.model_fn.func is copy_model

    @property
    def model_to_read(self) -> Any:
        """A model with the plan's layers, to read and never to train: the user's model the plan copies, or the
        one its weights come from; None where only `model_fn` can make it."""
        return self.model_fn.args[0] if self.copies_users_model else self.weights_from

    @property
    def jit_compile(self) -> bool:
        """Whether the model is compiled with XLA."""
        return bool(self.compile_config.get("jit_compile", False))

    @property
    def steps_per_call(self) -> int:
        """The training steps one call of the train function runs (Keras' `steps_per_execution`)."""
        return int(self.compile_config.get("steps_per_execution") or 1)

    def __repr__(self) -> str:
        # Not the dataclass repr: that prints the sample batch (a whole tensor), the dataset and the model.
        # The decisions are what a reader wants.
        steps = "".join(f"\n  {step}" for step in self.applied)
        return (
            f"Plan(batch_size={self.batch_size}"
            + (f" ({self.micro_batches} micro-batches per update)" if self.micro_batches > 1 else "")
            + f", dtype_policy={self.dtype_policy!r}, "
            f"jit_compile={self.jit_compile}, strategy={self.strategy!r}, "
            f"hardware={self.hardware.describe()!r}, applied={len(self.applied)} steps){steps}"
        )

    def replace(self, **changes: Any) -> Plan:
        """Returns a copy with `changes` applied (a thin `dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)

    def with_compile(self, **changes: Any) -> Plan:
        """Returns a copy whose compile arguments are updated with `changes`."""
        return self.replace(compile_config={**self.compile_config, **changes})

    def record(self, recipe: str, detail: str, *, skipped: bool = False) -> Plan:
        """Returns a copy with one more `Step` in `applied`."""
        return self.replace(applied=(*self.applied, Step(recipe, detail, skipped)))

    def amend(self, recipe: str, detail: str) -> Plan:
        """Returns a copy whose last applied step of `recipe` says `detail` too; a new step where it has none.
        A step that says it already is left as it is: a setup built again from a built plan (mixed precision
        left out) makes the same amendments again."""
        for index in range(len(self.applied) - 1, -1, -1):
            step = self.applied[index]
            if step.recipe == recipe and not step.skipped:
                if f"; {detail};" in f"; {step.detail};":
                    return self
                amended = dataclasses.replace(step, detail=f"{step.detail}; {detail}")
                return self.replace(applied=(*self.applied[:index], amended, *self.applied[index + 1 :]))
        return self.record(recipe, detail)

    def left_out(self, recipe: str, detail: str) -> Plan:
        """Returns a copy whose steps of `recipe` are one skipped step saying `detail`, in the first one's place."""
        steps = self.applied
        first = next((index for index, step in enumerate(steps) if step.recipe == recipe), len(steps))
        rest = (step for step in steps[first:] if step.recipe != recipe)
        return self.replace(applied=(*steps[:first], Step(recipe, detail, skipped=True), *rest))


def make_plan(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    hardware: Hardware,
    model_fn: Callable[[], Any] | None = None,
    compile: Mapping[str, Any] | None = None,
    source: DataSource | None = None,
) -> Plan:
    """Turns the user's model and dataset into the first Plan, the honest baseline.

    The baseline compiles with `jit_compile=False` explicitly where the user left Keras' default "auto", which
    decides by itself: the "before" measurement must not silently include XLA. A `jit_compile=True` or `False`
    the user's compile chose is the baseline's (`users_jit_compile`).

    The baseline's float32 math is the user's TF32 setting (`users_tf32_setting`): TensorFlow's own switch,
    unless an earlier build changed it for its model, as an earlier `apply` with `mixed_precision: {tf32:
    false}` in the same notebook does.

    Args:
        model: A Keras model of any kind (copied in process with its weights and state, see
            `tfopt.model_copy`), or None when `model_fn` is given.
        dataset: A batched `tf.data.Dataset` yielding what Keras' `fit` takes.
        hardware: The machine to plan for.
        model_fn: Creates the model afresh instead of a copy of `model`, whose weights it then starts from.
        compile: Keras compile arguments; defaults to those the model was compiled with.
        source: The `tfopt.data` source the dataset came from, if any.

    Returns:
        The baseline Plan.

    Raises:
        IncompatibleModelError: `model` is not a Keras model, or cannot be rebuilt as given.
        DataError: `dataset` is not a tf.data.Dataset, or is empty.
    """
    import keras
    import tensorflow as tf

    if model is None and model_fn is None:
        raise IncompatibleModelError(
            "Received model=None and no model_fn: pass a Keras model, or a model_fn that creates one."
        )
    if model is not None and not isinstance(model, keras.Model):
        raise IncompatibleModelError(
            f"Expected a keras.Model, received {type(model).__module__}.{type(model).__name__}. "
            "tfopt works on Keras 3 models: build your model with `keras` (not `tf.keras` from "
            "Keras 2 or another framework) and pass it, or pass model_fn=a function that creates it."
        )
    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(
            f"Expected a tf.data.Dataset, received {type(dataset).__module__}.{type(dataset).__name__}. "
            "Wrap arrays with tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size), or pass a "
            "tfopt.data source."
        )
    # Without a model, what model_fn compiles is the user's compile (and precision): one model made to read it.
    described = model if model is not None or compile is not None else _made_by(model_fn)
    if model is None and compile is None and not described.compiled:
        raise IncompatibleModelError(
            "model=None and model_fn's model is not compiled, so tfopt does not know the optimizer and loss to train "
            "with: compile it in model_fn, or pass compile=dict(optimizer=..., loss=...) to tfopt.apply."
        )
    compile_objects = {
        **_compile_objects(described, compile),
        "jit_compile": chosen_jit_compile(described, compile),
    }
    sample_inputs = first_inputs(dataset)
    tf32 = users_tf32_setting()
    strategy, strategy_options, placed = _users_strategy(model)
    return Plan(
        model_fn=functools.partial(copy_model, model) if model_fn is None else model_fn,
        dataset=dataset,
        # The steps per call the model runs, set by compile or on the model itself (as tfopt sets it).
        compile_config={
            **_serialized(compile_objects),
            "jit_compile": bool(users_jit_compile(compile_objects)),
            **_steps_per_call(described, compile),
        },
        compile_objects=compile_objects,
        hardware=hardware,
        sample_inputs=sample_inputs,
        batch_size=batch_size_of(sample_inputs),
        weights_from=model if model_fn is not None and model is not None and model.weights else None,
        source=source,
        keeps_users_compile=compile is None,
        # A model built under a mixed policy keeps it in the baseline (and fp16 keeps its loss scaling).
        dtype_policy=model_dtype_policy(described) if described is not None else "float32",  # None: model_fn's own
        tf32=tf32,
        strategy=strategy,
        strategy_options=strategy_options,
        # A "float32" baseline on an Ampere+ GPU is not IEEE float32: say so, or its numbers mislead.
        applied=tuple(
            Step("baseline", note)
            for note in (placed, tf32_note(hardware) if tf32 and hardware.has_tf32 else None)
            if note is not None
        ),
    )


def _users_strategy(model: keras.Model | None) -> tuple[str, dict[str, Any], str | None]:
    """The strategy the user's model was made under, which the baseline (and what recipes leave as it is) trains
    under: `MirroredStrategy` over its devices, or `OneDeviceStrategy` on its device, with what the plan says of
    it. Another strategy (multi-worker, TPU) joins a cluster: the distribution recipe's to set."""
    import tensorflow as tf

    strategy = model.distribute_strategy if model is not None else None
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        from tfopt.distribute.strategy import adopt_mirrored

        devices = adopt_mirrored(strategy)
        over = f"{len(devices)} device{'s' if len(devices) > 1 else ''}"
        return "mirrored", {"devices": devices}, f"MirroredStrategy over {over}, as your model was made"
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        (device,) = strategy.extended.worker_devices
        return "one_device", {"device": device}, f"OneDeviceStrategy on {device}, as your model was made"
    return "default", {}, None


def users_jit_compile(compile_objects: Mapping[str, Any]) -> bool | None:
    """The `jit_compile` the user chose, or None where they left Keras' "auto" (`_chosen_jit_compile`)."""
    chosen = compile_objects.get("jit_compile")
    return chosen if isinstance(chosen, bool) else None


def chosen_jit_compile(model: keras.Model | None, compile_kwargs: Mapping[str, Any] | None) -> bool | str:
    """The user's `jit_compile`: as given in `compile=`, else the model's where it is not what Keras' "auto" makes
    of it on this machine (Keras keeps only the result, so a choice equal to it reads as "auto": on a CPU,
    `jit_compile=False`)."""
    if compile_kwargs is not None or model is None:
        return (compile_kwargs or {}).get("jit_compile", "auto")
    if model.run_eagerly:  # Keras turns XLA off then, whatever was asked
        return "auto"
    own = bool(model.jit_compile)
    return own if own != bool(model._resolve_auto_jit_compile()) else "auto"


def tf32_note(hardware: Hardware) -> str:
    """What float32 means on a GPU with TF32, for the plan and the report."""
    major, minor = hardware.min_compute_capability
    return (
        f"float32 baseline: TF32 on this GPU (compute capability {major}.{minor} >= 8.0: TensorFlow runs "
        "float32 matmuls and convolutions with a 10-bit mantissa); mixed_precision tf32: false gives IEEE "
        "float32"
    )


def _made_by(model_fn: Callable[[], Any]) -> keras.Model:
    """A model of model_fn's, made to read what it compiles (one call more than the builds make)."""
    import keras

    try:
        made = model_fn()
    except TfoptError:
        raise
    except Exception as error:
        raise IncompatibleModelError(f"model_fn raised {describe_error(error)}") from error
    if not isinstance(made, keras.Model):
        raise IncompatibleModelError(f"model_fn must return a keras.Model; it returned {type(made).__name__}.")
    return made


def _compile_objects(model: keras.Model, compile_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The compile arguments as given: `compile=` or those the model was compiled with (Keras keeps them)."""
    if compile_kwargs is not None:
        if "optimizer" not in compile_kwargs:
            raise IncompatibleModelError(
                f"compile= needs at least 'optimizer' (and 'loss' unless the model computes its own); received "
                f"keys {sorted(compile_kwargs)}."
            )
        return dict(compile_kwargs)
    given = getattr(model, "_compile_config", None) if model is not None and model.compiled else None
    if given is None:
        raise IncompatibleModelError(
            "The model is not compiled, so tfopt does not know the optimizer and loss to train with. "
            "Call model.compile(optimizer=..., loss=...) first, or pass compile=dict(optimizer=..., "
            "loss=..., metrics=...) to tfopt.apply."
        )
    return dict(given.config)


def _steps_per_call(model: keras.Model | None, compile_kwargs: Mapping[str, Any] | None) -> dict[str, int]:
    """The model's own steps per call where its compile is kept: Keras reads the attribute, which may differ
    from what its compile was given."""
    if compile_kwargs is not None or model is None:
        return {}
    return {"steps_per_execution": int(model.steps_per_execution)}


def _serialized(compile_objects: Mapping[str, Any]) -> dict[str, Any]:
    return {key: serialized_setting(value) for key, value in compile_objects.items()}


@dataclasses.dataclass(frozen=True)
class Unserializable:
    """A compile setting Keras cannot serialize (an optimizer holding a schedule of the user's without
    `get_config`): the build keeps the user's own object, and a recipe that would change it says it cannot.

    Attributes:
        kind: The setting's class name.
        why: The error serializing it raised.
    """

    kind: str
    why: str

    def __repr__(self) -> str:
        return f"<{self.kind}: not serializable ({self.why})>"


def serialized_setting(value: Any) -> Any:
    """A compile setting in `model.get_compile_config()` form, or `Unserializable` where Keras cannot say it.

    Example:
        >>> import keras
        >>> serialized_setting("adam"), serialized_setting(keras.losses.MeanSquaredError())["class_name"]
        ('adam', 'MeanSquaredError')
    """
    import warnings

    import keras

    try:
        with warnings.catch_warnings():  # Keras warns of a lambda it serializes: tfopt saves nothing, it compares
            warnings.simplefilter("ignore", UserWarning)
            return keras.saving.serialize_keras_object(value)
    except (NotImplementedError, TypeError, ValueError) as error:
        return Unserializable(type(value).__name__, f"{type(error).__name__}: {error}")


def first_inputs(dataset: tf.data.Dataset) -> Any:
    """The model inputs of the first element, as `fit` unpacks it: proves the dataset is not empty and
    gives a batch to build and check with. Keras takes inputs alone, (inputs,), (inputs, targets) and
    (inputs, targets, sample_weights); inputs may be a tensor, a list or a dict."""
    import keras
    import tensorflow as tf

    from tfopt.data.read_copy import copy_to_read

    try:
        element = next(iter(copy_to_read(dataset).take(1)))
    except StopIteration:
        raise DataError(
            "The dataset is empty: it yielded no batch. Check the files or arrays it reads "
            "(and that .batch(..., drop_remainder=True) leaves at least one batch)."
        ) from None
    except tf.errors.OpError as error:
        raise DataError(f"Reading the first batch of the dataset failed: {describe_error(error)}") from released(error)
    if isinstance(element, tuple) and len(element) > 3:
        raise DataError(
            f"A dataset element is a tuple of {len(element)}; Keras' fit() takes inputs, (inputs, targets) or "
            "(inputs, targets, sample_weights). Put several inputs in one list or dict: "
            "dataset.map(lambda a, b, c, y: ((a, b, c), y))."
        )
    return keras.utils.unpack_x_y_sample_weight(element)[0]


def batch_size_of(inputs: Any) -> int:
    """The number of examples in a batch of model inputs (the first dimension of the first input)."""
    import tensorflow as tf

    first = tf.nest.flatten(inputs)[0]
    if first.shape.rank == 0:
        raise DataError("The dataset's inputs are scalars: batch the dataset with dataset.batch(batch_size).")
    return int(first.shape[0])
