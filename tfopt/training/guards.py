"""Stop training at the first NaN or Inf loss or weight, with a message that says where and what to do.

Keras' own `TerminateOnNaN` only sets `stop_training` and prints a line, so `fit()` returns normally and a
script goes on to save and evaluate a broken model. This guard raises instead, naming the step, the
loss, and (under float16) the loss-scale state, because a collapsing loss scale is the usual fp16 story.

The loss alone does not catch every NaN: behind a layer that masks NaN activations (or a loss that clips
its inputs), a model whose weights or input features are NaN keeps a finite loss while every update writes
NaN into the weights. The
guard therefore also checks the weights before the first step and at every epoch end (one reduction
over all variables, read once).
"""

from __future__ import annotations

import math
from typing import Any

import keras

from tfopt.errors import NonFiniteLossError


def loss_scale_state(optimizer: keras.optimizers.Optimizer) -> str | None:
    """Describes a LossScaleOptimizer's dynamic scale, or None for any other optimizer.

    Example:
        >>> import keras
        >>> loss_scale_state(keras.optimizers.SGD()) is None
        True
    """
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return None
    scale = float(optimizer.dynamic_scale.numpy()) if optimizer.built else float(optimizer.initial_scale)
    initial = float(optimizer.initial_scale)
    return (
        f"float16 loss scale is {scale:g} (started at {initial:g}); a scale that has collapsed far below "
        "its start means gradients overflow float16 even unscaled"
    )


def check_finite_loss(loss: Any, *, step: int, optimizer: keras.optimizers.Optimizer | None = None) -> None:
    """Raises `NonFiniteLossError` if `loss` is NaN or Inf.

    Args:
        loss: The loss value (a Python number or scalar tensor).
        step: The global step it belongs to, for the message.
        optimizer: The model's optimizer; a LossScaleOptimizer's scale is added to the message.

    Raises:
        NonFiniteLossError: The loss is not finite.

    Example:
        >>> check_finite_loss(0.5, step=3)  # finite: returns None
    """
    value = float(loss)
    if math.isfinite(value):
        return
    scale = loss_scale_state(optimizer)
    raise NonFiniteLossError(
        f"Training stopped at step {step}: the loss is {value}. Common causes: a learning rate too high "
        "for the batch size, inputs containing NaN/Inf (check the dataset), log(0) or division by zero in "
        "a custom loss, or float16 overflow (compute the last layer and the loss in float32)."
        + (f" The {scale}." if scale else ""),
        step=step,
    )


def non_finite_weights(model: keras.Model) -> list[str]:
    """The paths of `model`'s float variables that hold a NaN or Inf (empty when all are finite).

    Example:
        >>> import keras
        >>> non_finite_weights(keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)]))
        []
    """
    import tensorflow as tf

    variables = [v for v in model.variables if keras.backend.is_float_dtype(v.dtype)]
    if not variables:
        return []
    finite = tf.stack([tf.reduce_all(tf.math.is_finite(v.value)) for v in variables]).numpy()
    return [variable.path for variable, ok in zip(variables, finite) if not ok]


def listed(paths: list[str], most: int = 5) -> str:
    """Variable paths for a message: the first `most`, then how many more.

    Example:
        >>> listed(["a/kernel", "a/bias", "b/kernel"], most=2)
        'a/kernel, a/bias and 1 more'
    """
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def check_finite_weights(model: keras.Model, *, step: int, before_training: bool = False) -> None:
    """Raises `NonFiniteLossError` naming the variables of `model` that hold a NaN or Inf.

    Args:
        model: The model being trained.
        step: The global step the weights are at, for the message.
        before_training: The check runs before the first step (the weights came in broken).

    Raises:
        NonFiniteLossError: A float variable holds a NaN or Inf.
    """
    broken = non_finite_weights(model)
    if not broken:
        return
    names = listed(broken)
    if before_training:
        raise NonFiniteLossError(
            f"Training did not start: the model's weights hold NaN or Inf before the first step ({names}). "
            "Load or initialise the weights again; training would only spread the NaN.",
            step=step,
        )
    raise NonFiniteLossError(
        f"Training stopped at step {step}: the model's weights hold NaN or Inf ({names}), though the loss may "
        "look finite (a layer that masks NaN, or a loss that clips, hides it). Common causes: NaN/Inf in the "
        "inputs (check the dataset's features), a learning rate too high, or float16 overflow.",
        step=step,
    )


class NonFiniteLossGuard(keras.callbacks.Callback):
    """A callback that raises `NonFiniteLossError` at the first step whose loss is NaN or Inf, and where
    the weights hold a NaN or Inf before training or at an epoch end.

    `logs["loss"]` in Keras 3 is the running mean over the epoch, so it turns non-finite at the first bad
    step and stays so: checking it at every batch end finds that step. Put it before any callback that
    saves, so nothing is saved from the bad step.

    Args:
        steps_done: Global steps already trained before this `fit()` call (a resumed run), so the message
            names global steps.

    Example:
        >>> model.fit(dataset, epochs=3, callbacks=[NonFiniteLossGuard()])  # doctest: +SKIP
    """

    def __init__(self, steps_done: int = 0, micro_batches: int = 1):
        super().__init__()
        self._epoch_base = steps_done
        self._step = steps_done
        self._micro_batches = micro_batches

    def on_train_begin(self, logs: dict | None = None) -> None:
        check_finite_weights(self.model, step=self._step, before_training=True)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        # `batch` is the index within the epoch of the last step run (steps_per_execution may run several).
        self._step = self._epoch_base + -(-(batch + 1) // self._micro_batches)
        if logs and "loss" in logs:
            check_finite_loss(logs["loss"], step=self._step, optimizer=self.model.optimizer)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch_base = self._step
        check_finite_weights(self.model, step=self._step)
