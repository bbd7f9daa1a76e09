"""Before anything is timed: the optimized model runs one real batch and computes what the user's model does.

Mixed precision changes how a model computes, and public Keras code does things a 16-bit policy breaks:
custom layers that multiply a float32 `keras.random.normal(...)` with their 16-bit inputs (an error at the
first real batch), float inputs that carry ids (rounded, silently). So the optimized model runs the first
batch forward and through one training step (on its own state, put back afterwards) before the baseline is
measured: a layer that fails under 16 bits is kept at float32 and named, and predictions and loss that
disagree with the user's model beyond the policy's tolerance revert mixed precision, with the numbers.

The tolerances are relative errors: for the predictions, the L2 norm of the difference over the spread of the
user's predictions around their mean (an untrained classifier's probabilities all sit near 1/classes, so a
plain relative error hides even ids looked up under other rows); for the loss, the difference over the user's
loss. Ids looked up under other rows move predictions by about their whole spread; rounding moves an untrained
model's little-varying outputs by a good part of it too (a bfloat16 LSTM's, in benchmarks/verification.py), so
the bfloat16 tolerance sits between. Rounding sets the scale: bfloat16 keeps 8 bits of mantissa, float16 11,
float32 24 (but TF32 matmuls 11 on Ampere+ GPUs and XLA reorders sums). The forward pass runs eagerly; the
training step is the model's own train function, traced (and compiled by XLA where the model is) as `fit`
runs it, which `fit` then reuses.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from tfopt import data_mismatch
from tfopt.errors import IncompatibleModelError, describe_error
from tfopt.layer_policies import float32_output_layers
from tfopt.policies import has_call
from tfopt.training.micro_batches import out_of_memory

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfopt.builder import Built
    from tfopt.plan import Plan

TOLERANCE = {"mixed_bfloat16": 0.3, "mixed_float16": 0.05, "float32": 0.02}
# A model with more layers than this failing under 16 bits is not worth keeping in mixed precision.
_MOST_LAYERS_KEPT = 8


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a model computes on one batch.

    Attributes:
        predictions: The outputs with training=False, flattened to one float64 vector (None where the
            model cannot be called: a model whose `train_step` calls its parts).
        loss: The loss of those predictions (the model's own `compute_loss`), or the first loss its
            `train_step` reports where it cannot be called.
    """

    predictions: Any
    loss: float | None


@dataclasses.dataclass(frozen=True)
class Agreement:
    """How far the optimized model's outcome is from the user's on the same batch and weights.

    Attributes:
        policy: The optimized model's dtype policy.
        predictions_error: L2 error of the predictions relative to their spread (None where there are none).
        loss_error: Relative error of the loss (None where there is none).
        tolerance: The policy's tolerance (`TOLERANCE`).
    """

    policy: str
    predictions_error: float | None
    loss_error: float | None
    tolerance: float

    @property
    def agrees(self) -> bool:
        return all(error is None or error <= self.tolerance for error in (self.predictions_error, self.loss_error))

    def __str__(self) -> str:
        parts = [
            f"{what} by {error:.1%}"
            for what, error in (("predictions differ", self.predictions_error), ("the loss", self.loss_error))
            if error is not None
        ]
        return (
            f"{self.policy} against your model on the first batch: {', '.join(parts) or 'nothing to compare'} "
            f"(tolerance {self.tolerance:.0%})"
        )


def outcome(model: keras.Model, batch: Any, pieces: int = 1, compared: bool | None = None) -> Outcome:
    """Runs `model` on one batch: predictions and loss, then one training step whose changes are put back.

    Args:
        model: The compiled model.
        batch: One batch of the user's pipeline.
        pieces: Micro-batches the batch trains as (`tfopt.training.micro_batches`): the batch is run piece by
            piece, its predictions and loss those of the whole batch, its step one update of `pieces` steps.
        compared: Whether the model's forward pass gives predictions to compare (True: a failure there is
            raised); None for the user's model, where it does if the model reads batches as `fit` does
            (`_forward_passes`). The optimized model is asked what the user's gave.

    Raises:
        Exception: Whatever the model raises on the batch (the caller names the layer).
    """
    from tfopt.profiling.timing import training_state_restored

    # The forward passes too: a stateful RNN carries its states from one call to the next.
    with training_state_restored(model):
        outcome = _outcome_of_calls(model, batch, pieces, compared)
    with model.distribute_strategy.scope():
        model.reset_metrics()
    return outcome


def _outcome_of_calls(model: keras.Model, batch: Any, pieces: int, compared: bool | None) -> Outcome:
    import keras
    import numpy as np
    import tensorflow as tf

    predictions = loss = None
    parts = _pieces(batch, pieces)
    # Outside the model's strategy scope: under several replicas Keras divides a loss by their number in
    # `_compute_loss` and its Loss objects (their gradients are summed), a loss of the user's own writing not.
    # No call(): a model whose train_step calls its parts has no predictions to compare, only its step's loss.
    outputs = _forward_passes(model, parts, compared) if has_call(model) and compared is not False else None
    if outputs is not None:
        per_piece = [tf.nest.flatten(output) for output in outputs]  # each output's pieces in a row: the whole's
        predictions = np.concatenate(
            [
                np.asarray(tf.cast(piece[index], tf.float64)).ravel()
                for index in range(len(per_piece[0]))
                for piece in per_piece
            ]
        )
        if model._compile_loss is not None or model.losses or type(model).compute_loss is not keras.Model.compute_loss:
            # As Keras' own train_step calls it: Trainer._compute_loss passes `training` only to an override that
            # takes it (the keras-io distiller's compute_loss does not). Pieces weigh by their examples.
            losses, sizes = [], []
            for part, output in zip(parts, outputs):
                inputs, targets, weights = keras.utils.unpack_x_y_sample_weight(part)
                value = model._compute_loss(x=inputs, y=targets, y_pred=output, sample_weight=weights, training=False)
                losses.append(float(np.mean(value)))  # a loss without reduction: one per example, as Keras logs
                sizes.append(int(tf.shape(tf.nest.flatten(inputs)[0])[0]))
            loss = float(np.average(losses, weights=sizes))
    with model.distribute_strategy.scope():
        logs = _one_training_step(model, batch, pieces)
    # A train step's own loss under several replicas is divided by their number or not, as its code wrote it:
    # no measure of the batch's to compare there.
    if loss is None and model.distribute_strategy.num_replicas_in_sync == 1:
        values = [value for name, value in logs.items() if "loss" in name]
        if values:
            loss = float(np.mean(values[0]))
    return Outcome(predictions=predictions, loss=loss)


def _forward_passes(model: keras.Model, parts: list[Any], compared: bool | None) -> list[Any] | None:
    """The model's predictions on each part's inputs, read as `fit` reads a batch: (x, y, sample_weight).

    A train_step of the user's model's own reads its batch as it likes (a Siamese model's (anchor, positive,
    negative), without labels): where it fails on what Keras would take for x (`compared` None), it has no
    predictions to compare, only its step's loss, as a model without call().
    """
    import keras

    try:
        return [model(keras.utils.unpack_x_y_sample_weight(part)[0], training=False) for part in parts]
    except Exception as error:
        if compared or out_of_memory(error) or type(model).train_step is keras.Model.train_step:
            raise
        return None


def _pieces(batch: Any, pieces: int) -> list[Any]:
    """The batch as the micro-batches its pipeline is cut into (itself alone where it is whole)."""
    if pieces == 1:
        return [batch]
    import tensorflow as tf

    from tfopt.training.micro_batches import split_batches

    return list(split_batches(tf.data.Dataset.from_tensors(batch), pieces))


def _one_training_step(model: keras.Model, batch: Any, pieces: int) -> dict[str, Any]:
    """One step of the model's own train function on `batch`, as `fit` runs it: its compiled state built first,
    traced (and under XLA where the model compiles with it; a layer can fail in a graph and not eagerly: an int32
    constant against a bfloat16 tensor), fed from a tf.data iterator (distributed under the model's strategy).
    The iterator holds one batch, so one step runs whatever `steps_per_execution` says (measuring reuses the
    traced function; the model `apply` gives back traces its own). In micro-batches, one step per piece, which
    must make exactly one update of the model's optimizer (a train_step that applies optimizers of its own cannot
    accumulate them)."""
    import numpy as np
    import tensorflow as tf

    from tfopt.training.micro_batches import split_batches

    strategy = model.distribute_strategy
    updates = _updates(model)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        # Keras' train function fails under this strategy upstream (keras-team/keras#20585): tfopt trains such a
        # model with a step of its own (tfopt.distribute.training), which calls train_step as this does.
        for part in _pieces(batch, pieces):
            logs = strategy.run(model.train_step, args=(part,))
        logs = {
            name: np.asarray(strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None))
            for name, value in logs.items()
        }
    else:
        # What fit does first, outside the trace: a symbolic build under a strategy, none without (Keras builds
        # then in the trace; a model without call() of its own cannot be built symbolically at all).
        model._maybe_symbolic_build(data_batch=_pieces(batch, pieces)[0])
        model.make_train_function()
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        data = split_batches(_of_unknown_batch_size(batch), pieces).with_options(options)
        if tf.distribute.has_strategy():
            data = strategy.experimental_distribute_dataset(data)
        steps = iter(data)
        for _ in range(-(-pieces // model.steps_per_execution)):  # a call runs up to steps_per_execution pieces
            logs = model.train_function(steps)
        logs = {name: np.asarray(value) for name, value in logs.items()} if isinstance(logs, dict) else {}
    if pieces > 1 and updates is not None and _updates(model) != updates + 1:
        raise IncompatibleModelError(
            f"In {pieces} micro-batches, your model's optimizer made {_updates(model) - updates} updates where one "
            "was due: its train_step applies gradients by other means than self.optimizer, so tfopt cannot "
            "accumulate them. Lower the batch size in your pipeline until a batch fits the device."
        )
    return logs


def _of_unknown_batch_size(batch: Any) -> tf.data.Dataset:
    """A dataset of the one batch, each part's batch dimension unknown, as in most pipelines: one trace serves the
    batches measuring feeds. Each part on its own, for a pipeline zipping batches of other sizes (keras.io's
    semi-supervised contrastive model: unlabeled batches of 16 beside labeled ones of 8)."""
    import tensorflow as tf

    parts = [
        tf.data.Dataset.from_tensors(part).unbatch().batch(int(tf.shape(part)[0]))
        if part.shape.rank
        else tf.data.Dataset.from_tensors(part)
        for part in tf.nest.flatten(batch)
    ]
    return tf.data.Dataset.zip(tuple(parts)).map(lambda *flat: tf.nest.pack_sequence_as(batch, list(flat)))


def _updates(model: keras.Model) -> int | None:
    """The updates the model's optimizer counts, where it counts one per step that applies (no loss scaling,
    which skips the updates of steps whose gradients overflow), else None."""
    import keras

    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, keras.optimizers.Optimizer) or isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        return None
    return int(optimizer.iterations.numpy())


def agreement(reference: Outcome, optimized: Outcome, policy: str) -> Agreement:
    """Compares the optimized model's outcome with the user's, against the policy's tolerance.

    Example:
        >>> import numpy as np
        >>> user = Outcome(np.array([1.0, 2.0]), 0.5)
        >>> result = agreement(user, Outcome(np.array([1.0, 2.01]), 0.501), "mixed_bfloat16")
        >>> round(result.predictions_error, 3), round(result.loss_error, 3), result.tolerance
        (0.014, 0.002, 0.3)
    """
    import numpy as np

    predictions_error = loss_error = None
    if (
        reference.predictions is not None
        and optimized.predictions is not None
        and reference.predictions.shape == optimized.predictions.shape
    ):
        scale = max(float(np.linalg.norm(reference.predictions - reference.predictions.mean())), 1e-12)
        predictions_error = float(np.linalg.norm(optimized.predictions - reference.predictions)) / scale
        if not np.isfinite(predictions_error):
            predictions_error = float("inf")
    if reference.loss is not None and optimized.loss is not None:
        loss_error = abs(optimized.loss - reference.loss) / max(abs(reference.loss), 1e-6)
        if not np.isfinite(loss_error):
            loss_error = float("inf")
    return Agreement(
        policy=policy,
        predictions_error=predictions_error,
        loss_error=loss_error,
        tolerance=TOLERANCE.get(policy, TOLERANCE["float32"]),
    )


def reference_outcome(model: keras.Model, batch: Any, pieces: int = 1) -> Outcome:
    """The user's setup on the first batch (in `pieces` micro-batches); a failure there is the model's or the
    data's, said as such, except the device running out of memory, raised as it is.

    Raises:
        DataError: The batch does not fit the model (not batched, other input shapes, labels beyond its
            classes; `tfopt.data_mismatch`).
        IncompatibleModelError: Keras' own training step fails on the batch otherwise, before any recipe, or
            the model's weights, predictions or loss there are not finite.
    """
    import numpy as np

    from tfopt.training.guards import listed, non_finite_weights

    nan_weights = non_finite_weights(model)
    if nan_weights:  # a layer masking NaN activations would keep the predictions below finite
        raise IncompatibleModelError(
            f"Your model's weights hold NaN or Inf before any recipe ({listed(nan_weights)}): training would only "
            "spread them, and a speedup of a training that computes NaN means nothing. Load or initialise the "
            "weights again."
        )
    try:
        result = outcome(model, batch, pieces)
    except Exception as error:
        if out_of_memory(error) or isinstance(error, IncompatibleModelError):  # micro-batches its train_step refuses
            raise
        mismatch = data_mismatch.explain(model, batch)
        if mismatch is not None:
            raise mismatch from error
        raise IncompatibleModelError(
            f"Your model fails on the first batch of your data, before any recipe: {describe_error(error)}. "
            "Check that model.fit(dataset) trains as it is; tfopt optimizes a training that runs."
        ) from error
    broken = [
        what
        for what, values in (("predictions", result.predictions), ("loss", result.loss))
        if values is not None and not np.all(np.isfinite(values))
    ]
    if broken:
        mismatch = data_mismatch.explain(model, batch)  # a GPU's sparse cross-entropy gives NaN for a label
        if mismatch is not None:  # beyond the classes where a CPU's raises
            raise mismatch
        raise IncompatibleModelError(
            f"Your model's {' and '.join(broken)} on the first batch of your data "
            f"{'is' if broken == ['loss'] else 'are'} not finite (NaN or inf), before any recipe: its weights or "
            "that batch hold NaN or infinite values. Check "
            "np.isfinite(w).all() for w in model.get_weights() and the data; a speedup of a training that "
            "computes NaN means nothing."
        )
    return result


def failing_layer(error: BaseException, model: keras.Model) -> Any:
    """The innermost layer of `model` whose code raised `error`, or None: from the traceback, else (where it
    shows no layer below the model: Keras filters its own frames, a `Lambda`'s call among them) from Keras'
    innermost "Exception encountered when calling <Layer>.call()"."""
    layers = {id(layer): layer for layer in model._flatten_layers(include_self=True, recursive=True)}
    found = None
    traceback = error.__traceback__
    while traceback is not None:
        owner = traceback.tb_frame.f_locals.get("self")
        if id(owner) in layers:
            found = owner
        traceback = traceback.tb_next
    if found is not None and found is not model:
        return found
    for name in reversed(re.findall(r"when calling (\w+)\.call\(\)", str(error))):
        # The message names a class, not a layer: of several, one still in 16 bits is the one that can fail there.
        named = [layer for layer in layers.values() if type(layer).__name__ == name and layer is not model]
        if named:
            return next((layer for layer in named if _computes_in_16_bits(layer)), named[0])
    return found


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the first batch said of the optimized setup.

    Attributes:
        built: The setup, its plan naming the layers kept at float32.
        mixed_precision_fails: Why mixed precision must be left out (the setup is rebuilt without it), or None.
        xla_fails: Why XLA must be left out (the setup is built again without it), or None.
    """

    built: Built
    mixed_precision_fails: str | None = None
    xla_fails: str | None = None


def first_batch_checked(built: Built, reference: Outcome, batch: Any, *, baseline_policy: str) -> Checked:
    """The optimized setup once it has run the first batch and agreed with the user's model.

    A layer that fails under the mixed policy is kept at float32 (named in the plan) and the batch runs
    again; mixed precision must be left out where no layer can be named, more than a few fail, or the outcome
    disagrees beyond the policy's tolerance. A batch that fails under XLA only (the same batch runs with XLA off)
    leaves XLA out: `xla_blockers` lowers the forward pass before the build, but the train step XLA compiles
    holds more (a model without call(), whose train_step calls its parts).

    Args:
        built: The optimized setup.
        reference: The user's setup's outcome on `batch` (`reference_outcome`).
        batch: The first element of the user's dataset.
        baseline_policy: The dtype policy of the user's setup (which runs without XLA).

    Returns:
        `built` (with layers kept at float32), and why mixed precision or XLA must go where one must.

    Raises:
        IncompatibleModelError: The optimized setup fails on the batch for a reason other than its precision.
    """
    model, plan = built.model, built.plan
    compared = reference.predictions is not None  # where the user's model gave predictions, so must this one
    kept: list[str] = []
    while True:
        try:
            result = outcome(model, batch, plan.micro_batches, compared)
        except Exception as error:
            if out_of_memory(error) or isinstance(error, IncompatibleModelError):
                raise
            if plan.jit_compile and _runs_without_xla(model, batch, plan.micro_batches, compared):
                return Checked(built, xla_fails=f"the first batch fails under XLA only: {describe_error(error)}")
            if plan.dtype_policy == baseline_policy:
                raise IncompatibleModelError(_fails_as_it_is(error, model, plan)) from error
            layer = failing_layer(error, model)
            may_mix_outputs = has_call(model) or _mixes_precisions(error, plan.dtype_policy)
            outputs = (
                float32_output_layers(model, plan.sample_inputs)
                if layer is model and may_mix_outputs and not plan.outputs_in_16_bits
                else []
            )
            if outputs:
                # The model's own code mixes what the layers kept float32 for the outputs compute with 16-bit
                # tensors (a recommender's `dot + user_bias + movie_bias`; a masked autoencoder's train_step adding
                # its encoder's outputs to positions another part embedded): Keras' own mixed policy leaves them in
                # 16 bits, and so does the setup, which trains as plain Keras' would under the policy. A model
                # without call() only where the error is such a mix: its train_step may fail otherwise (a VAE's
                # under a strategy, where plain fit fails too).
                for each in outputs:
                    each.dtype_policy = plan.dtype_policy
                model.train_function = None
                plan = plan.replace(outputs_in_16_bits=True).amend(
                    "mixed_precision",
                    f"then {_named(outputs)} back in {plan.dtype_policy}, the outputs in 16 bits as under Keras' own "
                    "mixed policy: the model's own code mixes their float32 results with 16-bit ones "
                    f"({describe_error(error)})",
                )
                continue
            # A layer float32 already (it holds an id reader) that fails mixes in what its own layers compute in
            # 16 bits (an Embedding's float32 positions added to a Dense's bfloat16 projection): they go too.
            keeping = [] if layer is None or layer is model else _in_16_bits(layer)
            if not keeping or len(kept) == _MOST_LAYERS_KEPT:
                return Checked(built, mixed_precision_fails=_fails_in_16_bits(layer, model, plan, error))
            for each in keeping:
                each.dtype_policy = "float32"
            model.train_function = None  # traced with the layers in 16 bits
            plan = plan.replace(float32_layers=(*plan.float32_layers, *(each.name for each in keeping)))
            which = repr(layer.name) if keeping == [layer] else f"the layers in {layer.name!r} ({_named(keeping)})"
            kept.append(f"{which} ({type(layer).__name__}: {describe_error(error)})")
            continue
        checked = agreement(reference, result, plan.dtype_policy)
        if not checked.agrees and plan.jit_compile:
            # A train step's own random numbers (keras.random in a GAN's train_step) are other ones under XLA,
            # whose generator differs: a disagreement that goes with XLA is XLA's, not the precision's.
            alone = _outcome_without_xla(model, batch, plan.micro_batches, compared)
            alone = agreement(reference, alone, plan.dtype_policy)
            if alone.agrees:
                return Checked(built, xla_fails=f"the first batch disagrees under XLA only ({checked})")
        if not checked.agrees and plan.dtype_policy != baseline_policy:
            return Checked(built, mixed_precision_fails=str(checked))
        if not checked.agrees:
            plan = plan.record(
                "fidelity", f"{checked}: not from precision; check the recipes applied ({_recipes(plan)})"
            )
        elif kept:
            plan = plan.amend("mixed_precision", f"kept float32, failing under {plan.dtype_policy}: {'; '.join(kept)}")
        return Checked(dataclasses.replace(built, plan=plan))


def _mixes_precisions(error: Exception, policy: str) -> bool:
    """Whether `error` is an op refusing a float32 tensor beside one of the policy's 16 bits (TensorFlow's "has
    type bfloat16 that does not match type float32")."""
    sixteen = r"\bbfloat16\b" if policy == "mixed_bfloat16" else r"\b(float16|half)\b"
    text = str(error)
    return "float32" in text and re.search(sixteen, text) is not None


def _in_16_bits(layer: Any) -> list[Any]:
    """The layer where it computes in 16 bits, else the layers in it that do (where it is float32 already)."""
    if _computes_in_16_bits(layer):
        return [layer]
    return [each for each in layer._flatten_layers(include_self=False, recursive=True) if _computes_in_16_bits(each)]


def _computes_in_16_bits(layer: Any) -> bool:
    return layer.compute_dtype in ("float16", "bfloat16")


def _named(layers: list[Any], most: int = 4) -> str:
    names = ", ".join(repr(layer.name) for layer in layers[:most])
    return names + (f" and {len(layers) - most} more" if len(layers) > most else "")


def _fails_in_16_bits(layer: Any, model: keras.Model, plan: Plan, error: Exception) -> str:
    """Why mixed precision is left out: the layer that fails under it, the model's own code, or Keras' around its
    layers (a Functional or Sequential model's)."""
    failure = f"fails under {plan.dtype_policy}: {describe_error(error).rstrip('.')}"
    if layer is model and type(model).__module__.startswith("keras."):
        return (
            f"Keras' own code around the layers of this {type(model).__name__} model (such as where it sums the "
            f"losses its layers add: add_loss, activity_regularizer) {failure}. Leave mixed_precision out"
        )
    if layer is model:
        return (
            f"the model's own code ({type(model).__name__}: its train_step or call, not one of its layers) {failure}. "
            "Cast what it computes to one dtype (keras.ops.cast to the layers' outputs' dtype), or leave "
            "mixed_precision out"
        )
    if layer is None:
        return f"the model {failure}. Leave mixed_precision out"
    return (
        f"layer {layer.name!r} ({type(layer).__name__}) {failure}. Give that layer dtype='float32' to keep the rest "
        "in 16 bits, or leave mixed_precision out"
    )


def _fails_as_it_is(error: Exception, model: keras.Model, plan: Plan) -> str:
    """Why the optimized setup fails on the first batch at the user's precision, and what to do."""
    if not has_call(model) and plan.strategy != "default" and "Unable to automatically build" in str(error):
        return (
            f"{type(model).__name__} has no call() of its own, and Keras builds a model under a distribution "
            f"strategy ({plan.strategy}) by calling it: plain fit fails under this strategy too "
            f"({describe_error(error)}). Leave the distribution recipe out, or give the model a call() that runs "
            "its parts."
        )
    if plan.strategy in ("mirrored", "multi_worker"):
        return (
            f"The optimized setup fails on the first batch under {plan.strategy}, where your model trains on one "
            f"device: {describe_error(error).rstrip('.')}. Keras traces the train_step per replica there, and "
            "state a train_step makes on its first call (its own optimizers built there) fails in plain fit under "
            "the same strategy too: build such state in compile (optimizer.build(variables)), or leave the "
            f"distribution recipe out. Recipes applied: {_recipes(plan)}."
        )
    return (
        f"The optimized setup fails on the first batch although your model trains on it: {describe_error(error)}. "
        f"Recipes applied: {_recipes(plan)}; leave them out one by one to find the one at fault, and report it "
        "to tfopt."
    )


def _runs_without_xla(model: keras.Model, batch: Any, pieces: int, compared: bool) -> bool:
    """Whether the batch the model failed on runs with XLA off: the failure is XLA's, not a layer's in 16 bits
    or a recipe's."""
    try:
        _outcome_without_xla(model, batch, pieces, compared)
    except Exception:  # noqa: BLE001 - it fails without XLA too: not XLA's doing
        return False
    return True


def _outcome_without_xla(model: keras.Model, batch: Any, pieces: int, compared: bool) -> Outcome:
    """The model's outcome on the batch with XLA off (its train function made again, then again under XLA)."""
    model.jit_compile = False
    model.train_function = None
    try:
        return outcome(model, batch, pieces, compared)
    finally:
        model.jit_compile = True
        model.train_function = None


def _recipes(plan: Plan) -> str:
    return ", ".join(sorted({step.recipe for step in plan.applied if not step.skipped and step.recipe != "baseline"}))
