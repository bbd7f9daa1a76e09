"""FusedBatchNormalization computes what Keras' BatchNormalization computes: outputs, gradients and moving
statistics, in every configuration it is allowed for, and the rest is left to Keras."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.rewrites import rewrite
from tfopt.rewrites.batch_norm import FusedBatchNormalization, fusable, fusable_batch_norms

SHAPES = [(16, 6), (8, 5, 6), (4, 3, 5, 6), (2, 3, 3, 2, 6)]  # dense, sequence, image, volume; 6 channels


def pair(shape=(None, 6), **config):
    """A Keras BatchNormalization and its fused twin, built alike and holding the same non-trivial state."""
    plain, fused = keras.layers.BatchNormalization(**config), FusedBatchNormalization(**config)
    rng = np.random.default_rng(1)
    for layer in (plain, fused):
        layer.build((None, *shape[1:]))
    values = [rng.normal(size=w.shape).astype("float32") for w in plain.weights]
    values = [np.abs(v) + 0.5 if w.path.endswith("moving_variance") else v for v, w in zip(values, plain.weights)]
    plain.set_weights(values)
    fused.set_weights(values)
    return plain, fused


def run(layer, x, training):
    """Outputs, gradients (inputs and trainable variables) of a weighted sum, and the state after the call."""
    x = tf.constant(x)
    weights = tf.constant(np.random.default_rng(2).normal(size=x.shape).astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * weights)
    grads = tape.gradient(loss, [x, *layer.trainable_weights])
    return y.numpy(), [g.numpy() for g in grads], [w.numpy() for w in layer.weights]


def assert_same(plain, fused, x, training, atol):
    for got, want in zip(run(fused, x, training), run(plain, x, training)):
        for a, b in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
            np.testing.assert_allclose(np.asarray(a, "float32"), np.asarray(b, "float32"), atol=atol, rtol=atol)


@pytest.mark.parametrize(
    "shape, center, scale, training",
    list(itertools.product(SHAPES, [True, False], [True, False], [True, False])),
)
def test_outputs_gradients_and_moving_statistics_are_keras_own(shape, center, scale, training):
    plain, fused = pair(shape, center=center, scale=scale, momentum=0.8, epsilon=1e-3)
    x = np.random.default_rng(0).normal(3.0, 2.0, size=shape).astype("float32")
    assert_same(plain, fused, x, training, atol=2e-5)
    assert_same(plain, fused, x * 0.5, training, atol=2e-5)  # the moving statistics moved alike the first time


def test_a_frozen_layer_runs_in_inference_mode_as_keras_does():
    plain, fused = pair()
    plain.trainable = fused.trainable = False
    x = np.random.default_rng(0).normal(size=(8, 6)).astype("float32")
    before = [w.numpy() for w in fused.weights]
    assert_same(plain, fused, x, training=True, atol=1e-5)
    for after, was in zip(fused.weights, before):
        np.testing.assert_array_equal(after.numpy(), was)


def test_one_value_per_channel_has_no_variance_as_in_keras():
    plain, fused = pair()
    assert_same(plain, fused, np.ones((1, 6), "float32"), training=True, atol=1e-6)


def test_a_mask_is_left_to_keras():
    plain, fused = pair((4, 5, 6))
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 5, 6)).astype("float32"))
    mask = tf.constant(np.random.default_rng(1).random((4, 5)) > 0.3)
    np.testing.assert_array_equal(plain(x, training=True, mask=mask), fused(x, training=True, mask=mask))
    for got, want in zip(fused.weights, plain.weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_under_bfloat16_and_xla_within_bfloat16s_precision():
    plain, fused = pair((8, 4, 4, 6), momentum=0.9, dtype="mixed_bfloat16")
    assert fused.compute_dtype == "bfloat16" and fused.moving_mean.dtype == "float32"
    x = np.random.default_rng(0).normal(1.0, 2.0, size=(8, 4, 4, 6)).astype("float32")
    compiled = [tf.function(layer.__call__, jit_compile=True) for layer in (plain, fused)]
    y_plain, y_fused = (step(tf.constant(x), training=True) for step in compiled)
    assert y_fused.dtype == tf.bfloat16
    np.testing.assert_allclose(np.asarray(y_fused, "float32"), np.asarray(y_plain, "float32"), atol=0.05)
    np.testing.assert_allclose(fused.moving_mean.numpy(), plain.moving_mean.numpy(), atol=1e-2)
    np.testing.assert_allclose(fused.moving_variance.numpy(), plain.moving_variance.numpy(), rtol=2e-2)


@pytest.mark.parametrize(
    "config, why",
    [
        ({"axis": 1}, "axis=1 is not the last (channels_first)"),
        ({"synchronized": True}, "synchronized=True"),
        ({"renorm": True}, "renorm=True"),
        ({"epsilon": 1e-6}, "epsilon=1e-06 is below the fused kernel's smallest, 1.001e-05"),
    ],
)
def test_what_the_kernel_computes_otherwise_is_not_rewritten(config, why):
    layer = keras.layers.BatchNormalization(**config)
    layer.build((None, 4, 4, 6))
    assert why in fusable(layer)


def test_a_subclass_keeps_its_own_code():
    class Mine(keras.layers.BatchNormalization):
        pass

    layer = Mine()
    layer.build((None, 6))
    assert fusable(layer) == "a subclass of BatchNormalization (Mine), whose own code stays"


def test_rewrite_changes_the_class_of_the_layers_in_place_nested_models_too():
    inner = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization()])
    inputs = keras.Input((8, 8, 3))
    x = inner(inputs)
    x = keras.layers.BatchNormalization(axis=1, name="channels_first")(x)
    outputs = keras.layers.Dense(2)(keras.layers.Flatten()(keras.layers.BatchNormalization(name="outer")(x)))
    model = keras.Model(inputs, outputs)
    weights = [w.numpy() for w in model.weights]
    bn = inner.layers[-1]
    assert fusable_batch_norms(model) == [bn.name, "outer"] and type(bn) is keras.layers.BatchNormalization  # asks
    ((rewritten, kept),) = rewrite(model, ("batch_norm",)).values()
    assert rewritten == [bn.name, "outer"] and type(bn) is FusedBatchNormalization
    assert kept == [
        "channels_first: axis=1 is not the last (channels_first): the fused kernel on CPU takes channels last"
    ]
    assert type(model.get_layer("channels_first")) is keras.layers.BatchNormalization
    for got, want in zip(model.weights, weights):
        np.testing.assert_array_equal(got.numpy(), want)
    assert rewrite(model, ("batch_norm",)) == {"batch_norm": ([], kept)}  # done once
    assert fusable_batch_norms(model) == []
    config = bn.get_config()
    assert config == keras.layers.BatchNormalization.from_config(config).get_config()


def test_float64_is_left_to_keras():
    plain, fused = pair(dtype="float64")
    x = np.random.default_rng(0).normal(size=(8, 6))
    np.testing.assert_array_equal(plain(x, training=True), fused(x, training=True))
    assert fused.moving_variance.dtype == "float64"


def test_weight_files_of_the_rewritten_copy_and_of_the_users_model_load_into_each_other(tmp_path):
    """Keras addresses a layer's variables in its files by the class name, which the rewrite keeps."""
    from tfopt.model_copy import copy_model

    inputs = keras.Input((4, 4, 3))
    model = keras.Model(inputs, keras.layers.BatchNormalization()(keras.layers.Conv2D(6, 3)(inputs)))
    for variable in model.weights:
        variable.assign(np.random.default_rng(0).uniform(0.5, 1.5, variable.shape).astype("float32"))
    rewritten = copy_model(model)
    rewrite(rewritten, ("batch_norm",))
    assert (
        type(rewritten.layers[2]).__name__ == "BatchNormalization"
        and type(rewritten.layers[2]) is FusedBatchNormalization
    )
    rewritten.save_weights(tmp_path / "rewritten.weights.h5")
    twin = copy_model(model)
    for variable in twin.weights:
        variable.assign(np.zeros(variable.shape, "float32"))
    twin.load_weights(tmp_path / "rewritten.weights.h5")
    for mine, theirs in zip(twin.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    # The saved file names Keras' own class, so it loads without tfopt: as Keras' BatchNormalization.
    config = keras.saving.serialize_keras_object(rewritten.layers[2])
    assert (config["module"], config["class_name"], config["registered_name"]) == (
        "keras.layers",
        "BatchNormalization",
        None,
    )
    rewritten.save(tmp_path / "rewritten.keras")
    loaded = keras.saving.load_model(tmp_path / "rewritten.keras")
    assert type(loaded.layers[2]) is keras.layers.BatchNormalization
    x = np.random.default_rng(1).normal(size=(2, 4, 4, 3)).astype("float32")
    np.testing.assert_allclose(loaded(x), model(x), atol=1e-5)
