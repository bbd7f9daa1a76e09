"""Both rewrites over the `keras.applications` models that hold BatchNormalization layers: the rewritten copy
computes what the model computes, in training (batch statistics, moving statistics moved) and in inference,
from non-zero biases and moved statistics; every layer it could rewrite is rewritten or named with why."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.model_copy import copy_model
from tfopt.rewrites import rewrite

# (application, input size (the smallest it takes, where it has a minimum), convolution biases a normalization
# cancels: ResNet v1 writes one on each; the others write none, or theirs feed an add or an activation).
APPLICATIONS = [
    ("ResNet50", 64, 53),
    ("ResNet50V2", 64, 0),
    ("MobileNetV2", 64, 0),
    ("MobileNetV3Small", 64, 0),
    ("EfficientNetB0", 64, 0),
    ("DenseNet121", 64, 0),
    ("Xception", 71, 0),
    ("InceptionV3", 75, 0),
]


@pytest.mark.parametrize("name, size, folds", APPLICATIONS, ids=[name for name, _, _ in APPLICATIONS])
def test_a_rewritten_application_computes_what_it_computes(name, size, folds):
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(
        weights=None, input_shape=(size, size, 3), classes=3, classifier_activation=None
    )
    rng = np.random.default_rng(1)
    for layer in model._flatten_layers():  # a trained model's state: biases and statistics away from their start
        for variable in layer.weights:
            if variable.path.endswith(("bias", "moving_mean", "beta")):
                variable.assign(rng.normal(0, 0.1, variable.shape).astype("float32"))
            elif variable.path.endswith(("moving_variance", "gamma")):
                variable.assign(rng.uniform(0.5, 1.5, variable.shape).astype("float32"))
    rewritten = copy_model(model)
    made = rewrite(rewritten, ("batch_norm", "conv_bias"))
    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    fused, left = made["batch_norm"]
    assert len(fused) + len(left) == len(norms) and len(fused) == len(norms), left
    folded, kept = made["conv_bias"]
    assert len(folded) == folds and kept == []
    for convolution in folded:
        assert model.get_layer(convolution).bias.trainable and not rewritten.get_layer(convolution).bias.trainable
    x = tf.constant(rng.normal(0.5, 0.25, (8, size, size, 3)).astype("float32"))
    # How far the model itself moves for inputs a few float32 roundings away: deep networks in training mode
    # amplify rounding through their batch statistics (ResNet-50 here: 1e-6 on the inputs moves its logits by
    # 1e-3). A rewrite computing something else (the kernel's Bessel-corrected variance, a bias folded wrongly)
    # moves them by far more.
    probe = copy_model(model)
    nudged = x + tf.constant(rng.normal(0, 1e-6, x.shape).astype("float32"))
    for training in (False, True, True, False):  # inference, training moving the statistics twice, inference
        mine, theirs = rewritten(x, training=training), model(x, training=training)
        sensitivity = float(tf.reduce_max(tf.abs(probe(nudged, training=training) - probe(x, training=training))))
        scale = float(tf.reduce_max(tf.abs(theirs)))
        np.testing.assert_allclose(
            mine, theirs, atol=1e-5 * scale + 4 * sensitivity, err_msg=f"training={training}, {sensitivity=}"
        )
