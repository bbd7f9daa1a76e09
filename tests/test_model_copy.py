"""copy_model keeps what a config round trip loses: the class and its train_step, adapted lookups, custom
layers without get_config, and the weights; the user's model is never touched."""

import enum
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import keras_examples
from tfopt.errors import IncompatibleModelError
from tfopt.model_copy import copy_keras_object, copy_model


def values(model):
    return [weight.copy() for weight in model.get_weights()]


def test_subclassed_model_with_its_own_train_step_keeps_its_class_weights_and_metrics():
    user, images = keras_examples.vae()
    before = values(user)
    twin = copy_model(user)
    assert type(twin) is keras_examples.VAE and twin.compiled  # what compile() made comes along, copied
    assert type(twin.optimizer) is type(user.optimizer) and twin.optimizer is not user.optimizer
    assert [metric.name for metric in twin.metrics] == ["total_loss", "kl_loss"]
    assert len(twin.weights) == len(user.weights) > 0
    assert all(a is not b for a, b in zip(twin.weights, user.weights))
    for mine, theirs in zip(twin.get_weights(), before):
        np.testing.assert_array_equal(mine, theirs)
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


# The override shapes users write, and what Python's copy protocol says of the objects a model holds.


class Scaled(keras.layers.Layer):
    """Holds a bound method of its own and a helper object: both as users write them."""

    def __init__(self, helper=None, **kwargs):
        super().__init__(**kwargs)
        self.scale = keras.Variable(2.0, trainable=False)
        self.transform = self.times_scale  # a method bound to this layer, kept as an attribute
        self.helper = helper

    def times_scale(self, inputs):
        return inputs * self.scale

    def call(self, inputs):
        return self.transform(inputs)


def test_a_lambda_closure_over_a_layer_calls_the_copy_of_that_layer():
    dense = keras.layers.Dense(2)
    inputs = keras.Input((3,))
    outputs = keras.layers.Lambda(lambda tensor: dense(tensor) * 2.0)(inputs)
    user = keras.Model(inputs, outputs)
    twin = copy_model(user)
    held = twin.layers[1].function.__closure__[0].cell_contents
    assert type(held) is keras.layers.Dense and held is not dense
    x = np.ones((2, 3), "float32")
    np.testing.assert_array_equal(twin(x), user(x))
    held.kernel.assign(held.kernel * 0.0)  # the copy's layer moves, the user's does not
    assert np.all(twin(x).numpy() == 0.0) and np.any(user(x).numpy() != 0.0)


def test_a_method_bound_to_a_layer_is_bound_to_its_copy():
    inputs = keras.Input((3,))
    user = keras.Model(inputs, Scaled(name="scaled")(inputs))
    twin = copy_model(user)
    layer = twin.get_layer("scaled")
    assert layer.transform.__self__ is layer and layer.transform.__func__ is Scaled.times_scale
    layer.scale.assign(5.0)
    np.testing.assert_array_equal(twin(np.ones((1, 3), "float32")), [[5.0, 5.0, 5.0]])
    np.testing.assert_array_equal(user(np.ones((1, 3), "float32")), [[2.0, 2.0, 2.0]])


class SharedTokenizer:
    """A helper the user wants shared: its __deepcopy__ says so."""

    def __deepcopy__(self, memo):
        return self


class Mode(enum.Enum):
    FAST = 1


class Slotted:
    __slots__ = ("mode", "scale")

    def __init__(self):
        self.mode = Mode.FAST
        self.scale = [1.0, 2.0]


def test_objects_follow_their_copy_protocol_shared_enums_and_slots():
    inputs = keras.Input((3,))
    helper = SharedTokenizer()
    user = keras.Model(inputs, Scaled(helper=helper, name="scaled")(inputs))
    user.settings = Slotted()
    twin = copy_model(user)
    assert twin.get_layer("scaled").helper is helper  # its __deepcopy__ returns itself
    assert twin.settings is not user.settings and twin.settings.mode is Mode.FAST
    assert twin.settings.scale == [1.0, 2.0] and twin.settings.scale is not user.settings.scale


def test_what_cannot_be_copied_is_named_by_its_attribute_path():
    inputs = keras.Input((3,))
    user = keras.Model(inputs, Scaled(name="scaled")(inputs), name="locked")
    user.get_layer("scaled").guards = {"writer": threading.Lock()}
    with pytest.raises(IncompatibleModelError) as caught:
        copy_model(user)
    message = str(caught.value)
    assert "model 'locked'._layers[1].guards['writer']" in message and "cannot pickle '_thread.lock'" in message
    assert "__deepcopy__" in message and "model_fn=" in message


class KerasInternal:
    """Stands in for an object of Keras' own that the copy fails on."""

    __module__ = "keras.src.utils.stand_in"

    def __deepcopy__(self, memo):
        raise AttributeError("'Tracker' object has no attribute 'config'")


def test_a_keras_object_the_copy_fails_on_is_called_tfopts_bug_not_yours():
    inputs = keras.Input((3,))
    user = keras.Model(inputs, Scaled(name="scaled")(inputs), name="internal")
    user.get_layer("scaled").state = [KerasInternal()]
    with pytest.raises(IncompatibleModelError) as caught:
        copy_model(user)
    message = str(caught.value)
    assert "model 'internal'._layers[1].state[0] (in it) cannot be copied (AttributeError" in message
    assert "Keras' or TensorFlow's own KerasInternal" in message and "a bug in tfopt" in message
    assert "__deepcopy__" not in message and "model_fn=" in message


def test_a_trained_optimizer_is_copied_with_its_state_and_follows_the_copied_variables():
    user, images = keras_examples.vae()
    user.fit(images, epochs=1, verbose=0)
    twin = copy_model(user)
    assert int(twin.optimizer.iterations) == int(user.optimizer.iterations) == 4
    for mine, theirs in zip(twin.optimizer.variables, user.optimizer.variables):
        assert mine is not theirs
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    history = twin.fit(images, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0]) and int(twin.optimizer.iterations) == 8
    assert int(user.optimizer.iterations) == 4


def test_adapted_normalization_and_seed_generators_keep_their_state_in_new_variables():
    normalization = keras.layers.Normalization()
    normalization.adapt(np.arange(12, dtype="float32").reshape(4, 3))
    inputs = keras.Input((3,))
    user = keras.Model(inputs, keras.layers.Dropout(0.5, seed=3)(normalization(inputs)))
    twin = copy_model(user)
    np.testing.assert_array_equal(twin.layers[1].mean, normalization.mean)  # a tensor: shared, immutable
    assert twin.layers[1].adapt_mean is not normalization.adapt_mean  # the adapted state: a new variable
    np.testing.assert_array_equal(twin.layers[1].adapt_mean.numpy(), normalization.adapt_mean.numpy())
    mine, theirs = twin.layers[2].seed_generator.state, user.layers[2].seed_generator.state
    assert mine is not theirs and np.array_equal(mine.numpy(), theirs.numpy())
    x = np.ones((4, 3), "float32")
    np.testing.assert_array_equal(twin(x, training=True), user(x, training=True))  # the same draws


def test_a_stateful_rnn_keeps_its_states_in_new_variables():
    inputs = keras.Input(batch_shape=(2, 4, 3))
    user = keras.Model(inputs, keras.layers.LSTM(2, stateful=True)(inputs))
    x = np.ones((2, 4, 3), "float32")
    user(x)  # the states now hold the end of this sequence
    twin = copy_model(user)
    for mine, theirs in zip(twin.layers[1].states, user.layers[1].states):
        assert mine is not theirs
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    np.testing.assert_array_equal(twin(x), user(x))


class Doubled(keras.Model):
    """Its own test_step and predict_step."""

    def test_step(self, data):
        logs = super().test_step(data)
        return {**logs, "twice": logs["loss"] * 2.0}

    def predict_step(self, data):
        return super().predict_step(data) * 2.0


def test_test_and_predict_steps_and_a_model_checkpoint_work_on_the_copy(tmp_path):
    inputs = keras.Input((3,))
    user = Doubled(inputs, keras.layers.Dense(1)(inputs))
    user.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((4, 3), "float32"), np.ones((4, 1), "float32")
    twin = copy_model(user)
    np.testing.assert_allclose(twin.predict(x, verbose=0), 2.0 * user(x).numpy(), rtol=1e-6)
    logs = twin.evaluate(x, y, verbose=0, return_dict=True)
    assert logs["twice"] == pytest.approx(2.0 * logs["loss"])
    twin.fit(x, y, epochs=1, verbose=0, callbacks=[keras.callbacks.ModelCheckpoint(tmp_path / "best.keras")])
    loaded = keras.saving.load_model(tmp_path / "best.keras", custom_objects={"Doubled": Doubled})
    assert type(loaded) is Doubled
    np.testing.assert_allclose(loaded(x), twin(x), rtol=1e-6)


class Stepper(keras.Model):
    """Keeps a tf.function of its own method, as users write `self.generate = tf.function(self._generate)`."""

    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(1, kernel_initializer="ones")
        self.inner = inner
        self.fast_call = tf.function(self.slow_call, reduce_retracing=True)
        self.doubled = tf.function(lambda tensor: 2.0 * tensor)  # reaches no layer: shared

    def slow_call(self, inputs):
        return self.dense(inputs)

    def call(self, inputs):
        return self.dense(inputs)


def test_traced_functions_and_tf_functions_of_methods_belong_to_the_copy():
    x = np.ones((2, 3), "float32")
    inner_inputs = keras.Input((3,))
    inner = keras.Model(inner_inputs, keras.layers.Dense(1)(inner_inputs))
    inner.predict(x, verbose=0)  # a sub-model with a traced predict function of its own
    user = Stepper(inner)
    user(x)
    twin = copy_model(user)
    assert twin.fast_call is not user.fast_call and twin.inner.predict_function is None
    assert twin.doubled is user.doubled
    twin.dense.kernel.assign(2.0 * twin.dense.kernel)
    np.testing.assert_array_equal(twin.fast_call(x), [[6.0], [6.0]])  # the copy's own weights
    np.testing.assert_array_equal(user.fast_call(x), [[3.0], [3.0]])


def test_a_closure_over_a_list_of_layers_calls_the_copies_and_trackers_know_their_copies():
    blocks = [keras.layers.Dense(3), keras.layers.Dense(3)]

    def stacked(tensor):
        for block in blocks:
            tensor = block(tensor)
        return tensor

    inputs = keras.Input((3,))
    user = keras.Model(inputs, keras.layers.Lambda(stacked)(inputs))
    twin = copy_model(user)
    held = twin.layers[1].function.__closure__[0].cell_contents
    assert [type(block) for block in held] == [keras.layers.Dense] * 2 and held[0] is not blocks[0]
    stored = held[0]._tracker.stored_ids["trainable_variables"]
    assert stored == {id(held[0].kernel), id(held[0].bias)}  # the copy's tracker knows the copy's variables
    x = np.ones((1, 3), "float32")
    np.testing.assert_allclose(twin(x), user(x), rtol=1e-6)


class FeedForwardBlock(keras.layers.Layer):
    """keras-io's TransformerBlock shape: a layer whose __init__ makes a Sequential (its feed-forward part)."""

    def __init__(self):
        super().__init__()
        self.ffn = keras.Sequential([keras.layers.Dense(6, activation="relu"), keras.layers.Dense(4)])

    def call(self, x):
        return x + self.ffn(x)


class BlockStack(keras.Model):
    """A model subclass holding its blocks in a list and a dict, one of them a Sequential."""

    def __init__(self):
        super().__init__()
        self.blocks = [keras.Sequential([keras.layers.Dense(4)]), FeedForwardBlock()]
        self.heads = {"out": keras.layers.Dense(1)}

    def call(self, x):
        for block in self.blocks:
            x = block(x)
        return self.heads["out"](x)


def _inside_functional(inner):
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(1)(inner(inputs)))


NESTINGS = {
    "a layer holding a Sequential": lambda: _inside_functional(FeedForwardBlock()),
    "a Sequential in a functional model": lambda: _inside_functional(
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(4)])
    ),
    "a Sequential without Input in a functional model": lambda: _inside_functional(
        keras.Sequential([keras.layers.Dense(6), keras.layers.Dense(4)])
    ),
    "a Sequential in a Sequential": lambda: keras.Sequential(
        [keras.Input((4,)), keras.Sequential([keras.Input((4,)), keras.layers.Dense(6)]), keras.layers.Dense(1)]
    ),
    "a functional model in a functional model": lambda: _inside_functional(
        _inside_functional(keras.Sequential([keras.layers.Dense(4)]))
    ),
    "a model subclass holding blocks in a list and a dict": BlockStack,
}


@pytest.mark.parametrize("compiled", [False, True], ids=["uncompiled", "compiled"])
@pytest.mark.parametrize("make", NESTINGS.values(), ids=list(NESTINGS))
def test_nested_models_copy_with_trackers_of_their_own_and_train_as_the_original(make, compiled):
    """Keras' compile() keys a dict by every nested layer, which reaches nested layers before their trackers:
    TensorFlow's tracking wrappers, copying themselves, set attributes on layers whose trackers must be
    copied already (a compiled model holding a Sequential could not be copied before)."""
    keras.utils.set_random_seed(0)
    user = make()
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    user(x)
    if compiled:
        user.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    twin = copy_model(user)
    originals, copies = user._flatten_layers(include_self=False), twin._flatten_layers(include_self=False)
    assert [type(layer) for layer in copies] == [type(layer) for layer in originals]
    assert not {id(layer) for layer in copies} & {id(layer) for layer in originals}
    assert len(twin.weights) == len(user.weights) and not {id(w) for w in twin.weights} & {id(w) for w in user.weights}
    for layer in copies:  # each tracker holds its own layer's variables, once
        stored = layer._tracker.stored_ids["trainable_variables"]
        assert stored == {id(variable) for variable in layer._trainable_variables}, layer.name
        assert len(layer._trainable_variables) == len(stored), layer.name
    np.testing.assert_allclose(twin(x), user(x), rtol=1e-6)
    if compiled:
        before = values(user)
        theirs = user.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history["loss"]
        mine = twin.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history["loss"]
        np.testing.assert_allclose(mine, theirs, rtol=1e-6)
        for a, b in zip(twin.get_weights(), user.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert any(not np.array_equal(a, b) for a, b in zip(before, user.get_weights()))  # it did train


def test_a_base_frozen_when_copied_trains_once_unfrozen_as_the_users_does():
    """keras.io's fine-tuning: freeze the base (a flag only: its variables stay trainable to TensorFlow), train the
    head, unfreeze, recompile, train. A copy made while frozen must learn in its base then too."""
    keras.utils.set_random_seed(0)
    base = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="base_dense")], name="base")
    model = keras.Sequential([base, keras.layers.Dense(1)])
    base.trainable = False
    copy = copy_model(model)
    data = (np.ones((8, 4), "float32"), np.ones((8, 1), "float32"))
    moved = []
    for each in (model, copy):
        each.layers[0].trainable = True
        each.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        before = each.layers[0].layers[0].kernel.numpy()
        each.fit(*data, epochs=1, batch_size=8, verbose=0)
        moved.append(np.abs(each.layers[0].layers[0].kernel.numpy() - before).max())
    assert moved[0] > 0 and moved[1] == pytest.approx(moved[0])


def test_the_variables_an_optimizer_excludes_from_weight_decay_are_excluded_as_their_copies():
    """Keras keeps them as keys of the original variables: the copy's own decayed."""
    keras.utils.set_random_seed(0)
    user = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.9)
    optimizer.exclude_from_weight_decay(var_list=user.layers[0].weights)
    user.compile(optimizer=optimizer, loss="mse")
    twin = copy_model(user)
    x, y = np.ones((4, 3), "float32"), np.zeros((4, 1), "float32")
    twin.fit(x, y, epochs=2, verbose=0)
    user.fit(x, y, epochs=2, verbose=0)
    for mine, theirs in zip(values(twin), values(user), strict=True):
        np.testing.assert_array_equal(mine, theirs)
