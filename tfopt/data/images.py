"""Image stages shared by the image sources: decode encoded bytes, convert to float, augment.

Decoded images stay uint8 through the cache and the augmentation: a cached uint8 image takes a quarter
of the memory of its float32 form, so four times more datasets fit the cache budget, and augmentation
copies a quarter of the bytes. Conversion to float32 in [0, 1] is the last, `finish` stage,
element-wise so the optimized pipeline runs it once per batch.

Augmentation works on batches and uses only stateless random ops driven by an explicit seed, so the
naive and optimized pipelines, fed the same seeds, produce identical augmented images (see
`tfopt.data.pipeline`).
"""

from __future__ import annotations

import tensorflow as tf


def decode_image(encoded: tf.Tensor, image_size: tuple[int, int] | None, channels: int = 3) -> tf.Tensor:
    """Decodes JPEG/PNG/BMP/GIF bytes to a uint8 `[height, width, channels]` image, resized if asked.

    Args:
        encoded: A scalar string tensor holding the encoded file.
        image_size: `(height, width)` to resize to, or None to keep the decoded size (then every image
            of the dataset must have the same size for batching).
        channels: 3 for RGB, 1 for grayscale; files with another channel count are converted.

    Returns:
        The uint8 image tensor with a static shape when `image_size` is given.
    """

    # expand_animations=False makes GIFs decode to one 3-D frame, so every format yields the same rank.
    def decoded(into: int) -> tf.Tensor:
        return tf.io.decode_image(encoded, channels=into, expand_animations=False)

    if channels == 1:  # BMP's and GIF's decoders take no channels=1: decoded in RGB and converted as TF converts
        bmp_or_gif = tf.logical_or(
            tf.equal(tf.strings.substr(encoded, 0, 2), b"BM"), tf.equal(tf.strings.substr(encoded, 0, 3), b"GIF")
        )
        image = tf.cond(bmp_or_gif, lambda: tf.image.rgb_to_grayscale(decoded(3)), lambda: decoded(1))
    else:
        image = decoded(channels)
    if image_size is None:
        return image
    return resize_uint8(image, image_size, channels)


def resize_uint8(image: tf.Tensor, image_size: tuple[int, int], channels: int) -> tf.Tensor:
    """Resizes a uint8 image to `image_size`, skipping the work when it already has that size."""
    height, width = image_size

    def resize():
        resized = tf.image.resize(image, (height, width), method="bilinear", antialias=True)
        return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)

    shape = tf.shape(image)
    same = tf.logical_and(tf.equal(shape[0], height), tf.equal(shape[1], width))
    image = tf.cond(same, lambda: image, resize)
    return tf.ensure_shape(image, (height, width, channels))


def to_unit_float(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Converts uint8 pixels to float32 in [0, 1]; element-wise, so valid on one image or a batch."""
    return tf.cast(x, tf.float32) * (1.0 / 255.0), y


def random_augment(x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Random horizontal flip, translation and brightness shift of each image of a uint8 batch.

    It works on whole batches so that the optimized pipeline can compile it with XLA into one pass over
    the batch: applied image by image in a tf.data map, the same work is a dozen small ops per image, each a
    copy (docs/recipes/data_pipeline.md has the cost of both). Everything is integer arithmetic, so XLA
    and plain TensorFlow give identical pixels.

    Each image is mirrored with probability 1/2, moved by up to 1/8 of its size in each direction with
    the uncovered border black (the classic pad-and-crop of the CIFAR/ResNet recipe), and brightened or
    darkened by up to 25 of 255 levels, saturating.

    Args:
        x: A uint8 `[batch, height, width, channels]` batch with static height, width and channels.
        y: The labels, passed through.
        seed: An int64 `[2]` tensor; the same seed gives the same augmentation of the same batch.

    Returns:
        The augmented uint8 batch (same shape) and the labels.
    """
    height, width = x.shape[1], x.shape[2]
    count = tf.shape(x)[0]
    max_shift = max(1, min(height, width) // 8)
    draws = tf.random.stateless_uniform([4, count], seed, minval=0, maxval=2**31 - 1, dtype=tf.int32)
    flip = draws[0] % 2 == 1
    shift_rows = draws[1] % (2 * max_shift + 1) - max_shift
    shift_columns = draws[2] % (2 * max_shift + 1) - max_shift
    brightness = draws[3] % 51 - 25
    # Output pixel (i, j) of image b reads input pixel (i + shift_rows[b], j' + shift_columns[b]), with j'
    # mirrored when flipping; reads from outside the image give black. Gathering with clamped indices
    # and masking afterwards avoids materializing a padded copy of the batch.
    rows = shift_rows[:, None] + tf.range(height)[None]
    columns = shift_columns[:, None] + tf.where(flip[:, None], tf.range(width - 1, -1, -1)[None], tf.range(width)[None])
    x = tf.gather(x, tf.clip_by_value(rows, 0, height - 1), axis=1, batch_dims=1)
    x = tf.gather(x, tf.clip_by_value(columns, 0, width - 1), axis=2, batch_dims=1)
    inside = ((rows >= 0) & (rows < height))[:, :, None, None] & ((columns >= 0) & (columns < width))[:, None, :, None]
    brightened = tf.cast(tf.clip_by_value(tf.cast(x, tf.int32) + brightness[:, None, None, None], 0, 255), tf.uint8)
    return tf.where(inside, brightened, tf.zeros_like(x)), y
