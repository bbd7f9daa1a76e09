"""`BatchNormalization` computed by TensorFlow's fused kernel (`FusedBatchNormV3`), with Keras 3's semantics.

Keras 3's `BatchNormalization` casts 16-bit inputs to float32, computes the batch's moments in one pass and
normalizes in another, and leaves the backward pass to autodiff; tf.keras 2 called `FusedBatchNormV3`, which
cuDNN and XLA run as one pass with an analytic gradient. `FusedBatchNormalization` calls that kernel and
keeps everything else of Keras': the same variables (gamma, beta, moving mean and variance), config, momentum
update, `training` argument, frozen layers running in inference mode, and float32 statistics for 16-bit
inputs. The kernel's variance for the moving average is Bessel-corrected (n / (n - 1)); Keras' is not, so it
is taken back to Keras' before the moving variance moves.

Only what the kernel computes the same way is rewritten (`fusable`): the channel axis last (the kernel on CPU
takes no other layout), no synchronized statistics across replicas, no batch renormalization, an epsilon the
kernel accepts. A call with a mask, or on float64, falls back to Keras' own computation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras
from keras.src import api_export

# FusedBatchNormV3 (cuDNN's limit) refuses a smaller epsilon; TensorFlow's wrapper would silently raise it.
MIN_EPSILON = 1.001e-5


@keras.saving.register_keras_serializable(package="tfopt")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """A `keras.layers.BatchNormalization` that trains and infers through `FusedBatchNormV3`.

    Example:
        >>> import numpy as np
        >>> plain = keras.layers.BatchNormalization()
        >>> fused = FusedBatchNormalization()
        >>> x = np.random.default_rng(0).normal(size=(8, 4, 4, 3)).astype("float32")
        >>> bool(np.allclose(plain(x, training=True), fused(x, training=True), atol=1e-5))
        True
    """

    def call(self, inputs: Any, training: bool | None = None, mask: Any = None) -> Any:
        import tensorflow as tf

        if mask is not None or inputs.dtype not in (tf.float16, tf.bfloat16, tf.float32):
            return super().call(inputs, training=training, mask=mask)  # the kernel has no mask nor float64
        channels = inputs.shape[-1]
        x = inputs
        shape = tf.shape(x)
        if x.shape.rank != 4:  # the kernel takes NHWC: every position of every example is one of "N"
            x = tf.reshape(x, [-1, 1, 1, channels])
        gamma = tf.cast(self.gamma, tf.float32) if self.scale else tf.ones([channels], tf.float32)
        beta = tf.cast(self.beta, tf.float32) if self.center else tf.zeros([channels], tf.float32)
        if training and self.trainable:
            outputs, mean, corrected = tf.compat.v1.nn.fused_batch_norm(
                x, gamma, beta, epsilon=self.epsilon, is_training=True
            )
            count = tf.cast(tf.size(x, out_type=tf.int64) // channels, tf.float32)
            variance = tf.where(count > 1, corrected * (count - 1) / tf.maximum(count, 1), tf.zeros_like(corrected))
            moving_mean = tf.cast(self.moving_mean, tf.float32)
            moving_variance = tf.cast(self.moving_variance, tf.float32)
            self.moving_mean.assign(moving_mean * self.momentum + mean * (1.0 - self.momentum))
            self.moving_variance.assign(moving_variance * self.momentum + variance * (1.0 - self.momentum))
        else:
            outputs, _, _ = tf.compat.v1.nn.fused_batch_norm(
                x,
                gamma,
                beta,
                mean=tf.cast(self.moving_mean, tf.float32),
                variance=tf.cast(self.moving_variance, tf.float32),
                epsilon=self.epsilon,
                is_training=False,
            )
        if inputs.shape.rank != 4:
            outputs = tf.reshape(outputs, shape)
        return tf.cast(outputs, self.compute_dtype)


# Keras' weight files address a layer's variables by its class name (`saving_lib`): under Keras' own, the copy's
# weights and the user's model's load into each other.
FusedBatchNormalization.__name__ = FusedBatchNormalization.__qualname__ = "BatchNormalization"
# And a saved copy (`.keras`, a ModelCheckpoint) names Keras' own public class, which computes the same: it loads
# where tfopt is not installed (as plain BatchNormalization). Keras serializes a class by its public name where
# it has one (`serialization_lib.serialize_with_public_class`); the registration under tfopt's name reads files
# an earlier tfopt wrote.
# (Keras' registry is not public API: where a Keras renames it, the copy saves under tfopt's name, as before.)
_public = getattr(api_export, "REGISTERED_OBJS_TO_NAMES", None)
if isinstance(_public, dict):
    _public[FusedBatchNormalization] = api_export.get_name_from_symbol(keras.layers.BatchNormalization)


def fusable(layer: keras.layers.BatchNormalization) -> str | None:
    """Why the BatchNormalization `layer` is not rewritten, or None where `FusedBatchNormalization` computes it
    the same way."""
    if type(layer) is not keras.layers.BatchNormalization:
        return f"a subclass of BatchNormalization ({type(layer).__name__}), whose own code stays"
    rank = layer.input_spec.ndim if layer.input_spec is not None else None
    if layer.axis != -1 and (rank is None or layer.axis % rank != rank - 1):
        return f"axis={layer.axis} is not the last (channels_first): the fused kernel on CPU takes channels last"
    if layer.synchronized:
        return "synchronized=True computes statistics across replicas"
    if layer.renorm:
        return "renorm=True (batch renormalization)"
    if layer.epsilon < MIN_EPSILON:
        return f"epsilon={layer.epsilon:g} is below the fused kernel's smallest, {MIN_EPSILON:g}"
    return None


def fuse_batch_norms(model: keras.Model) -> tuple[list[str], list[str]]:
    """Makes every `BatchNormalization` of `model` (nested models included) that `fusable` allows a
    `FusedBatchNormalization`, in place: the same object, its class changed, so the functional graph, the
    variables and the optimizer's slots stay as they are.

    Returns:
        The names of the layers rewritten, and "name: why not" for each one left as it is.
    """
    rewritten, kept = [], []
    for layer, why_not in _batch_norms(model):
        if why_not is None:
            layer.__class__ = FusedBatchNormalization
            rewritten.append(layer.name)
        else:
            kept.append(f"{layer.name}: {why_not}")
    return rewritten, kept


def fusable_batch_norms(model: keras.Model) -> list[str]:
    """The names of the layers `fuse_batch_norms` would rewrite in `model`, which stays as it is."""
    return [layer.name for layer, why_not in _batch_norms(model) if why_not is None]


def _batch_norms(model: keras.Model) -> Iterator[tuple[keras.layers.BatchNormalization, str | None]]:
    """Each BatchNormalization of `model` (nested models included) not rewritten yet, and why it would stay."""
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.BatchNormalization) and not isinstance(layer, FusedBatchNormalization):
            yield layer, fusable(layer)
