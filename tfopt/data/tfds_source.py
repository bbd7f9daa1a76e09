"""`TfdsSource`: a TensorFlow Datasets dataset, read through `tfds.builder(...).as_dataset(...)`.

tfopt never downloads at run time by default (`download=False`): training machines are often offline
or firewalled, and a download that starts in the middle of a benchmark would be timed. A dataset that is
not prepared in `data_dir` is a `DataError` that says how to prepare it. Note that
`tfds.load(download=False)` reports a missing dataset with a bare `AssertionError`; the builder's
`is_prepared()` check used here is immediate and never touches the network. With `download=True` on a
machine without network access, tfds retries each URL for minutes; a catalog dataset is therefore
downloaded only after a connection to tfds' download host opened within seconds.

The optimized pipeline reads image features with `tfds.decode.SkipDecoding()` and decodes them in a
parallel map after the read, so decoding is no longer serialized inside the file reader, then caches
the decoded images (within the RAM budget) before augmentation.
"""

from __future__ import annotations

import os

import tensorflow as tf

from tfopt.data import images, pipeline
from tfopt.data.source import DataSource, PipelineRequest, image_size_pair
from tfopt.errors import DataError, EnvironmentVariableError
from tfopt.suggest import did_you_mean

# Shuffle buffer over decoded examples in the naive pipeline (what tutorials write) and over
# undecoded records in the optimized one when the data does not fit the cache.
_SHUFFLE_BUFFER = 10_000


class TfdsSource(DataSource):
    """A supervised TensorFlow Datasets split as `(x, y)` batches; images become float32 in [0, 1].

    Args:
        name: The tfds name, optionally with config and version, e.g. "mnist" or "cifar10:3.0.2".
        split: The split, slicing allowed, e.g. "train" or "train[:10%]".
        data_dir: Where tfds keeps prepared datasets (default: tfds' own, `~/tensorflow_datasets`).
        download: Download and prepare the dataset if it is not prepared yet (needs network access).
        image_size: `(height, width)` images are resized to; None keeps the dataset's own fixed size.
        augment: Random flip, translation and brightness on images, after the cache.

    Raises:
        DataError: The name is not a tfds dataset, or the dataset is not prepared and `download` is
            False, or it has no supervised keys.

    Example:
        >>> import tempfile
        >>> TfdsSource("mnist", data_dir=tempfile.mkdtemp())  # offline: never downloads  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tfopt.errors.DataError: tfds: dataset 'mnist' is not prepared in ..., and download is false...
    """

    name = "tfds"

    def __init__(
        self,
        name: str,
        *,
        split: str = "train",
        data_dir: str | os.PathLike | None = None,
        download: bool = False,
        image_size: int | tuple[int, int] | list[int] | None = None,
        augment: bool = False,
    ):
        self.dataset_name = name
        self.split = split
        self.data_dir = None if data_dir is None else os.fspath(os.path.expanduser(data_dir))
        self.download = bool(download)
        self.image_size = None if image_size is None else image_size_pair(self.name, image_size)
        self.augment = bool(augment)
        self.builder = _prepared_builder(name, self.data_dir, self.download)
        supervised = self.builder.info.supervised_keys
        if not supervised or len(supervised) != 2:
            raise DataError(
                f"tfds: dataset {name!r} has no (input, label) supervised keys, so it cannot be read as (x, y). "
                "Use a supervised dataset, or convert it to numpy/TFRecord with the features you need.",
                setting="name",
            )
        self.x_key, self.y_key = supervised
        try:
            self.num_examples = int(self.builder.info.splits[split].num_examples)
        except (KeyError, ValueError) as error:
            raise DataError(
                f"tfds: dataset {name!r} has no split {split!r} ({error}). Its splits are "
                f"{sorted(self.builder.info.splits)}.",
                setting="split",
            ) from error
        if self.num_examples == 0:
            raise DataError(
                f"tfds: split {split!r} of {name!r} holds zero examples. Choose a non-empty split.", setting="split"
            )
        label_feature = self.builder.info.features[self.y_key]
        names = getattr(label_feature, "names", None)
        self.class_names = list(names) if names else None
        self._feature = self.builder.info.features[self.x_key]
        self.is_image = _is_image_feature(self._feature)
        if not self.is_image and None in tuple(self._feature.shape):
            raise DataError(
                f"tfds: {self.x_key!r} of {name!r} has shape {self._feature.shape}, which varies from one example to "
                "the next, so its examples cannot be batched as they are. Read it with tfds itself and pad or cut "
                "them to one shape (padded_batch, or a map).",
                setting="name",
            )
        if self.is_image and self.image_size is None and None in tuple(self._feature.shape[:2]):
            raise DataError(
                f"tfds: the images of {name!r} have no fixed size ({self._feature.shape}), so they cannot be "
                "batched as they are. Pass image_size: [height, width].",
                setting="image_size",
            )

    def _build_pipeline(self, request: PipelineRequest) -> tf.data.Dataset:
        import tensorflow_datasets as tfds

        # With shuffle=False one file is read at a time, so both pipelines see the files' own order.
        read_config = tfds.ReadConfig(
            shuffle_seed=request.seed,
            interleave_cycle_length=None if request.shuffle else 1,
            num_parallel_calls_for_decode=tf.data.AUTOTUNE if request.optimized else 1,
        )
        skip_decoding = request.optimized and self.is_image
        records = self.builder.as_dataset(
            split=self.split,
            as_supervised=True,
            shuffle_files=request.shuffle,
            read_config=read_config,
            decoders={self.x_key: tfds.decode.SkipDecoding()} if skip_decoding else None,
        )
        records = records.shard(request.num_shards, request.shard_index)
        decode, decoded_bytes, output_bytes = self._decode_stage(skip_decoding)
        finish = images.to_unit_float if self.is_image else (lambda x, y: (x, y))
        return pipeline.assemble(
            records,
            decode=decode,
            finish=finish,
            augment=images.random_augment if (self.augment and self.is_image) else None,
            request=request,
            num_examples=len(range(request.shard_index, self.num_examples, request.num_shards)),
            decoded_example_bytes=decoded_bytes,
            output_example_bytes=output_bytes,
            record_shuffle_buffer=min(self.num_examples, _SHUFFLE_BUFFER),
            sharded_by_source=request.num_shards > 1,
        )

    def _decode_stage(self, skip_decoding: bool):
        feature = self._feature
        if not self.is_image:
            size = _static_size(feature.shape) * tf.as_dtype(feature.dtype).size
            return (lambda x, y: (x, _label(y))), size, size
        channels = feature.shape[-1] or 3
        image_size = self.image_size or tuple(feature.shape[:2])

        def decode(x, y):
            image = images.decode_image(x, None, channels) if skip_decoding else x
            return images.resize_uint8(image, image_size, channels), _label(y)

        pixels = image_size[0] * image_size[1] * channels
        return decode, pixels, 4 * pixels

    def describe(self) -> str:
        size = f", resized to {self.image_size[0]}x{self.image_size[1]}" if self.image_size else ""
        return (
            f"tfds {self.dataset_name} split {self.split!r} ({self.num_examples} examples) from "
            f"{self.builder.data_dir}{size}" + (", augmented" if self.augment else "")
        )

    def get_config(self) -> dict:
        return {
            "name": self.dataset_name,
            "split": self.split,
            "data_dir": self.data_dir,
            "download": self.download,
            "image_size": None if self.image_size is None else list(self.image_size),
            "augment": self.augment,
        }


def _prepared_builder(name: str, data_dir: str | None, download: bool):
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        hint = did_you_mean(name.split(":")[0], tfds.list_builders(with_community_datasets=False))
        raise DataError(
            f"tfds: {name!r} is not a TensorFlow Datasets dataset.{hint} See "
            "https://www.tensorflow.org/datasets/catalog for the names.",
            setting="name",
        ) from error
    except (AssertionError, ValueError) as error:  # a version or config the dataset does not have, an empty name
        raise DataError(
            f"tfds: {name!r} names no dataset, version or config that TensorFlow Datasets has ({error}). Write "
            "'name', 'name:version' or 'name/config' as the catalog gives them "
            "(https://www.tensorflow.org/datasets/catalog).",
            setting="name",
        ) from error
    if builder.is_prepared():
        return builder
    where = data_dir or "~/tensorflow_datasets"
    if not download:
        # Blamed on data_dir: a prepared copy placed elsewhere is the usual cause on an offline machine.
        raise DataError(
            f"tfds: dataset {name!r} is not prepared in {where}, and download is false (tfopt never downloads "
            f"unless asked). Prepare it once where there is network access with `tfds build {name} --data_dir "
            f"{where}` and copy the directory here, or set download: true.",
            setting="data_dir",
        )
    _check_network(builder, name, where)
    try:
        builder.download_and_prepare()
    except Exception as error:  # tfds raises many kinds (network, checksum, manual download needed)
        raise DataError(
            f"tfds: downloading and preparing {name!r} into {where} failed: {error}. Check network access, or "
            f"prepare it elsewhere with `tfds build {name} --data_dir {where}` and copy the directory."
        ) from error
    return builder


# Where the catalog's prepared datasets and many of its sources are served from.
_DOWNLOAD_HOST = ("storage.googleapis.com", 443)
_NETWORK_TIMEOUT_SECONDS = 5.0


def _check_network(builder, name: str, where: str) -> None:
    """Refuses at once to download a tfds catalog dataset on a machine that cannot reach the download host
    (or the HTTPS proxy it is told to use). A builder of the user's own, which may generate its data
    locally, is left to try."""
    import socket
    import urllib.parse

    if not type(builder).__module__.startswith("tensorflow_datasets."):
        return
    from tfopt.environment_variables import text

    variable = "HTTPS_PROXY" if text("HTTPS_PROXY") else "https_proxy"
    proxy = text(variable)
    try:
        parsed = urllib.parse.urlsplit(proxy) if proxy else None
        host = (parsed.hostname, parsed.port or 80) if parsed and parsed.hostname else _DOWNLOAD_HOST
    except ValueError as error:  # a port that is not a number
        raise EnvironmentVariableError(
            f"The environment variable {variable}={proxy!r} is not a proxy URL ({error}): expected e.g. "
            f"http://proxy.example:3128. Set it so, or unset it (unset {variable}).",
            variable=variable,
        ) from None
    try:
        socket.create_connection(host, timeout=_NETWORK_TIMEOUT_SECONDS).close()
    except OSError as error:
        raise DataError(
            f"tfds: cannot download {name!r}: this machine has no network access to {host[0]}:{host[1]} ({error}). "
            f"Prepare it where there is network access with `tfds build {name} --data_dir {where}` and copy the "
            "directory here, or point data_dir at a prepared copy.",
            setting="download",
        ) from error


def _is_image_feature(feature) -> bool:
    import tensorflow_datasets as tfds

    return isinstance(feature, tfds.features.Image)


def _static_size(shape) -> int:
    size = 1
    for dimension in shape:
        size *= dimension or 1
    return size


def _label(y: tf.Tensor) -> tf.Tensor:
    """Class ids as int32 (tfds stores them as int64); any other target, a regression's float, as it is."""
    return tf.cast(y, tf.int32) if y.dtype.is_integer else y
