"""A convolution's bias folded into the BatchNormalization that follows it, where it cancels.

`keras.applications` convolutions (ResNets, among others) carry a bias right before a BatchNormalization. In
training the normalization subtracts the batch's mean, bias included, so the bias changes nothing: its
gradient is zero, and computing it is a reduction over the whole output gradient per convolution. Moving the
bias's value into the normalization's moving mean (`moving_mean - bias`), leaving a bias of zero that does not
train, computes the same outputs in training and in inference, and the moving mean evolves as it would have,
shifted by the constant bias. The layers keep their config and variables (the bias is still there, zero and
not trainable), so the copy saves and loads as the user's model does, and its weights load into it; its
optimizer keeps (zero) slots for the biases, so a saved copy reloads with its optimizer's state too.

Folded only where that holds: the optimizer is SGD (`_moves_on_noise`), the convolution feeds nothing but the
normalization, over its channel axis, with no activation between, no regularizer or constraint on the bias
and no weight decay on a non-zero bias (they would move it), both layers trainable (a frozen normalization
runs on its moving statistics, where the bias does not cancel and trains), used once in the model, no
optimizer state kept for the bias yet, and Keras' own train_step and graph (a train_step or call() of the user's
own, at the top or around a nested model, may call it with `training=False`).

Decided once, when the copy is built: a normalization the user freezes afterwards, or a new optimizer compiled
for a second stage, meets a bias that stays zero and has no slot (docs/recipes/fused_layers.md says what to do).
"""

from __future__ import annotations

from typing import Any

import keras

from tfopt.rewrites.batch_norm import FusedBatchNormalization
from tfopt.training.optimizer_build import build_as_fit_does

# Keras' own classes only: a subclass may add its bias in a `call` of its own.
_CONVOLUTIONS = (
    keras.layers.Conv1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
    keras.layers.SeparableConv1D,
    keras.layers.SeparableConv2D,
    keras.layers.DepthwiseConv1D,
    keras.layers.DepthwiseConv2D,
)
_NORMALIZATIONS = (keras.layers.BatchNormalization, FusedBatchNormalization)


def fold_conv_biases(model: keras.Model, optimizer: Any = None) -> tuple[list[str], list[str]]:
    """Folds the bias of each convolution of `model` that a BatchNormalization cancels, in place.

    Call it after the model has its weights (the bias's value moves into the moving mean). `optimizer` is the one
    it will train with (an object or a Keras name), where that is not yet its own; with neither, the caller is
    to train it under SGD.

    Returns:
        The names of the convolutions folded, and "name: why not" for each convolution with a bias that feeds a
        BatchNormalization and was left as it is.
    """
    moving_noise = _moves_on_noise(optimizer if optimizer is not None else getattr(model, "optimizer", None))
    optimizer = getattr(model, "optimizer", None)
    folded, kept = [], []
    run_by_graphs = _run_by_graphs(model)
    for normalization in model._flatten_layers(include_self=False, recursive=True):
        if type(normalization) not in _NORMALIZATIONS or len(normalization._inbound_nodes) != 1:
            continue
        parents = normalization._inbound_nodes[0].parent_nodes
        convolution = parents[0].operation if len(parents) == 1 else None
        if type(convolution) not in _CONVOLUTIONS or not convolution.use_bias or not convolution.bias.trainable:
            continue
        own_train_step = type(model).train_step is not keras.Model.train_step
        own_call = id(normalization) not in run_by_graphs
        why_not = moving_noise or _why_not(convolution, normalization, optimizer, own_train_step, own_call)
        if why_not:
            kept.append(f"{convolution.name}: {why_not}")
            continue
        bias = convolution.bias
        normalization.moving_mean.assign(normalization.moving_mean - keras.ops.cast(bias, "float32"))
        bias.assign(keras.ops.zeros_like(bias))
        bias.trainable = False
        folded.append(convolution)
    if folded and optimizer is not None:
        _build_with_slots_for(optimizer, model, [convolution.bias for convolution in folded])
    if moving_noise and kept:  # one reason for them all
        kept = [f"{len(kept)} convolution(s): {moving_noise}"]
    return [convolution.name for convolution in folded], kept


def _run_by_graphs(model: keras.Model) -> set[int]:
    """The ids of the layers Keras' own graph code calls, passing on fit's `training` flag: those of a Functional
    or Sequential model and of the graph models in it, recursively. A `call()` of the user's own, at the top or
    nested, may call its layers with `training=False` (a frozen block while fine-tuning)."""
    from keras.src.models.functional import Functional

    if type(model).call not in (Functional.call, keras.Sequential.call):
        return set()
    run = set()
    for layer in model.layers:
        run.add(id(layer))
        if isinstance(layer, keras.Model):
            run |= _run_by_graphs(layer)
    return run


def _moves_on_noise(optimizer: Any) -> str | None:
    """Why an optimizer trains a cancelled bias in plain Keras, or None. Its gradient is zero only up to float
    rounding, and an optimizer scaling each update to the gradient's running size (Adam, RMSprop, Lion, ...)
    turns that noise into steps of the order of its learning rate, which a folded bias would not take: SGD's
    update of a rounding-sized gradient is rounding-sized, and only under it is the fold the same training."""
    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    inner = optimizer.inner_optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else optimizer
    if inner is None or isinstance(inner, keras.optimizers.SGD):
        return None
    return (
        f"the optimizer ({type(inner).__name__}) scales each update to the gradient's running size, so the "
        "rounding noise of the bias's zero gradient trains it in plain Keras (folded only under SGD)"
    )


def _build_with_slots_for(optimizer: Any, model: keras.Model, biases: list[Any]) -> None:
    """Builds the optimizer over the model's trainable variables with the folded biases among them, in their
    places: a variable's `trainable` is not saved, so a saved copy reloads (without tfopt) with its biases
    trainable, and Keras skips all of a saved optimizer's state whose variables do not match in number. The
    biases' slots stay zero (no gradient reaches them)."""
    for bias in biases:
        bias.trainable = True
    try:
        build_as_fit_does(optimizer, model)
    finally:
        for bias in biases:
            bias.trainable = False


def _why_not(
    convolution: keras.layers.Layer,
    normalization: keras.layers.BatchNormalization,
    optimizer: Any,
    own_train_step: bool,
    own_call: bool,
) -> str | None:
    """Why the bias of `convolution` does not cancel in `normalization`, or None where it does."""
    if optimizer is not None and optimizer.built:
        return "the optimizer already keeps state for its bias"
    if own_train_step or own_call:
        return (
            (
                "the model trains in a train_step of its own"
                if own_train_step
                else "a call() of yours runs it (the model's or a nested block's)"
            )
            + ", which may call it in inference mode, where the normalization runs on its moving statistics and the "
            "bias trains"
        )
    if len(convolution._inbound_nodes) != 1 or len(convolution._outbound_nodes) != 1:
        return "its output is used elsewhere too, or it is called more than once"
    if convolution.activation not in (None, keras.activations.linear):
        return f"its activation ({convolution.activation.__name__}) comes between it and the normalization"
    if convolution.bias_regularizer is not None or convolution.bias_constraint is not None:
        return "its bias has a regularizer or a constraint, which move it"
    decay = getattr(optimizer, "weight_decay", None)
    if decay and bool(keras.ops.any(convolution.bias != 0)):
        return f"the optimizer's weight decay ({decay:g}) would move its non-zero bias"
    if not (convolution.trainable and normalization.trainable):
        return "a frozen layer: the normalization runs on its moving statistics, where the bias does not cancel"
    rank = len(convolution.output.shape)
    channels = rank - 1 if convolution.data_format == "channels_last" else 1
    if normalization.axis % rank != channels:
        return f"{normalization.name} normalizes over axis {normalization.axis}, not its channels"
    return None
