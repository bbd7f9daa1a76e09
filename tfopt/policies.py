"""The numerics a model computes with: Keras dtype policies (the scope that sets one, the policy a model
was built under) and TensorFlow's TF32 switch. `tfopt.layer_policies` puts a built model's layers on another.

Its own module because both `make_plan` (which records the user's policy and TF32 setting) and `build`
(which puts the model it builds on the plan's) need it, and neither may import the other. The plan stays
pure data: the process-wide state these settings live in is kept here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras


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


def has_call(model: keras.Model) -> bool:
    """Whether the model has a forward pass of its own: a model whose class defines no call() (a GAN's, a VAE's)
    is trained by a train_step that calls its parts."""
    import keras

    return type(model).call is not keras.Model.call


def model_dtype_policy(model: keras.Model) -> str:
    """The dtype policy a model was built under: "float32", or a mixed policy set globally at the time."""
    name = model.dtype_policy.name
    return name if name in ("mixed_float16", "mixed_bfloat16") else "float32"


# TensorFlow's TF32 switch is process-wide and read when kernels run, so a build that turns it off for its
# model (mixed_precision tf32: false) must leave it off while that model trains: after `tfopt.apply` returns,
# the user trains `result.model`. The user's own setting from before is kept here, so that the next plan's
# baseline is the user's float32 and not the last build's; None while the switch is as the user set it.
_users_tf32_before_build: bool | None = None


def users_tf32_setting() -> bool:
    """Whether float32 matmuls and convolutions may run in TF32, as the user set it (TensorFlow's default:
    True): TensorFlow's switch, or, while a build's change of it is in force, the setting from before.

    The switch has two values, so a user who sets it, after such a build, to the value the build left is
    not told apart from the build, and reads as the setting from before: `mixed_precision: {tf32: ...}`
    says it explicitly.

    Example:
        >>> users_tf32_setting() in (True, False)
        True
    """
    import tensorflow as tf

    if _users_tf32_before_build is not None:
        return _users_tf32_before_build
    return bool(tf.config.experimental.tensor_float_32_execution_enabled())


def put_tf32_in_force(tf32: bool) -> None:
    """Sets TensorFlow's TF32 switch for a model built or run under a plan whose `tf32` is `tf32`, keeping
    the user's setting for `users_tf32_setting`. It stays set: the model trains under it."""
    import tensorflow as tf

    global _users_tf32_before_build
    users = users_tf32_setting()
    if bool(tf.config.experimental.tensor_float_32_execution_enabled()) != tf32:
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
    _users_tf32_before_build = None if tf32 == users else users
