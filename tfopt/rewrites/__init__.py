"""Rewrites of the layers of a model copy into faster equivalents with the same semantics.

Keras 3 computes some layers in ways tf.keras 2 did not: `BatchNormalization` in two unfused passes with its
backward pass left to autodiff, and `keras.applications` convolutions add a bias that the normalization after
them cancels. A rewrite changes how the model computes, never what: the copy starts from the user's weights,
keeps each layer's `training` behaviour, and its state evolves the same way. Which layers were rewritten, and
why others were not, is said in `plan.applied`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras

# The rewrites, in the order the build makes them: BatchNormalization through the fused kernel
# (`batch_norm`), a convolution's bias folded into the BatchNormalization after it (`conv_bias`).
REWRITES = ("batch_norm", "conv_bias")


def rewrite(
    model: keras.Model, names: tuple[str, ...], optimizer: Any = None
) -> dict[str, tuple[list[str], list[str]]]:
    """Makes the rewrites `names` (of `REWRITES`) on `model`'s layers, in place, once it has its weights.

    Args:
        model: The model, with its weights.
        names: The rewrites to make.
        optimizer: The optimizer the model will train with (an object or a Keras name; None: its own): a build
            compiles after the rewrites, and a fold is the same training under SGD only.

    Returns:
        By rewrite: the layers rewritten, and "layer: why not" for each candidate layer left as it is.
    """
    from tfopt.rewrites.batch_norm import fuse_batch_norms
    from tfopt.rewrites.conv_bias import fold_conv_biases

    makers = {"batch_norm": fuse_batch_norms, "conv_bias": functools.partial(fold_conv_biases, optimizer=optimizer)}
    return {name: makers[name](model) for name in REWRITES if name in names}
