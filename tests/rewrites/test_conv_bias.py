"""A convolution's bias folded into the BatchNormalization after it: the same outputs in training and in
inference, the same moving statistics (shifted by the bias), the same learning; and left alone wherever the
bias does not cancel."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.rewrites.conv_bias import fold_conv_biases


def model_and_copy(convolution=None, **normalization):
    """A Conv -> BatchNormalization -> ReLU -> Dense model with a non-zero bias and moved statistics, and a copy."""

    def make():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6, 6, 3))
        conv = convolution() if convolution else keras.layers.Conv2D(4, 3, name="conv")
        x = keras.layers.BatchNormalization(momentum=0.8, name="bn", **normalization)(conv(inputs))
        outputs = keras.layers.Dense(2)(keras.layers.Flatten()(keras.layers.ReLU()(x)))
        return keras.Model(inputs, outputs)

    model, copy = make(), make()
    rng = np.random.default_rng(1)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.weights])
    bn = model.get_layer("bn")
    bn.moving_variance.assign(np.abs(bn.moving_variance.numpy()) + 0.5)
    copy.set_weights(model.get_weights())
    return model, copy


def images(seed=2):
    return tf.constant(np.random.default_rng(seed).normal(size=(8, 6, 6, 3)).astype("float32"))


@pytest.mark.parametrize(
    "convolution",
    [
        None,
        lambda: keras.layers.SeparableConv2D(4, 3, name="conv"),
        lambda: keras.layers.DepthwiseConv2D(3, name="conv", depth_multiplier=2),
    ],
    ids=["Conv2D", "SeparableConv2D", "DepthwiseConv2D"],
)
def test_outputs_and_moving_statistics_are_the_same_with_the_bias_folded(convolution):
    model, folded = model_and_copy(convolution)
    bias = model.get_layer("conv").bias.numpy()
    assert np.abs(bias).min() > 0
    assert fold_conv_biases(folded) == (["conv"], [])
    conv = folded.get_layer("conv")
    assert conv.get_config() == model.get_layer("conv").get_config() and len(folded.weights) == len(model.weights)
    assert not conv.bias.trainable and not np.any(conv.bias.numpy())  # zero, and no gradient computed for it
    assert len(folded.trainable_weights) == len(model.trainable_weights) - 1
    for training in (False, True, True, False):  # inference, two training calls moving the statistics, inference
        x = images(seed=int(training) + 2)
        np.testing.assert_allclose(folded(x, training=training), model(x, training=training), atol=2e-5)
        np.testing.assert_allclose(
            folded.get_layer("bn").moving_mean.numpy(), model.get_layer("bn").moving_mean.numpy() - bias, atol=2e-5
        )


def test_the_same_learning_with_the_bias_folded():
    model, folded = model_and_copy()
    fold_conv_biases(folded)
    x, y = images(), tf.constant(np.random.default_rng(3).normal(size=(8, 2)).astype("float32"))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    losses = []
    for each in (model, folded):
        each.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
        losses.append(each.fit(data, epochs=5, verbose=0, shuffle=False).history["loss"])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)
    np.testing.assert_allclose(folded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-4, atol=1e-5)


def test_a_folded_model_saves_and_its_weights_load_into_the_users_model(tmp_path):
    model, folded = model_and_copy()
    fold_conv_biases(folded)
    folded.save(tmp_path / "folded.keras")
    loaded = keras.saving.load_model(tmp_path / "folded.keras")
    np.testing.assert_allclose(loaded(images()), folded(images()), atol=1e-6)
    folded.save_weights(tmp_path / "folded.weights.h5")
    expected = model(images(), training=False)
    model.load_weights(tmp_path / "folded.weights.h5")  # the user's own architecture, bias and all
    np.testing.assert_allclose(model(images(), training=False), expected, atol=2e-5)


def test_a_trained_folded_copy_reloads_with_its_optimizers_state(tmp_path):
    """A variable's `trainable` is not saved: reloaded (without tfopt) the bias trains again, and Keras kept none
    of a saved optimizer's state whose variables differed in number from the reloaded model's."""
    _, folded = model_and_copy()
    folded.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    fold_conv_biases(folded)
    data = tf.data.Dataset.from_tensor_slices((images(), tf.ones((8, 2)))).batch(4)
    folded.fit(data, epochs=2, verbose=0)
    assert (
        not folded.get_layer("conv").bias.trainable and float(tf.reduce_sum(tf.abs(folded.get_layer("conv").bias))) == 0
    )
    folded.save(tmp_path / "trained.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns where it skips the optimizer's state
        loaded = keras.saving.load_model(tmp_path / "trained.keras")
    assert int(loaded.optimizer.iterations) == 4 and loaded.get_layer("conv").bias.trainable
    for mine, theirs in zip(loaded.optimizer.variables, folded.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))


@pytest.mark.parametrize(
    "convolution, normalization, why",
    [
        (lambda: keras.layers.Conv2D(4, 3, activation="relu", name="conv"), {}, "its activation (relu) comes between"),
        (
            lambda: keras.layers.Conv2D(4, 3, bias_regularizer="l2", name="conv"),
            {},
            "its bias has a regularizer or a constraint",
        ),
        (None, {"axis": 1}, "bn normalizes over axis 1, not its channels"),
    ],
)
def test_where_the_bias_does_not_cancel_it_stays(convolution, normalization, why):
    _, copy = model_and_copy(convolution, **normalization)
    folded, kept = fold_conv_biases(copy)
    assert folded == [] and len(kept) == 1 and kept[0].startswith("conv: ") and why in kept[0]
    assert copy.get_layer("conv").bias.trainable


def test_weight_decay_would_move_a_non_zero_bias():
    _, copy = model_and_copy()
    copy.compile(optimizer=keras.optimizers.SGD(weight_decay=0.01), loss="mse")
    assert fold_conv_biases(copy) == ([], ["conv: the optimizer's weight decay (0.01) would move its non-zero bias"])
    copy.get_layer("conv").bias.assign(np.zeros(4, "float32"))  # zero stays zero under decay
    assert fold_conv_biases(copy) == (["conv"], [])


def test_under_an_optimizer_scaling_its_updates_plain_keras_trains_the_cancelled_bias_so_it_stays():
    """Its gradient is zero up to float rounding, which Adam scales to steps of the order of its learning rate."""
    model, copy = model_and_copy()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    before = model.get_layer("conv").bias.numpy()
    model.fit(images(), np.random.default_rng(3).normal(size=(8, 2)).astype("float32"), epochs=4, verbose=0)
    assert np.abs(model.get_layer("conv").bias.numpy() - before).max() > 1e-4
    copy.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    folded, kept = fold_conv_biases(copy)
    assert folded == [] and kept == [
        "1 convolution(s): the optimizer (Adam) scales each update to the gradient's running size, so the rounding "
        "noise of the bias's zero gradient trains it in plain Keras (folded only under SGD)"
    ]


def test_a_frozen_normalization_keeps_the_bias():
    _, copy = model_and_copy()
    copy.get_layer("bn").trainable = False
    assert "a frozen layer" in fold_conv_biases(copy)[1][0]


def test_a_convolution_feeding_more_than_the_normalization_keeps_its_bias():
    inputs = keras.Input((6, 6, 3))
    features = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = keras.layers.add([keras.layers.BatchNormalization()(features), features])
    model = keras.Model(inputs, x)
    assert fold_conv_biases(model) == ([], ["conv: its output is used elsewhere too, or it is called more than once"])


def test_an_optimizer_holding_the_bias_state_keeps_it():
    model, _ = model_and_copy()
    model.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
    model.fit(images(), np.zeros((8, 2), "float32"), verbose=0)
    assert fold_conv_biases(model) == ([], ["conv: the optimizer already keeps state for its bias"])


def test_a_subclass_of_a_convolution_is_its_own():
    class MyConv(keras.layers.Conv2D):
        pass

    _, copy = model_and_copy(lambda: MyConv(4, 3, name="conv"))
    assert fold_conv_biases(copy) == ([], [])


class InferenceModeStep(keras.Model):
    """A train_step of its own that calls the model in inference mode: the normalization then runs on its moving
    statistics, where the bias does not cancel and plain Keras trains it."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x, y, self(x, training=False))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


def test_a_model_training_in_a_train_step_of_its_own_keeps_the_bias():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3, name="conv")(inputs))
    model = InferenceModeStep(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(x)))
    (kept,) = fold_conv_biases(model)[1]
    assert kept.startswith("conv: the model trains in a train_step of its own, which may call it in inference mode")
    assert model.get_layer("conv").bias.trainable


class FrozenBlockCall(keras.Model):
    """Fine-tuning with a block's normalization on its moving statistics: its own call() runs the block with
    training=False, where the bias does not cancel (plain Keras trains it)."""

    def __init__(self):
        super().__init__()
        self.block = keras.Sequential(
            [keras.Input((6, 6, 3)), keras.layers.Conv2D(4, 3, name="conv"), keras.layers.BatchNormalization()]
        )
        self.head = keras.layers.Dense(2)

    def call(self, inputs, training=None):
        return self.head(keras.layers.Flatten()(self.block(inputs, training=False)))


def test_a_graph_called_by_a_call_of_the_models_own_keeps_the_bias():
    keras.utils.set_random_seed(0)
    model = FrozenBlockCall()
    model(images())
    (kept,) = fold_conv_biases(model)[1]
    assert kept.startswith("conv: a call() of yours runs it (the model's or a nested block's), which may call it")
    assert model.block.get_layer("conv").bias.trainable
    # The same block in a graph of Keras' own is folded: there fit's flag reaches the normalization.
    inputs = keras.Input((6, 6, 3))
    block = keras.Sequential(
        [keras.Input((6, 6, 3)), keras.layers.Conv2D(4, 3, name="conv"), keras.layers.BatchNormalization()]
    )
    graph = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(block(inputs))))
    assert fold_conv_biases(graph) == (["conv"], [])
