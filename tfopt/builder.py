"""The one place that turns a Plan into a model, a dataset and a strategy.

Order matters and is fixed here: the strategy is made first, then inside its scope and the dtype-policy
scope the model is created once, the user's weights are copied in, and the model is compiled once (a
fresh optimizer inside the scope, XLA as the plan says). Global Keras state (the dtype policy) is only
changed inside a scope that restores it, even when building fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from tfopt.errors import IncompatibleModelError
from tfopt.plan import Plan


@dataclasses.dataclass(frozen=True)
class Built:
    """A model ready to train, with the data and strategy it was built for.

    Attributes:
        model: The compiled Keras model.
        dataset: The tf.data pipeline to pass to `model.fit`.
        strategy: The tf.distribute strategy the model's variables live under.
        plan: The plan it was built from.
    """

    model: Any
    dataset: Any
    strategy: Any
    plan: Plan


def build(plan: Plan) -> Built:
    """Builds and compiles the model a plan describes.

    Args:
        plan: The plan to build.

    Returns:
        The built model, dataset and strategy.

    Raises:
        IncompatibleModelError: The model could not be created, or the user's weights do not fit it.

    Example:
        >>> import keras, tensorflow as tf
        >>> from tfopt.hardware import Hardware
        >>> from tfopt.plan import make_plan
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> data = tf.data.Dataset.from_tensor_slices((tf.zeros((8, 4)), tf.zeros((8, 2)))).batch(4)
        >>> built = build(make_plan(model, data, hardware=Hardware()))
        >>> built.model is model
        False
    """
    import keras

    from tfopt.distribute.strategy import make_strategy

    import tensorflow as tf

    strategy = make_strategy(plan.strategy, **plan.strategy_options)
    if bool(tf.config.experimental.tensor_float_32_execution_enabled()) != plan.tf32:
        # A process setting, not a scope: matmul kernels read it when they run, so it must stay in force
        # while the model trains.
        tf.config.experimental.enable_tensor_float_32_execution(plan.tf32)
    with dtype_policy_scope(plan.dtype_policy), strategy.scope():
        model = _create_model(plan)
        if plan.weights_from is not None:
            _copy_weights(plan.weights_from, model)
        model.compile(**_compile_arguments(plan))
        if plan.dtype_policy == "mixed_float16" and not isinstance(
                model.optimizer, keras.optimizers.LossScaleOptimizer):
            # Keras wraps the optimizer only when the *model's* policy is mixed_float16; a model_fn that
            # pins its own dtype escapes that, and fp16 gradients then underflow. Wrap it ourselves.
            model.compile(**{**_compile_arguments(plan),
                             "optimizer": keras.optimizers.LossScaleOptimizer(model.optimizer)})
    return Built(model=model, dataset=plan.dataset, strategy=strategy, plan=plan)


@contextlib.contextmanager
def dtype_policy_scope(policy: str) -> Iterator[None]:
    """Sets Keras' global dtype policy for the block and restores the previous one afterwards.

    Example:
        >>> import keras
        >>> with dtype_policy_scope("mixed_bfloat16"):
        ...     keras.layers.Dense(2).compute_dtype
        'bfloat16'
        >>> keras.config.dtype_policy().name
        'float32'
    """
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def clone_under_current_policy(model: Any) -> Any:
    """Clones a Functional or Sequential model so its layers take the current global dtype policy.

    A layer's config records the policy it was made with, so a plain `clone_model` keeps it even inside
    another policy's scope. Layers on the policy the model was built under (its default: float32, or the
    mixed policy that was global when the user built it) get the current policy; layers the user pinned to
    another dtype (e.g. int lookups) keep theirs; the layers producing the model's outputs compute in
    float32, so softmax and the loss do not lose precision. Operations that are not layers (`keras.ops`
    calls, `x + y`) are recreated as they are. The clone has fresh weights: `build()` copies the user's in.
    """
    import keras

    policy = keras.config.dtype_policy().name
    defaults = {"float32", model_dtype_policy(model)}
    if model.built:
        output_layers = {id(tensor._keras_history.operation) for tensor in model.outputs}
    else:  # a Sequential model without an Input: its last layer makes the output
        output_layers = {id(model.layers[-1])}

    def clone_layer(layer: Any) -> Any:
        config = layer.get_config()
        if isinstance(layer, keras.layers.Layer) and not isinstance(layer, keras.layers.InputLayer) \
                and layer.dtype_policy.name in defaults:
            config["dtype"] = "float32" if id(layer) in output_layers else policy
        return layer.__class__.from_config(config)

    return keras.models.clone_model(model, clone_function=clone_layer, recursive=True)


def model_dtype_policy(model: Any) -> str:
    """The dtype policy a model was built under: "float32", or a mixed policy set globally at the time."""
    name = model.dtype_policy.name
    return name if name in ("mixed_float16", "mixed_bfloat16") else "float32"


def _create_model(plan: Plan) -> Any:
    import keras

    try:
        model = plan.model_fn()
    except Exception as error:
        raise IncompatibleModelError(f"model_fn raised {type(error).__name__}: {error}") from error
    if not isinstance(model, keras.Model):
        raise IncompatibleModelError(
            f"model_fn must return a keras.Model; it returned {type(model).__name__}.")
    if not model.built:
        model(plan.sample_inputs)  # subclassed models create their variables on the first call
    return _with_float32_outputs(model, plan)


def _with_float32_outputs(model: Any, plan: Plan) -> Any:
    """Adds a float32 cast after a model_fn model whose outputs are 16-bit (the loss must be float32)."""
    import keras
    import tensorflow as tf

    # Functional and Sequential models know their output dtypes symbolically; others need one forward pass.
    outputs = getattr(model, "outputs", None) or tf.nest.flatten(model(plan.sample_inputs, training=False))
    if all(output.dtype == "float32" for output in outputs):
        return model
    inputs = tf.nest.map_structure(
        lambda tensor: keras.Input(shape=tensor.shape[1:], dtype=tensor.dtype), plan.sample_inputs)
    cast = keras.layers.Activation("linear", dtype="float32", name="float32_outputs")
    wrapped = keras.Model(inputs, tf.nest.map_structure(cast, model(inputs)), name=model.name)
    return wrapped


def _copy_weights(source: Any, target: Any) -> None:
    weights = source.get_weights()
    try:
        target.set_weights(weights)
    except ValueError as error:
        raise IncompatibleModelError(
            f"The model built by model_fn does not match the model you passed, so its weights cannot be "
            f"copied ({error}). Make model_fn create the same architecture, or pass model=None to start "
            "from model_fn's own initial weights.") from error


def _compile_arguments(plan: Plan) -> dict[str, Any]:
    """Deserializes the compile config afresh, so every build gets its own optimizer and metrics."""
    import keras

    try:
        return keras.saving.deserialize_keras_object(dict(plan.compile_config))
    except (TypeError, ValueError) as error:
        raise IncompatibleModelError(
            f"The model's compile arguments could not be recreated ({error}). Custom optimizers, losses "
            "and metrics must be registered with @keras.saving.register_keras_serializable(), or pass "
            "compile=dict(...) built from standard Keras objects.") from error
