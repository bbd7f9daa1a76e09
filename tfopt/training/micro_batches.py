"""Out-of-memory recovery: a batch that does not fit the device trains as micro-batches with the same update.

A batch of b cut into k consecutive pieces, with the optimizer accumulating k micro-batches per update
(Keras' `gradient_accumulation_steps`, as `tfopt.recipes.grad_accum` sets it), gives the whole batch's update:
each piece's gradient is the mean over its b/k examples (the default mean loss reduction) and Keras
applies their average, the mean over b. The weights do not change between the pieces of a batch, so
their losses are the whole batch's loss split k ways, and the loss curve is plain training's. This is
what Composer's and Accelerate's recoveries do.

Where it is not plain training's: BatchNormalization computes its statistics per piece (and moves its
moving statistics k times per update); pieces of a batch that k does not divide (a short last batch)
weigh equally although they differ in size; a batch of fewer than k examples gives empty pieces. The
plan says so where the model has a BatchNormalization layer. A loss that sums (reduction "sum") or an
optimizer Keras cannot make again cannot be accumulated: the error says so instead.

The pieces are cut from the user's batches as their pipeline makes them, so an update always covers
exactly one of the user's batches, and the optimizer counts updates (`iterations`): learning-rate
schedules and Adam's bias correction see the steps plain training would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tfopt.errors import OutOfMemoryError, RecipeConfigError, describe_error

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfopt.plan import Plan

_log = logging.getLogger("tfopt")
_T = TypeVar("_T")
NAME = "micro_batches"


def out_of_memory(error: BaseException | None) -> BaseException | None:
    """The device's out-of-memory error in `error` or the errors it was raised from, else None.

    A GPU says so as `ResourceExhaustedError` ("OOM when allocating", XLA's "Out of memory while trying to
    allocate"), and some kernels as an `InternalError` whose output could not be allocated ("Dst tensor
    is not initialized", cuDNN's "failed to allocate").
    """
    import tensorflow as tf

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, tf.errors.ResourceExhaustedError):
            return error
        text = str(error).lower()
        if isinstance(error, tf.errors.InternalError) and (
            "dst tensor is not initialized" in text or "failed to allocate" in text or "out of memory" in text
        ):
            return error
        error = error.__cause__ or error.__context__
    return None


def fitted(plan: Plan, attempt: Callable[[Plan], _T], *, pieces: int = 1) -> tuple[Plan, _T]:
    """`attempt(plan)`, and where the device runs out of memory in it, `attempt` of the plan in more micro-batches
    (the fewest that divide its batch, at least twice as many), until one fits.

    Args:
        plan: The plan to try, its batches whole.
        attempt: Builds the plan and runs its first batch (closing what it started where it fails).
        pieces: The micro-batches to start from (a setup known not to fit in fewer: the user's).

    Returns:
        The plan that fitted, and what `attempt` returned for it.

    Raises:
        OutOfMemoryError: Even a micro-batch of one example does not fit, or micro-batches cannot give
            this model the whole batch's update.
    """
    if pieces > plan.micro_batches:
        plan = in_micro_batches(plan, pieces, "your setup ran out of memory on it")
    while True:
        try:
            return plan, attempt(plan)
        except Exception as error:
            exhausted = out_of_memory(error)
            if exhausted is None:
                raise
            whole = plan.whole_batch_size
            more = next((size for size in range(2 * plan.micro_batches, whole + 1) if whole % size == 0), None)
            if more is None:
                raise OutOfMemoryError(
                    f"The device runs out of memory on micro-batches of one example too "
                    f"({describe_error(exhausted)}): the model, its optimizer state or one example's activations "
                    "do not fit. Use a device with more memory, a smaller model, or mixed precision."
                ) from None
            plan = in_micro_batches(plan, more, exhausted)


def in_micro_batches(plan: Plan, pieces: int, why: BaseException | str) -> Plan:
    """The plan with each of the user's batches cut into `pieces` micro-batches whose gradients make one update.

    Args:
        plan: A plan whose batches are whole (`micro_batches` 1) or cut in fewer pieces.
        pieces: Micro-batches per batch of the user's pipeline: a divisor of the batch (so every full batch
            cuts into equal pieces, as XLA's static shapes need) and a multiple of `plan.micro_batches`.
        why: The out-of-memory error (or words) that made the whole batch fail, for the plan's step.

    Raises:
        OutOfMemoryError: Accumulating cannot give the whole batch's update.
    """
    import keras

    whole = plan.whole_batch_size
    reason = describe_error(why) if isinstance(why, BaseException) else why
    try:
        compile_config = accumulated(plan, pieces // plan.micro_batches, who=NAME)
    except RecipeConfigError as error:
        raise OutOfMemoryError(
            f"The batch of {whole} does not fit the device ({reason}), and tfopt cannot train it as micro-batches "
            f"with the same update: {error} Lower the batch size in your pipeline."
        ) from None
    batch_size = whole // pieces
    detail = (
        f"the batch of {whole} does not fit the device ({reason}): each batch trains as {pieces} micro-batches of "
        f"{batch_size} whose gradients make one update, the whole batch's (the optimizer accumulates "
        f"{compile_config['optimizer']['config']['gradient_accumulation_steps']})"
    )
    normalizing = _layers_of_class(plan, keras.layers.BatchNormalization)
    if normalizing:
        detail += f"; {normalizing} normalize(s) each micro-batch by its own statistics, not the whole batch's"
    _log.warning("%s: %s", NAME, detail)
    steps = tuple(step for step in plan.applied if step.recipe != NAME)
    return plan.replace(
        sample_inputs=_first_piece(plan.sample_inputs, batch_size),
        batch_size=batch_size,
        micro_batches=pieces,
        compile_config=compile_config,
        applied=steps,
    ).record(NAME, detail)


def split_batches(dataset: tf.data.Dataset, pieces: int) -> tf.data.Dataset:
    """Each batch of `dataset` as `pieces` consecutive batches (sizes differing by at most one example); the
    dataset itself where `pieces` is 1.

    Example:
        >>> import tensorflow as tf
        >>> data = tf.data.Dataset.range(10).batch(4)
        >>> [batch.numpy().tolist() for batch in split_batches(data, 2)]
        [[0, 1], [2, 3], [4, 5], [6, 7], [8], [9]]
    """
    import tensorflow as tf

    if pieces == 1:
        return dataset

    def cut(*element: Any) -> tf.data.Dataset:
        element = element[0] if len(element) == 1 else element
        tensors = tf.nest.flatten(element)
        size = tensors[0].shape[0]
        if size is not None and size % pieces == 0:  # static pieces, as XLA compiles one shape
            return tf.data.Dataset.from_tensor_slices(
                tf.nest.map_structure(lambda t: tf.reshape(t, [pieces, size // pieces, *t.shape[1:]]), element)
            )
        size = tf.shape(tensors[0], out_type=tf.int64)[0]
        bounds = tf.range(pieces + 1, dtype=tf.int64) * size // pieces
        return tf.data.Dataset.range(pieces).map(
            lambda index: tf.nest.map_structure(lambda t: t[bounds[index] : bounds[index + 1]], element)
        )

    split = dataset.flat_map(cut)
    cardinality = int(dataset.cardinality())
    if cardinality >= 0:
        split = split.apply(tf.data.experimental.assert_cardinality(cardinality * pieces))
    elif cardinality == int(tf.data.INFINITE_CARDINALITY):
        split = split.repeat()  # infinite already; says so to Keras and to `tfopt.training.train`
    return split.prefetch(tf.data.AUTOTUNE)


def _first_piece(inputs: Any, size: int) -> Any:
    import tensorflow as tf

    return tf.nest.map_structure(lambda tensor: tensor[:size], inputs)


def _layers_of_class(plan: Plan, kind: type, *, trained_only: bool = False) -> str:
    """The plan's model's layers of class `kind` (with `trained_only`, those that train), the first three named,
    or "" for none (and for a model only `model_fn` makes: unknown)."""
    model = plan.model_to_read
    if model is None:
        return ""
    layers = [
        layer.name
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, kind) and (layer.trainable or not trained_only)
    ]
    if not layers:
        return ""
    shown = ", ".join(repr(name) for name in layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
    return f"{kind.__name__} {shown}"


def _constraints_broken(plan: Plan) -> str:
    """The first trained variable of the plan's model that its constraint would change, with the constraint's
    class, or "" (also for a model only `model_fn` makes: unknown)."""
    import numpy as np

    model = plan.model_to_read
    for variable in model.trainable_variables if model is not None else ():
        constraint = getattr(variable, "constraint", None)
        if constraint is None:
            continue
        # Within rounding: a norm constraint (MaxNorm, UnitNorm) rescales weights that keep it by 1 +- 1e-7.
        if not np.allclose(np.asarray(constraint(variable.value)), variable.numpy(), rtol=1e-5, atol=1e-6):
            return f"{variable.path}: {type(constraint).__name__}"
    return ""


def accumulated_already(plan: Plan, *, who: str) -> int:
    """The micro-batches the plan's optimizer accumulates per update already: the user's own
    `gradient_accumulation_steps` times tfopt's split of a batch that did not fit (1 for neither)."""
    return (
        _optimizer_config(plan.compile_config.get("optimizer"), who)["config"].get("gradient_accumulation_steps") or 1
    )


def accumulated(plan: Plan, factor: int, *, who: str) -> dict[str, Any]:
    """The plan's compile config with its optimizer accumulating `factor` times as many micro-batches per update
    as it did (an optimizer the user set to accumulate keeps doing so: the steps multiply).

    Raises:
        RecipeConfigError: Accumulating would not give the large batch's update (the loss sums, the learning
            rate is a schedule, the optimizer keeps a moving average or applies or clips an Embedding's slices
            one by one, the weights break their constraint), or the optimizer cannot be made again with the
            setting; the message starts with `who`.
    """
    import keras

    compile_config = plan.compile_config
    reductions = _loss_reductions(compile_config.get("loss"))
    summed = sorted(repr(reduction) for reduction in reductions & {"sum", "none", None})
    if summed:
        raise RecipeConfigError(
            f"{who}: the loss uses reduction={' and '.join(summed)}, so its gradient is the sum over the batch's "
            "examples (a loss without reduction gives one per example, which Keras sums). Keras averages the "
            "accumulated gradients, so each update would be 1/N of the large batch's. Use the default reduction "
            "('sum_over_batch_size'), or scale the learning rate by N yourself and drop this recipe."
        )
    if "mean_with_sample_weight" in reductions:
        raise RecipeConfigError(
            f"{who}: the loss uses reduction='mean_with_sample_weight', which divides each micro-batch's loss by "
            "the sum of its own weights (sample or class weights): averaged over micro-batches of other weights, "
            "that is not the large batch's weighted mean. Use the default reduction ('sum_over_batch_size'), or "
            "leave accumulation out."
        )
    optimizer = _optimizer_config(compile_config.get("optimizer"), who)
    schedule = optimizer["config"].get("learning_rate")
    if isinstance(schedule, dict) and "class_name" in schedule:
        raise RecipeConfigError(
            f"{who}: the learning rate is a schedule ({schedule['class_name']}), and Keras calls it with the "
            "micro-batches counted, not the updates (BaseOptimizer._get_current_learning_rate reads _iterations), "
            "so it would run N times faster than for the large batch. Give the schedule the updates' step numbers "
            "yourself, or leave accumulation out."
        )
    if optimizer["config"].get("use_ema"):
        raise RecipeConfigError(
            f"{who}: the optimizer keeps a moving average of the weights (use_ema=True), which Keras moves at every "
            "micro-batch, not at every update (BaseOptimizer.apply), and fit ends by writing it into the weights: "
            "they would not be the large batch's. Leave accumulation out, or the moving average."
        )
    gathered = _layers_of_class(plan, keras.layers.Embedding, trained_only=True)  # rows read: sparse gradients
    clipping = ", ".join(
        f"{name}={optimizer['config'][name]:g}"
        for name in ("clipnorm", "global_clipnorm", "clipvalue")
        if optimizer["config"].get(name) is not None
    )
    if gathered and (optimizer.get("class_name") != "SGD" or clipping):
        how = (
            f"{optimizer.get('class_name')} applies slice by slice: an id looked up several times in a batch has "
            "each of its slices squared into the moments before they add up"
            if optimizer.get("class_name") != "SGD"
            else f"the optimizer's clipping ({clipping}) measures slice by slice, before an id's slices add up"
        )
        raise RecipeConfigError(
            f"{who}: {gathered} get(s) sparse gradients, a slice per id a batch looks up, which {how}. Accumulated, "
            "the gradient is dense, each id's slices summed first, so the update would not be the large batch's. "
            "Use SGD without clipping, or leave accumulation out."
        )
    broken = _constraints_broken(plan)
    if broken:
        raise RecipeConfigError(
            f"{who}: the weights as they are break their own constraint ({broken}). Keras applies constraints "
            "after every micro-batch, accumulating or not, so the first update's later micro-batches would be "
            "computed at the constrained weights, where the large batch's are computed at yours. Apply the "
            "constraint to the weights first (variable.assign(constraint(variable))), or leave accumulation out."
        )
    steps = (optimizer["config"].get("gradient_accumulation_steps") or 1) * factor
    optimizer["config"] = {**optimizer["config"], "gradient_accumulation_steps": steps}
    return {**compile_config, "optimizer": optimizer}


def _optimizer_config(optimizer: keras.optimizers.Optimizer, who: str) -> dict[str, Any]:
    """The serialized optimizer as a mutable dict, whatever form the compile config holds it in."""
    import keras

    from tfopt.plan import Unserializable

    if isinstance(optimizer, str):
        optimizer = keras.saving.serialize_keras_object(keras.optimizers.get(optimizer))
    if isinstance(optimizer, Unserializable):
        raise RecipeConfigError(
            f"{who}: cannot set gradient_accumulation_steps on optimizer {optimizer.kind!r}: Keras cannot "
            f"serialize it ({optimizer.why}), so tfopt cannot make it again with the setting. Give its learning-"
            "rate schedule (or the optimizer) a get_config(), or accumulate gradients in your own train_step."
        )
    if not isinstance(optimizer, dict) or "config" not in optimizer:
        raise RecipeConfigError(
            f"{who}: cannot read the optimizer from the compile config ({optimizer!r}). "
            "Compile the model with a Keras 3 optimizer."
        )
    if optimizer.get("class_name") == "LossScaleOptimizer":
        raise RecipeConfigError(
            f"{who}: the model is compiled with a LossScaleOptimizer, which does not take "
            "gradient_accumulation_steps. Compile with the plain optimizer and use the mixed_precision recipe: "
            "build() wraps it, and the inner optimizer accumulates."
        )
    return {**optimizer, "config": dict(optimizer["config"])}


def _loss_reductions(loss: Any) -> set[str]:
    """The reductions of a serialized loss, or of every output's loss in a dict or list of them."""
    if isinstance(loss, dict) and "class_name" in loss:
        config = loss.get("config") or {}
        return {config["reduction"]} if "reduction" in config else set()
    if isinstance(loss, dict):
        loss = list(loss.values())
    if isinstance(loss, (list, tuple)):
        return set().union(*(_loss_reductions(item) for item in loss))
    return set()
