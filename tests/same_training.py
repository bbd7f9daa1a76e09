"""The fidelity check the tests share: tfopt's model and the user's, trained from the same start on the same
data, end at the same history and weights."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfopt.recipes.mixed_precision import float32_matmul_scope


def assert_same_training(result, user, data, epochs=2, rounding=1e-5):
    """Trains `result.model` on `result.dataset` and `user` on `data` and compares them.

    On a GPU host Keras' `jit_compile="auto"` is XLA, which a plan for faked CPU hardware leaves off, and
    float32 matmuls run in TF32: the user's model runs XLA as the plan does (its train function made again),
    and both run in IEEE float32. What is left on a GPU is cuDNN's and cuBLAS' choice of algorithm, free per
    call: an LSTM trained twice that way ended two epochs 7e-5 apart on an H100 (1e-5 on a CPU). A recipe
    that changed the training (XLA's random numbers, a lost optimizer state) differs by 1e-2 or more.

    `rounding`: the float32 rounding two equal computations may differ by on a CPU; a kernel that sums in
    another order (a fused BatchNormalization) drifts further over the steps.
    """
    user.jit_compile = result.model.jit_compile
    user.make_train_function(force=True)
    tolerance = max(1e-4, rounding) if tf.config.list_logical_devices("GPU") else rounding
    with float32_matmul_scope(tf32=False):
        mine = result.model.fit(result.dataset, epochs=epochs, verbose=0, shuffle=False).history
        theirs = user.fit(data, epochs=epochs, verbose=0, shuffle=False).history
    assert sorted(mine) == sorted(theirs)
    for name in theirs:
        np.testing.assert_allclose(mine[name], theirs[name], rtol=tolerance, atol=tolerance / 10)
    for a, b in zip(result.model.get_weights(), user.get_weights()):
        np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance / 10)
