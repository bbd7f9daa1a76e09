"""Tests of tfopt.data.synthetic.SyntheticSource."""

from __future__ import annotations

import numpy as np
import pytest

from tfopt.data.synthetic import SyntheticSource
from tfopt.errors import DataError

from .helpers import assert_same_batches, collect


@pytest.mark.parametrize("kind", ["image", "tokens"])
def test_optimized_and_naive_yield_identical_elements(kind):
    source = SyntheticSource(kind, examples=30, image_size=8, sequence_length=12, vocab_size=100)
    assert_same_batches(
        collect(source.pipeline(batch_size=8, optimized=False, shuffle=False)),
        collect(source.pipeline(batch_size=8, optimized=True, shuffle=False)),
    )


def test_images_are_float_in_unit_range_with_balanced_labels():
    source = SyntheticSource("image", examples=40, num_classes=4, image_size=[12, 10], channels=3)
    ((x, y),) = collect(source.pipeline(batch_size=40, optimized=True, shuffle=False))
    assert x.dtype == np.float32 and x.shape == (40, 12, 10, 3)
    assert x.min() >= 0.0 and x.max() <= 1.0 and x.std() > 0.05
    assert y.dtype == np.int32 and np.bincount(y).tolist() == [10, 10, 10, 10]


def test_tokens_are_in_vocabulary_and_carry_class_keywords():
    source = SyntheticSource("tokens", examples=200, num_classes=2, vocab_size=50, sequence_length=16)
    x, y = source.arrays
    assert x.dtype == np.int32 and x.shape == (200, 16)
    assert x.min() >= 1 and x.max() < 50
    # The first token is always a keyword of the class, so a token->class table separates the classes.
    first_tokens = [set(x[y == label, 0]) for label in (0, 1)]
    assert not first_tokens[0] & first_tokens[1]


def test_same_seed_same_data_and_config_round_trips():
    source = SyntheticSource("image", examples=6, image_size=8, seed=3)
    clone = SyntheticSource(**source.get_config())
    np.testing.assert_array_equal(source.arrays[0], clone.arrays[0])
    assert not np.array_equal(source.arrays[0], SyntheticSource("image", examples=6, image_size=8, seed=4).arrays[0])
    assert "synthetic image: 6 8x8x3 images" in source.describe()


def test_images_are_learnable_by_a_linear_model_on_gradients():
    # The class is the grating's orientation: mean |dx| vs |dy| image gradients separate two classes.
    source = SyntheticSource("image", examples=100, num_classes=2, image_size=16, channels=1)
    x, y = source.arrays
    pixels = x[..., 0].astype(np.float32)
    horizontal = np.abs(np.diff(pixels, axis=2)).mean(axis=(1, 2))
    vertical = np.abs(np.diff(pixels, axis=1)).mean(axis=(1, 2))
    predicted = (vertical > horizontal).astype(np.int32)
    accuracy = max((predicted == y).mean(), (predicted != y).mean())
    assert accuracy > 0.9


@pytest.mark.parametrize(
    "kwargs, message, setting",
    [
        ({"kind": "audio"}, "kind='audio'", "kind"),
        ({"examples": 0}, "examples=0", "examples"),
        ({"num_classes": 1}, "num_classes=1", "num_classes"),
        ({"kind": "tokens", "vocab_size": 10}, "vocab_size=10", "vocab_size"),
        ({"image_size": [8, 0]}, "image_size=", "image_size"),
    ],
)
def test_bad_arguments(kwargs, message, setting):
    with pytest.raises(DataError, match=message) as error:
        SyntheticSource(**kwargs)
    assert error.value.setting == setting
