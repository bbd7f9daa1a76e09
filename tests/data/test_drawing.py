"""Tests of tfopt.data.drawing: one shapes image per call, a pure function of the generator."""

from __future__ import annotations

import numpy as np
import pytest

from tfopt.data.drawing import DRAWABLE_SHAPES, draw_example, shape_id


@pytest.mark.parametrize("shape", DRAWABLE_SHAPES)
def test_draws_an_rgb_image_of_the_requested_size(shape):
    image = draw_example(np.random.default_rng(0), shape, 40)
    assert image.mode == "RGB" and image.size == (40, 40)


def test_same_generator_state_same_image_and_shapes_differ():
    images = {
        shape: np.asarray(draw_example(np.random.default_rng(7), shape, 32), np.int16) for shape in DRAWABLE_SHAPES
    }
    again = np.asarray(draw_example(np.random.default_rng(7), "ring", 32), np.int16)
    np.testing.assert_array_equal(images["ring"], again)
    # Same background (same seed), different shape: the pictures differ where the shapes differ.
    assert np.abs(images["ring"] - images["circle"]).max() > 50


def test_shape_ids_are_stable():
    assert [shape_id(shape) for shape in ("circle", "square", "triangle", "cross", "ring")] == [0, 1, 2, 3, 4]
