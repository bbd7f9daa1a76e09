"""`TFRecordSource`: reads a `to_tfrecord` conversion, building its pipeline from the manifest.

The optimized pipeline is the one the tf.data guide describes for sharded files: the file list is
shuffled each epoch, shards are read by a parallel, deterministic `interleave`, records are parsed and
decoded in a parallel map, then cached (within the RAM budget) before random augmentation, shuffled,
batched and prefetched. With `shuffle=False` it reads whole shards in file order (`block_length` as
long as the longest shard) so that it yields exactly what the naive `TFRecordDataset(files)` yields.

Workers shard by file when there are at least as many files as workers (each reads only its files);
otherwise every worker reads all files and keeps every `num_shards`-th record.
"""

from __future__ import annotations

import os
import pathlib

import tensorflow as tf

from tfopt.data import images, pipeline
from tfopt.data.source import DataSource, PipelineRequest, image_size_pair
from tfopt.data.tfrecord.manifest import read_manifest
from tfopt.data.tfrecord.verify import verify
from tfopt.errors import DataError, chained_messages

_SHUFFLE_BUFFER = 10_000
_MAX_CYCLE_LENGTH = 16


class TFRecordSource(DataSource):
    """A tfopt TFRecord conversion as `(x, y)` batches, decoded as the source it was converted from.

    Args:
        path: The directory `to_tfrecord` wrote (it holds `tfopt_manifest.json`).
        image_size: For converted images, the `(height, width)` to resize to; None keeps the size the
            source was converted with.
        augment: Random flip, translation and brightness on images, after the cache.

    Raises:
        DataError: The directory or its manifest is missing, or the manifest's version is unknown, or
            `augment` or `image_size` is given for data that are not images.

    Example:
        >>> import tempfile
        >>> from tfopt.data import ImageFolderSource, generate_shapes, to_tfrecord
        >>> folder = generate_shapes(tempfile.mkdtemp(), images_per_class=4, image_size=32)
        >>> out = to_tfrecord(ImageFolderSource(folder, image_size=32), tempfile.mkdtemp())
        >>> images, labels = next(iter(TFRecordSource(out, augment=True).pipeline(batch_size=8, optimized=True)))
        >>> tuple(images.shape), labels.dtype.name
        ((8, 32, 32, 3), 'int32')
    """

    name = "tfrecord"

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        image_size: int | tuple[int, int] | list[int] | None = None,
        augment: bool = False,
    ):
        self.path = pathlib.Path(path).expanduser()
        try:
            self.manifest = read_manifest(self.path)
        except DataError as error:  # whatever is wrong with the conversion, `path` names it
            error.setting = "path"
            raise
        self.features = self.manifest["features"]
        self.class_names = self.manifest.get("class_names")
        x_spec = self.features["x"]
        self.is_image = x_spec["kind"] == "image" or (
            x_spec.get("finish") == "unit_float" and len(x_spec["shape"]) == 3
        )
        if image_size is not None and x_spec["kind"] != "image":
            raise DataError(
                f"tfrecord: image_size={image_size!r} was given, but {self.path} holds {x_spec['kind']} features, not "
                "encoded images. Leave image_size unset.",
                setting="image_size",
            )
        if augment and not self.is_image:
            raise DataError(
                f"tfrecord: augment=True needs images, but {self.path} holds {x_spec}. Leave augment unset.",
                setting="augment",
            )
        self._image_size_argument = None if image_size is None else image_size_pair(self.name, image_size)
        self.augment = bool(augment)

    @property
    def num_examples(self) -> int:
        """Number of records in the conversion."""
        return int(self.manifest["num_examples"])

    @property
    def files(self) -> list[pathlib.Path]:
        """The shard files, in record order."""
        return [self.path / shard["file"] for shard in self.manifest["shards"]]

    def explain_failure(self, error: BaseException) -> str | None:
        """Names the damaged shards behind a corrupted-record error (TensorFlow names none), by verifying
        every shard against the manifest."""
        if not any("corrupted record" in text or "DataLoss" in text for text in chained_messages(error)):
            return None
        try:
            verify(self.path)
        except DataError as damage:
            return str(damage)
        return None

    def _build_pipeline(self, request: PipelineRequest) -> tf.data.Dataset:
        shards = self.manifest["shards"]
        by_file = len(shards) >= request.num_shards
        if by_file:
            shards = shards[request.shard_index :: request.num_shards]
            num_examples = sum(shard["records"] for shard in shards)
        else:
            num_examples = len(range(request.shard_index, self.num_examples, request.num_shards))
        files = [str(self.path / shard["file"]) for shard in shards]
        compression = self.manifest["compression"] or ""
        if request.optimized:
            file_names = tf.data.Dataset.from_tensor_slices(files)
            if request.shuffle and by_file:
                file_names = file_names.shuffle(len(files), seed=request.seed, reshuffle_each_iteration=True)
            records = file_names.interleave(
                lambda name: tf.data.TFRecordDataset(name, compression_type=compression),
                cycle_length=min(len(files), _MAX_CYCLE_LENGTH),
                block_length=1 if request.shuffle else max([1, *(shard["records"] for shard in shards)]),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
        else:
            records = tf.data.TFRecordDataset(files, compression_type=compression)
        if not by_file:
            records = records.shard(request.num_shards, request.shard_index)
        decode, decoded_bytes = self._decode_stage()
        return pipeline.assemble(
            records,
            decode=decode,
            finish=images.to_unit_float if self.is_image else (lambda x, y: (x, y)),
            augment=images.random_augment if self.augment else None,
            request=request,
            num_examples=num_examples,
            decoded_example_bytes=decoded_bytes,
            output_example_bytes=4 * decoded_bytes,
            record_shuffle_buffer=min(num_examples, _SHUFFLE_BUFFER),
            sharded_by_source=request.num_shards > 1,
        )

    def _decode_stage(self):
        x_spec, y_spec = self.features["x"], self.features["y"]
        parse_spec = {"x": tf.io.FixedLenFeature([], tf.string)}
        if y_spec["kind"] == "int":
            parse_spec["y"] = tf.io.FixedLenFeature(y_spec["shape"], tf.int64)
        else:
            parse_spec["y"] = tf.io.FixedLenFeature([], tf.string)
        if x_spec["kind"] == "image":
            image_size = self._image_size_argument or tuple(x_spec["image_size"])
            channels = x_spec["channels"]

            def decode_x(value):
                return images.decode_image(value, image_size, channels)

            decoded_bytes = image_size[0] * image_size[1] * channels
        else:
            decode_x = _raw_decoder(x_spec)
            decoded_bytes = tf.TensorShape(x_spec["shape"]).num_elements() * tf.as_dtype(x_spec["dtype"]).size
        decode_y = (lambda value: tf.cast(value, y_spec["dtype"])) if y_spec["kind"] == "int" else _raw_decoder(y_spec)

        def decode(record):
            parsed = tf.io.parse_single_example(record, parse_spec)
            return decode_x(parsed["x"]), decode_y(parsed["y"])

        return decode, decoded_bytes

    def describe(self) -> str:
        compression = self.manifest["compression"] or "uncompressed"
        return (
            f"tfrecord {self.path}: {self.num_examples} examples in {len(self.manifest['shards'])} shards "
            f"({compression}), converted from {self.manifest['source']}" + (", augmented" if self.augment else "")
        )

    def get_config(self) -> dict:
        image_size = None if self._image_size_argument is None else list(self._image_size_argument)
        return {"path": str(self.path), "image_size": image_size, "augment": self.augment}


# decode_raw has no 32- or 64-bit unsigned type: their bytes are read as the signed type of their size and
# bitcast back, bit for bit.
_READ_AS_SIGNED = {tf.uint32: tf.int32, tf.uint64: tf.int64}


def _raw_decoder(spec: dict):
    dtype, shape = tf.as_dtype(spec["dtype"]), spec["shape"]
    read_as = _READ_AS_SIGNED.get(dtype, dtype)

    def decode(value):
        # decode_raw reads little-endian, which is how the writer stores every array.
        values = tf.io.decode_raw(value, read_as, little_endian=True)
        return tf.reshape(values if read_as == dtype else tf.bitcast(values, dtype), shape)

    return decode
