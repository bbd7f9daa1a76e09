"""Optimizers a GAN's own train_step applies, wherever its compile put them: found, their state put back after
tfopt's checks, and named where a recipe would set up the compiled optimizer instead."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tfopt.errors import RecipeConfigError
from tfopt.training.held_optimizers import held_optimizers


class TwoOptimizerGAN(keras.Model):
    """A GAN whose compile keeps its optimizers in a dict (`style="dict"`) or compiles them into its sub-models
    (`style="sub-models"`), and whose train_step applies them from there."""

    def __init__(self, style):
        super().__init__()
        self.style = style
        self.discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(6)])
        self.noise = keras.random.SeedGenerator(1)

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        if self.style == "dict":
            self.optimizers = {"d": d_optimizer, "g": g_optimizer}
        else:
            self.discriminator.compile(d_optimizer)
            self.generator.compile(g_optimizer)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def optimizer_of(self, part):
        if self.style == "dict":
            return self.optimizers[part]
        return {"d": self.discriminator, "g": self.generator}[part].optimizer

    def train_step(self, real):
        size = tf.shape(real)[0]
        fake = self.generator(keras.random.normal((size, 3), seed=self.noise))
        with tf.GradientTape() as tape:
            scores = self.discriminator(tf.concat([fake, real], 0))
            loss = self.loss_fn(tf.concat([tf.ones((size, 1)), tf.zeros((size, 1))], 0), scores)
        weights = self.discriminator.trainable_weights
        self.optimizer_of("d").apply_gradients(zip(tape.gradient(loss, weights), weights))
        with tf.GradientTape() as tape:
            fooled = self.loss_fn(
                tf.zeros((size, 1)), self.discriminator(self.generator(keras.random.normal((size, 3), seed=self.noise)))
            )
        weights = self.generator.trainable_weights
        self.optimizer_of("g").apply_gradients(zip(tape.gradient(fooled, weights), weights))
        return {"d_loss": loss}


def gan(style):
    keras.utils.set_random_seed(0)
    model = TwoOptimizerGAN(style)
    model.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3))
    return model


DATA = tf.data.Dataset.from_tensor_slices(np.random.default_rng(0).normal(size=(32, 6)).astype("float32")).batch(8)
PATHS = {
    "dict": ["optimizers['d']", "optimizers['g']"],
    "sub-models": ["discriminator.optimizer", "generator.optimizer"],
}


@pytest.mark.parametrize("style", PATHS)
def test_the_copy_starts_with_the_optimizer_state_the_users_model_has_and_trains_as_it(style, cpu_hardware):
    user = gan(style)
    assert [held.path for held in held_optimizers(user)] == PATHS[style]
    result = tfopt.apply(user, DATA, ["data_pipeline"], hardware=cpu_hardware, measure_speed=False)
    copy = result.model
    assert [int(copy.optimizer_of(part).iterations) for part in "dg"] == [0, 0]  # the first-batch check's step undone
    assert [int(user.optimizer_of(part).iterations) for part in "dg"] == [0, 0]
    trained = copy.fit(result.dataset, epochs=1, verbose=0).history["d_loss"]
    plain = gan(style)
    assert trained == plain.fit(DATA, epochs=1, verbose=0).history["d_loss"]
    for mine, theirs in zip(copy.weights, plain.weights):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("style", PATHS)
def test_grad_accum_names_the_optimizers_the_train_step_applies_instead(style, cpu_hardware):
    with pytest.raises(
        RecipeConfigError, match=rf"applies its optimizers {', '.join(PATHS[style])}".replace("[", r"\[")
    ):
        tfopt.apply(gan(style), DATA, [{"grad_accum": {"steps": 2}}], hardware=cpu_hardware, measure_speed=False)
