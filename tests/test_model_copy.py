"""copy_model keeps what a config round trip loses: the class and its train_step, adapted lookups, custom
layers without get_config, and the weights; the user's model is never touched."""

import keras
import numpy as np
import pytest

from tests import keras_examples
from tfopt.model_copy import copy_keras_object, copy_model


def values(model):
    return [weight.copy() for weight in model.get_weights()]


def test_subclassed_model_with_its_own_train_step_keeps_its_class_weights_and_metrics():
    user, images = keras_examples.vae()
    before = values(user)
    twin = copy_model(user)
    assert type(twin) is keras_examples.VAE and not twin.compiled
    assert [metric.name for metric in twin.metrics] == ["total_loss", "kl_loss"]
    assert len(twin.weights) == len(user.weights) > 0
    assert all(a is not b for a, b in zip(twin.weights, user.weights))
    for mine, theirs in zip(twin.get_weights(), before):
        np.testing.assert_array_equal(mine, theirs)
    twin.compile(optimizer=keras.optimizers.Adam())
    history = twin.fit(images, epochs=1, verbose=0).history
    assert sorted(history) == ["kl_loss", "loss"]  # the user's train_step ran, with its own metrics
    assert any(not np.array_equal(a, b) for a, b in zip(twin.get_weights(), before))
    for mine, theirs in zip(user.get_weights(), before):  # the user's model did not move
        np.testing.assert_array_equal(mine, theirs)


def test_adapted_lookup_keeps_its_vocabulary_and_outputs():
    user, data = keras_examples.string_lookup_classifier()
    twin = copy_model(user)
    lookup = next(layer for layer in twin.layers if isinstance(layer, keras.layers.StringLookup))
    assert lookup.get_vocabulary() == user.layers[1].get_vocabulary() and len(lookup.get_vocabulary()) == 21
    words, _ = next(iter(data))
    np.testing.assert_array_equal(twin(words, training=False), user(words, training=False))


def test_custom_layer_without_get_config_and_unregistered_loss():
    user, data = keras_examples.transformer_classifier()
    twin = copy_model(user)
    assert type(twin.layers[1]) is keras_examples.TokenAndPositionEmbedding and twin.layers[1] is not user.layers[1]
    ids, _ = next(iter(data))
    np.testing.assert_array_equal(twin(ids, training=False), user(ids, training=False))


def test_unbuilt_sequential_copy_builds_on_its_first_call():
    user = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(3)])
    twin = copy_model(user)
    assert twin(np.zeros((2, 4, 1), "float32")).shape == (2, 3)
    assert not user.built and len(twin.weights) == 2


def test_copied_metric_has_its_own_state():
    metric = keras.metrics.Mean()
    metric.update_state([2.0, 4.0])
    twin = copy_keras_object(metric)
    twin.update_state([9.0])
    assert float(metric.result()) == pytest.approx(3.0) and float(twin.result()) == pytest.approx(5.0)
