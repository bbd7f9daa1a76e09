"""tfopt.data.image_files: a cut-short or foreign image file is found from its bytes, and named."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfopt.data import generate_shapes
from tfopt.data.image_files import damaged, problem


def _encoded(kind: str) -> bytes:
    pixels = tf.constant(np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8))
    return (tf.io.encode_jpeg(pixels) if kind == "jpeg" else tf.io.encode_png(pixels)).numpy()


@pytest.mark.parametrize("kind, words", [("jpeg", "a JPEG cut short"), ("png", "a PNG cut short")])
def test_whole_images_pass_and_cut_ones_are_named_as_tensorflow_fails_them(kind, words):
    whole = _encoded(kind)
    assert problem(whole) is None and problem(whole + b"\x00" * 64) is None  # padding after the end is allowed
    tf.io.decode_image(whole)
    for cut in (len(whole) - 2, len(whole) // 2):
        assert problem(whole[:cut]).startswith(words)
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.io.decode_image(whole[:cut])  # what training would meet mid-epoch


def test_empty_foreign_and_short_bmp_files():
    assert problem(b"") == "an empty file"
    assert problem(b"<html>") == "not a JPEG, PNG, GIF or BMP file (it starts with b'<html>')"
    assert problem(b"BM" + (100).to_bytes(4, "little") + b"\x00" * 20) == "a BMP cut short (26 of its 100 bytes)"
    assert problem(b"GIF89a" + b"\x00" * 10 + b";") is None and problem(b"GIF89a" + b"\x01" * 10).startswith("a GIF")


def test_damaged_lists_only_the_broken_files_of_a_folder(tmp_path):
    folder = generate_shapes(tmp_path / "shapes", images_per_class=3, image_size=32)
    files = sorted(folder.rglob("*.jpg"))
    files[4].write_bytes(files[4].read_bytes()[:-100])
    assert damaged(files) == [(str(files[4]), "a JPEG cut short (no end marker after its last scan)")]
