"""What `to_tfrecord` can convert, reduced to one shape: a feature spec plus serialized records.

Inputs with random access (an image folder, NumPy arrays, the synthetic source) give records for any
index range, so shard writers can each produce their own records in parallel (an image folder also as
a JSON *task* naming its files, which a worker process turns into records on its own), and they have a cheap
fingerprint (file names/sizes/mtimes, or a hash of the arrays), so converting the same input again is
recognised without re-reading it. Sequential inputs (a `tf.data.Dataset`, a tfds split) are read once
in order; a dataset has no identity short of its content, so its fingerprint is the sha256 of its
serialized records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tfopt.data.tfrecord.codec import encode_example
from tfopt.data.tfrecord.workers import task_records
from tfopt.errors import DataError

# Protocol buffers are limited to 2 GiB; a record's framing and the label take a little of it.
_MAX_RECORD_BYTES = 2**31 - 2**20


@dataclasses.dataclass(frozen=True)
class ConversionInput:
    """One input to convert.

    Attributes:
        description: Human description stored in the manifest.
        features: The manifest's feature spec (see `tfopt.data.tfrecord.manifest`).
        class_names: Class names when known, else None.
        fingerprint: Identity of the input, or None when only its content identifies it.
        num_examples: Number of examples when known up front, else None.
        example_bytes: Estimated serialized bytes per example (for shard sizing).
        records: `records(start, stop)` for random-access inputs, else None.
        stream: `stream()` yielding every record in order, for sequential inputs, else None.
        task: `task(start, stop)`: the records of `records(start, stop)` described as JSON that
            `tfrecord_workers.task_records` turns into records in another process, for inputs on disk; else None.
    """

    description: str
    features: dict
    class_names: list[str] | None
    fingerprint: str | None
    num_examples: int | None
    example_bytes: int
    records: Callable[[int, int], Iterator[bytes]] | None = None
    stream: Callable[[], Iterator[bytes]] | None = None
    task: Callable[[int, int], dict] | None = None


def conversion_input(source) -> ConversionInput:
    """Normalizes what the user passed to `to_tfrecord`.

    Accepted: an `ImageFolderSource` or a path to an image-folder directory (the encoded image bytes are
    kept), a `NumpySource`, a `SyntheticSource`, an `(x, y)` tuple of arrays, a `TfdsSource`, or a
    `tf.data.Dataset` of unbatched `(x, y)` elements with fixed shapes.

    Raises:
        DataError: The input is of another type, or a dataset's elements are not fixed-shape `(x, y)`.
    """
    if isinstance(source, (str, os.PathLike)):
        from tfopt.data.image_folder import ImageFolderSource

        source = ImageFolderSource(source)
    if isinstance(source, tuple) and len(source) == 2:
        x, y = (_array(name, part) for name, part in zip("xy", source))
        if len(x) != len(y) or len(x) == 0:
            raise DataError(f"to_tfrecord: x has {len(x)} examples and y {len(y)}; pass equal, non-zero lengths.")
        return _from_arrays(x, y, None, f"numpy arrays: {len(x)} examples, x {x.dtype}{list(x.shape[1:])}")
    # An object can only be an instance of a class whose module is already imported, so these checks
    # never import TensorFlow themselves: converting NumPy arrays stays TensorFlow-free.
    if _is_instance(source, "tfopt.data.image_folder", "ImageFolderSource"):
        return _from_image_folder(source)
    if _is_instance(source, "tfopt.data.arrays", "NumpySource"):
        return _from_arrays(source.x, source.y, None, source.describe())
    if _is_instance(source, "tfopt.data.synthetic", "SyntheticSource"):
        x, y = source.arrays
        return _from_arrays(x, y, "unit_float" if source.kind == "image" else None, source.describe())
    if _is_instance(source, "tfopt.data.tfds_source", "TfdsSource"):
        return _from_tfds(source)
    if _is_instance(source, "tensorflow", "data.Dataset"):
        return _from_dataset(source)
    raise DataError(
        f"to_tfrecord: cannot convert a {type(source).__name__}. Pass an ImageFolderSource or an image-folder "
        "path, a NumpySource, a SyntheticSource, an (x, y) tuple of arrays, a TfdsSource, or an unbatched "
        "tf.data.Dataset of (x, y)."
    )


def _array(name: str, value: Any) -> np.ndarray:
    """One part of an `(x, y)` tuple as an array of one row per example, or a DataError saying what it is."""
    try:
        array = np.asarray(value)
    except ValueError as error:  # lists of unequal lengths
        raise DataError(
            f"to_tfrecord: {name} is not an array of one shape ({error}). Pad or cut its examples to one shape "
            "first, or pass a tf.data.Dataset."
        ) from None
    if array.ndim == 0 or array.dtype == object:
        raise DataError(
            f"to_tfrecord: {name} is a {type(value).__name__}, not an array with one row per example. Pass "
            "(x, y) as numeric arrays of equal length (a dict of features: a tf.data.Dataset mapped to (x, y))."
        )
    return array


def _is_instance(value, module_name: str, class_path: str) -> bool:
    module = sys.modules.get(module_name)
    if module is None:
        return False
    cls = module
    for part in class_path.split("."):
        cls = getattr(cls, part)
    return isinstance(value, cls)


def _from_image_folder(source) -> ConversionInput:
    files, labels = [str(p) for p in source.files], list(source.labels)
    root_length = len(str(source.path)) + 1
    listing = hashlib.sha256()
    total_bytes = 0
    for path, label in zip(files, labels):
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            raise DataError(
                f"to_tfrecord: {path} no longer exists: the image folder changed after the "
                "ImageFolderSource listed it. Create the source again to convert what is there now."
            ) from None
        total_bytes += stat.st_size
        listing.update(f"{path[root_length:]}\0{stat.st_size}\0{stat.st_mtime_ns}\0{label}\n".encode())
    config = {key: value for key, value in source.get_config().items() if key != "augment"}
    fingerprint = _hash({"kind": "image_folder", "config": config, "files": listing.hexdigest()})

    def task(start: int, stop: int) -> dict:
        return {"kind": "image_files", "files": files[start:stop], "labels": labels[start:stop]}

    features = {
        "x": {"kind": "image", "channels": source.channels, "image_size": list(source.image_size)},
        "y": {"kind": "int", "dtype": "int32", "shape": []},
    }
    return ConversionInput(
        description=source.describe(),
        features=features,
        class_names=list(source.class_names),
        fingerprint=fingerprint,
        num_examples=len(files),
        example_bytes=max(1, total_bytes // len(files)) + 32,
        records=lambda start, stop: task_records(task(start, stop)),
        task=task,
    )


def _from_arrays(x: np.ndarray, y: np.ndarray, finish: str | None, description: str) -> ConversionInput:
    x_spec, encode_x = _tensor_feature("x", x.dtype, x.shape[1:], finish)
    y_spec, encode_y = _label_feature(y.dtype, y.shape[1:])
    digest = hashlib.sha256()
    for array in (x, y):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).data)
    fingerprint = _hash({"kind": "arrays", "finish": finish, "content": digest.hexdigest()})

    def records(start: int, stop: int) -> Iterator[bytes]:
        for index in range(start, stop):
            yield encode_example({"x": encode_x(x[index]), "y": encode_y(y[index])})

    return ConversionInput(
        description=description,
        features={"x": x_spec, "y": y_spec},
        class_names=None,
        fingerprint=fingerprint,
        num_examples=len(x),
        example_bytes=int(x[:1].nbytes + 8 * max(1, y[:1].size) + 32),
        records=records,
    )


def _from_tfds(source) -> ConversionInput:
    import tensorflow_datasets as tfds

    builder = source.builder
    label_feature = builder.info.features[source.y_key]
    class_names = list(label_feature.names) if isinstance(label_feature, tfds.features.ClassLabel) else None
    if source.is_image:
        feature = builder.info.features[source.x_key]
        image_size = source.image_size or tuple(feature.shape[:2])
        x_spec = {"kind": "image", "channels": feature.shape[-1] or 3, "image_size": list(image_size)}
        decoders = {source.x_key: tfds.decode.SkipDecoding()}

        def encode_x(value):
            return value
    else:
        feature = builder.info.features[source.x_key]
        x_spec, encode_x = _tensor_feature("x", np.dtype(feature.np_dtype), tuple(feature.shape), None)
        decoders = None
    y_feature = builder.info.features[source.y_key]
    y_spec, encode_y = _label_feature(np.dtype(y_feature.np_dtype), tuple(y_feature.shape))
    if y_spec["kind"] == "int" and y_spec["dtype"] != "bool":
        y_spec["dtype"] = "int32"  # TfdsSource yields int32 labels; the conversion reads back the same

    def stream() -> Iterator[bytes]:
        dataset = builder.as_dataset(
            split=source.split,
            as_supervised=True,
            shuffle_files=False,
            decoders=decoders,
            read_config=tfds.ReadConfig(interleave_cycle_length=1),  # the files' own order, as TfdsSource reads
        )
        for x, y in dataset.as_numpy_iterator():
            yield encode_example({"x": encode_x(x), "y": encode_y(y)})

    fingerprint = _hash(
        {
            "kind": "tfds",
            "name": builder.info.full_name,
            "split": source.split,
            "data_dir": str(builder.data_dir),
            "x": x_spec,
            "files": _listing(builder.data_dir),  # a dataset prepared again in place is another input
        }
    )
    return ConversionInput(
        description=source.describe(),
        features={"x": x_spec, "y": y_spec},
        class_names=class_names,
        fingerprint=fingerprint,
        num_examples=source.num_examples,
        example_bytes=max(1, int(builder.info.dataset_size or 0) // max(1, source.num_examples)) + 32,
        stream=stream,
    )


def _listing(directory: Any) -> str:
    """A digest of the names, sizes and modification times of the files in a directory."""
    listing = hashlib.sha256()
    for entry in sorted(os.scandir(os.fspath(directory)), key=lambda entry: entry.name):
        if entry.is_file():
            stat = entry.stat()
            listing.update(f"{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return listing.hexdigest()


def _from_dataset(dataset) -> ConversionInput:
    import tensorflow as tf

    from tfopt.data.batches import last_batch_op

    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(s, tf.TensorSpec) for s in spec)):
        raise DataError(f"to_tfrecord: the dataset yields {spec}; {_what_to_map(spec)}")
    if last_batch_op(dataset) is not None:
        raise DataError(
            f"to_tfrecord: the dataset is batched (its elements are x {spec[0].shape}, y {spec[1].shape}), and a "
            "conversion stores one example per record. Pass it unbatched (dataset.unbatch(), or the pipeline "
            "before its .batch()), and batch the TFRecordSource's pipeline instead."
        )
    x_spec_tf, y_spec_tf = spec
    if not (x_spec_tf.shape.is_fully_defined() and y_spec_tf.shape.is_fully_defined()):
        raise DataError(
            f"to_tfrecord: the dataset's elements have shapes x {x_spec_tf.shape}, y {y_spec_tf.shape}, not fixed. "
            "Pass an unbatched dataset (dataset.unbatch()) whose elements all have the same shape."
        )
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise DataError(
            "to_tfrecord: the dataset is infinite (a repeat() without a count), and a conversion writes one pass "
            "of it. Pass the dataset without its repeat(), and repeat the TFRecordSource's pipeline instead."
        )
    x_spec, encode_x = _tensor_feature("x", np.dtype(x_spec_tf.dtype.as_numpy_dtype), tuple(x_spec_tf.shape), None)
    y_spec, encode_y = _label_feature(np.dtype(y_spec_tf.dtype.as_numpy_dtype), tuple(y_spec_tf.shape))

    def stream() -> Iterator[bytes]:
        for x, y in dataset.as_numpy_iterator():
            yield encode_example({"x": encode_x(np.asarray(x)), "y": encode_y(np.asarray(y))})

    return ConversionInput(
        description=f"tf.data.Dataset of x {x_spec_tf.dtype.name}{x_spec_tf.shape.as_list()}, y {y_spec_tf.dtype.name}"
        f"{y_spec_tf.shape.as_list()}",
        features={"x": x_spec, "y": y_spec},
        class_names=None,
        fingerprint=None,
        num_examples=cardinality if cardinality >= 0 else None,
        example_bytes=int(np.dtype(x_spec_tf.dtype.as_numpy_dtype).itemsize * x_spec_tf.shape.num_elements()) + 64,
        stream=stream,
    )


def _what_to_map(spec: Any) -> str:
    """What a dataset whose elements are not (x, y) pairs of dense tensors must be mapped to, and how."""
    import tensorflow as tf

    if isinstance(spec, tuple) and len(spec) in (2, 3):
        for name, part in zip(("x", "y", "sample_weight"), spec):
            if isinstance(part, (dict, tuple, list)):
                return (
                    f"its {name} is a {type(part).__name__} of tensors, and a conversion stores one tensor as {name}. "
                    f"Make it one first (tf.concat of equal-dtype features in a map), or convert each part into a "
                    "directory of its own, or train from this pipeline as it is."
                )
            if not isinstance(part, tf.TensorSpec):
                return (
                    f"its {name} is a {type(part).__name__.removesuffix('Spec')}, and a conversion stores tensors of "
                    "one fixed shape. Make it one first (a ragged tensor's .to_tensor(shape=...), "
                    "tf.sparse.to_dense), or train from this pipeline as it is."
                )
        if len(spec) == 3:
            return (
                "a conversion stores (x, y) pairs, not sample weights. Leave them out "
                "(dataset.map(lambda x, y, w: (x, y))) and weigh the examples of the pipeline you read back."
            )
    return (
        "expected (x, y) pairs of tensors. Map it to (x, y) first, e.g. dataset.map(lambda d: (d['image'], "
        "d['label']))."
    )


def _tensor_feature(name: str, dtype: np.dtype, shape, finish: str | None):
    dtype = np.dtype(dtype)
    if dtype.kind not in "biufc":
        hint = (
            "; encode strings as ids first (a StringLookup's vocabulary)"
            if dtype.kind in "USO"
            else f"; cast it to float32 first (tf.cast({name}, tf.float32) in a map)"
            if dtype.name == "bfloat16"
            else ""
        )
        raise DataError(
            f"to_tfrecord: {name} has dtype {dtype}, which cannot be stored as raw bytes. Expected a numeric or "
            f"bool array{hint}."
        )
    if any(dimension is None for dimension in shape):
        raise DataError(
            f"to_tfrecord: {name} has shape {tuple(shape)}, which varies from one example to the next, and a "
            "conversion stores one fixed shape. Pad or cut it to one shape first, or train from the source as it is."
        )
    example_bytes = dtype.itemsize * math.prod(shape)
    if example_bytes > _MAX_RECORD_BYTES:
        raise DataError(
            f"to_tfrecord: one example's {name} holds {example_bytes / 2**30:.1f} GiB, and a TFRecord example (a "
            "protocol buffer) holds under 2 GiB. Split each example into smaller ones, or train from the source as "
            "it is."
        )
    little = dtype.newbyteorder("<")
    spec = {"kind": "tensor", "dtype": dtype.name, "shape": [int(d) for d in shape], "finish": finish}

    def encode(value) -> bytes:
        return np.ascontiguousarray(value, dtype=little).tobytes()

    return spec, encode


def _label_feature(dtype: np.dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        spec = {"kind": "int", "dtype": dtype.name, "shape": [int(d) for d in shape]}

        def encode(value) -> list[int]:
            return [int(v) for v in np.asarray(value).reshape(-1)]

        return spec, encode
    return _tensor_feature("y", dtype, shape, None)


def _hash(value: dict) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
