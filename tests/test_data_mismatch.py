"""Data that does not fit the model is said in its own terms: not batched, both shapes, the label and the classes."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tfopt.errors import DataError


def _classifier(features=8, classes=3):
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(classes, activation="softmax")])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy())
    return model


X = np.random.default_rng(0).random((64, 8)).astype("float32")
Y = np.arange(64) % 3


@pytest.mark.parametrize(
    "dataset, setting, words",
    [
        (
            tf.data.Dataset.from_tensor_slices((X, Y)),
            "batch_size",
            "The dataset is not batched: its inputs have shape (8,) per element, and the model's input takes "
            "batches of shape (None, 8). Add .batch(BATCH_SIZE)",
        ),
        (
            tf.data.Dataset.from_tensor_slices((X[:, :5], Y)).batch(8),
            "input_shape",
            "The dataset's inputs have shape (8, 5) per batch, and the model's input takes (None, 8)",
        ),
        (
            tf.data.Dataset.from_tensor_slices((X, np.arange(64) % 7)).batch(8),
            "classes",
            "The labels of the first batch hold 3, outside the model's 3 classes (0 to 2): 4 of 8 labels are.",
        ),
    ],
    ids=["unbatched", "feature_width", "labels_beyond_classes"],
)
def test_the_first_batch_that_does_not_fit_says_why(cpu_hardware, dataset, setting, words):
    with pytest.raises(DataError) as caught:
        tfopt.apply(_classifier(), dataset, recipes=[], hardware=cpu_hardware)
    assert str(caught.value).startswith(words) and caught.value.setting == setting
    assert "\x1b[" not in str(caught.value) and len(str(caught.value)) < 400


def test_a_model_of_two_inputs_names_the_one_that_does_not_fit(cpu_hardware):
    ids, amounts = keras.Input((4,), name="ids"), keras.Input((2,), name="amounts")
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Concatenate()([ids, amounts]))
    model = keras.Model([ids, amounts], outputs)
    model.compile("adam", "sparse_categorical_crossentropy")
    data = tf.data.Dataset.from_tensor_slices(((X[:, :4], X[:, :3]), Y)).batch(8)
    with pytest.raises(DataError, match=r"the model's input 'amounts' takes \(None, 2\)"):
        tfopt.apply(model, data, recipes=[], hardware=cpu_hardware)


def test_labels_beyond_classes_are_named_where_the_loss_is_nan_instead_of_an_error(cpu_hardware, monkeypatch):
    """A GPU's sparse cross-entropy kernel gives NaN for a label beyond the classes where a CPU's raises: faked
    here by the same kernel with the GPU's answer, so the CPU suite proves the GPU path."""
    kernel = tf.nn.sparse_softmax_cross_entropy_with_logits

    def as_on_a_gpu(labels, logits, name=None):
        classes = tf.shape(logits, out_type=labels.dtype)[-1]
        inside = (labels >= 0) & (labels < classes)
        losses = kernel(labels=tf.where(inside, labels, tf.zeros_like(labels)), logits=logits)
        return tf.where(inside, losses, tf.constant(float("nan"), losses.dtype))

    monkeypatch.setattr(tf.nn, "sparse_softmax_cross_entropy_with_logits", as_on_a_gpu)
    labels = np.arange(64) % 7
    with pytest.raises(DataError) as caught:
        tfopt.apply(
            _classifier(), tf.data.Dataset.from_tensor_slices((X, labels)).batch(8), recipes=[], hardware=cpu_hardware
        )
    assert str(caught.value).startswith("The labels of the first batch hold 3, outside the model's 3 classes")
    assert caught.value.setting == "classes"


def test_dict_elements_are_said_as_such_with_the_map_that_fixes_them(cpu_hardware):
    """A dataset of {"x": ..., "y": ...} dicts, as tfds and CSV readers make them: Keras takes each dict as the
    model's inputs, so the step fails on two tensors for one input. The message gives the fix with the
    user's keys, and the fixed pipeline trains."""
    dicts = tf.data.Dataset.from_tensor_slices({"x": X, "y": Y}).batch(8)
    with pytest.raises(DataError) as caught:
        tfopt.apply(_classifier(), dicts, recipes=[], hardware=cpu_hardware)
    assert str(caught.value) == (
        "The dataset's elements are dicts (keys ['x', 'y']), and Keras' fit reads a dict element as the model's "
        "inputs alone, with no labels. Make each element (inputs, labels): "
        "dataset.map(lambda d: (d['x'], d['y']))."
    )
    fixed = dicts.map(lambda d: (d["x"], d["y"]))
    assert tfopt.apply(_classifier(), fixed, recipes=[], hardware=cpu_hardware, measure_speed=False).model
