"""tfopt builds an optimizer before fit would, where fit would build it: under loss scaling too, whose build
(Keras' LossScaleOptimizer) has no guard against a second call, which tracing makes."""

import keras

from tfopt.training.optimizer_build import build_as_fit_does


def test_a_loss_scaling_optimizer_is_built_once_over_the_models_variables():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    build_as_fit_does(optimizer, model)
    assert optimizer.built and optimizer.inner_optimizer.built
    assert len(optimizer.inner_optimizer._momentums) == len(model.trainable_variables) == 2
    assert float(optimizer.dynamic_scale.numpy()) == 2.0**15 and int(optimizer.step_counter.numpy()) == 0
