"""A train_step drawing noise without a seed (keras.io's DDIM, its masked autoencoder) draws from Keras' global
SeedGenerator: after `apply`, which trains the copy on the user's batches, the copy and the user's own model
draw the noise plain fit would have drawn."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tests.conftest import FAKE_HARDWARE


class Denoiser(keras.Model):
    """Learns to find the noise added to its inputs, drawn from Keras' global generator."""

    def __init__(self):
        super().__init__()
        self.net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
        self.tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.tracker]

    def train_step(self, inputs):
        noise = keras.random.normal(keras.ops.shape(inputs))  # no seed
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self.net(inputs + noise) - noise))
        gradients = tape.gradient(loss, self.net.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.net.trainable_weights))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


def losses(after_apply, generator_made_before):
    """Two epochs' losses of plain fit, or of the copy and of the user's model fit after `apply`."""
    keras.utils.set_random_seed(0)  # drops Keras' global generator: the first draw makes it
    if generator_made_before:
        keras.random.normal((1,))
    model = Denoiser()
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    data = tf.data.Dataset.from_tensor_slices(np.random.default_rng(0).random((16, 4), dtype=np.float32)).batch(8)
    if after_apply is None:
        return model.fit(data, epochs=2, verbose=0).history["loss"]
    result = tfopt.apply(model, data, hardware=FAKE_HARDWARE["cpu_plain"], measure_speed=False)
    trained = result.model if after_apply == "copy" else model
    return trained.fit(result.dataset, epochs=2, verbose=0).history["loss"]


@pytest.mark.parametrize("generator_made_before", [False, True], ids=["made_by_the_first_draw", "made_before"])
def test_the_copy_and_the_users_model_draw_the_noise_plain_fit_draws(generator_made_before):
    plain = losses(None, generator_made_before)
    assert losses("copy", generator_made_before) == plain
    assert losses("user", generator_made_before) == plain
