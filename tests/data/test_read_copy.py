"""tfopt reads a copy of a pipeline that reading moves on: the user's pipeline, and the one apply hands back,
start where they stood, as `fit(dataset)` would have started."""

import keras
import numpy as np
import tensorflow as tf

import tfopt
from tfopt.data.read_copy import copies_kept, copy_to_read


def epochs_of(dataset, count=2):
    return [[np.asarray(x).tolist() for x, _ in dataset] for _ in range(count)]


def shuffled(flip=None):
    """A seeded, reshuffling pipeline (with a seeded Keras random layer in a map, where given), made under the
    same global seed each time: a shuffle's seeds are drawn from it and its own."""
    keras.utils.set_random_seed(0)
    features = np.arange(48, dtype="float32").reshape(12, 2, 2, 1)
    data = tf.data.Dataset.from_tensor_slices((features, np.arange(12) % 2)).shuffle(12, seed=3)
    if flip is not None:
        data = data.map(lambda x, y: (flip(x), y))
    return data.batch(4)


def model():
    keras.utils.set_random_seed(0)
    made = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    made.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return made


def test_a_measured_apply_leaves_a_seeded_shuffle_where_fit_would_start_it():
    plain = epochs_of(shuffled())
    users = shuffled()
    tfopt.apply(model(), users, steps=2, warmup_steps=1)
    assert epochs_of(users) == plain  # not the third and fourth: the reads were the copy's
    # The pipeline handed back shares the shuffle's seeds with yours, as a rewrite of it: read alone, it starts
    # where yours stands.
    assert epochs_of(tfopt.apply(model(), shuffled(), steps=2, warmup_steps=1).dataset) == plain


def test_reading_a_rerandomizing_random_source_leaves_its_sequence_where_it_stood():
    """`Dataset.random(rerandomize_each_iteration=True)` holds a seed generator as a shuffle does: tfopt's own
    pipelines draw their augmentation's seeds from one."""

    def numbers():
        return tf.data.Dataset.random(seed=1, rerandomize_each_iteration=True).take(3)

    users = numbers()
    for _ in range(2):
        assert len(list(copy_to_read(users))) == 3
    fresh = numbers()
    assert [[int(value) for value in users] for _ in range(2)] == [[int(value) for value in fresh] for _ in range(2)]


def test_a_keras_random_layer_in_the_pipeline_draws_from_where_it_stood():
    def flip():
        return keras.layers.RandomFlip("horizontal", seed=1)

    plain = epochs_of(shuffled(flip()))
    layer = flip()
    state = np.asarray(layer.generator.state).copy()
    result = tfopt.apply(model(), shuffled(layer), recipes=["data_pipeline"], steps=2, warmup_steps=1)
    np.testing.assert_array_equal(layer.generator.state, state)
    assert epochs_of(result.dataset) == plain


def test_a_pipeline_reading_does_not_change_is_read_as_it_is_and_a_copy_is_kept_for_the_block():
    stateless = tf.data.Dataset.range(6).map(lambda i: i * 2).batch(3)
    assert copy_to_read(stateless) is stateless
    data = shuffled()
    with copies_kept():
        copy = copy_to_read(data)
        assert copy is not data and copy_to_read(data) is copy
        assert copy.element_spec == data.element_spec and int(copy.cardinality()) == int(data.cardinality())
        assert epochs_of(copy) == epochs_of(shuffled())  # its shuffle starts as a new one starts
    assert copy_to_read(data) is not copy


def test_a_pipeline_whose_graph_cannot_be_read_or_holds_an_untested_op_is_read_as_it_is():
    data = tf.data.Dataset.range(3).apply(tf.data.experimental.copy_to_device("/cpu:0"))
    assert copy_to_read(data) is data
    untested = tf.data.Dataset.range(4).shuffle(4, seed=1).map(lambda i: tf.reshape(i, [1])).sparse_batch(2, [1])
    assert copy_to_read(untested) is untested
