"""Tests of tfopt.data.tfrecord.to_tfrecord: conversion of every input kind, atomicity, resume, no-op."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import tfopt.data
from tests.processes import child_environment
from tfopt.data.arrays import NumpySource
from tfopt.data.image_folder import ImageFolderSource
from tfopt.data.synthetic import SyntheticSource
from tfopt.data.tfds_source import TfdsSource
from tfopt.data.tfrecord.convert import to_tfrecord
from tfopt.data.tfrecord.manifest import MANIFEST_NAME
from tfopt.data.tfrecord.source import TFRecordSource
from tfopt.data.tfrecord.verify import verify
from tfopt.errors import DataError

from ..helpers import TfoptTinyFlags, assert_same_batches, collect

COMPRESSIONS = [None, "GZIP"]


def _round_trip(source, out_dir, compression, **kwargs):
    """The source's and its conversion's pipelines, both naive and unshuffled, as lists of batches."""
    to_tfrecord(source, out_dir, compression=compression, **kwargs)
    verify(out_dir)
    expected = collect(source.pipeline(batch_size=7, optimized=False, shuffle=False))
    converted = TFRecordSource(out_dir)
    return expected, collect(converted.pipeline(batch_size=7, optimized=False, shuffle=False)), converted


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_image_folder_round_trip_keeps_encoded_bytes(shapes_dir, tmp_path, compression):
    source = ImageFolderSource(shapes_dir, image_size=24)
    expected, converted, reader = _round_trip(source, tmp_path / "out", compression)
    assert_same_batches(expected, converted)
    assert reader.class_names == source.class_names
    assert reader.manifest["features"]["x"] == {"kind": "image", "channels": 3, "image_size": [24, 24]}
    jpeg_bytes = sum(p.stat().st_size for p in source.files)
    shard_bytes = sum(s["bytes"] for s in reader.manifest["shards"])
    # Encoded images plus a few dozen bytes of framing per record, not 24*24*3 decoded pixels each.
    assert shard_bytes < jpeg_bytes + 100 * source.num_examples


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_numpy_round_trip_keeps_dtypes_and_shapes(tmp_path, compression):
    rng = np.random.default_rng(1)
    source = NumpySource(rng.normal(size=(19, 3, 2)).astype(np.float64), rng.integers(0, 9, (19, 2)).astype(np.int16))
    expected, converted, _ = _round_trip(source, tmp_path / "out", compression)
    assert_same_batches(expected, converted)
    assert converted[0][0].dtype == np.float64 and converted[0][1].dtype == np.int16


def test_float_labels_round_trip(tmp_path):
    source = NumpySource(np.arange(10, dtype=np.uint8)[:, None], np.linspace(0, 1, 10).astype(np.float32))
    expected, converted, _ = _round_trip(source, tmp_path / "out", "ZLIB")
    assert_same_batches(expected, converted)


@pytest.mark.parametrize("kind", ["image", "tokens"])
def test_synthetic_round_trip(tmp_path, kind):
    source = SyntheticSource(kind, examples=20, image_size=8, sequence_length=10, vocab_size=100)
    expected, converted, _ = _round_trip(source, tmp_path / "out", "GZIP")
    assert_same_batches(expected, converted)


def test_tfds_round_trip(tfds_dir, tmp_path):
    source = TfdsSource("tfopt_tiny_patches", split="train", data_dir=tfds_dir)
    expected, converted, reader = _round_trip(source, tmp_path / "out", None, records_per_shard=7)
    assert_same_batches(expected, converted)
    assert reader.class_names == ["0", "1", "2"]
    assert [s["records"] for s in reader.manifest["shards"]] == [7, 7, 7, 7, 2]


def test_a_tfds_split_of_several_files_and_bool_labels_round_trips_in_order(tmp_path, monkeypatch):
    config = tfds.download.DownloadConfig(num_shards=3)
    TfoptTinyFlags(data_dir=str(tmp_path / "tfds")).download_and_prepare(download_config=config)
    source = TfdsSource("tfopt_tiny_flags", data_dir=tmp_path / "tfds")
    expected, converted, _ = _round_trip(source, tmp_path / "out", None)
    assert_same_batches(expected, converted)  # the files' own order, and bool labels as bool
    assert converted[0][1].dtype == np.bool_

    shutil.rmtree(tmp_path / "tfds" / "tfopt_tiny_flags")  # prepared again in place, with other examples
    monkeypatch.setattr(TfoptTinyFlags, "first", 100)
    TfoptTinyFlags(data_dir=str(tmp_path / "tfds")).download_and_prepare(download_config=config)
    with pytest.raises(DataError, match="already holds a conversion of another input"):
        to_tfrecord(TfdsSource("tfopt_tiny_flags", data_dir=tmp_path / "tfds"), tmp_path / "out")


def test_tf_data_dataset_round_trip(tmp_path):
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    dataset = tf.data.Dataset.from_tensor_slices((x, np.arange(10, dtype=np.int64)))
    to_tfrecord(dataset, tmp_path / "out", compression="GZIP")
    ((read_x, read_y),) = collect(
        TFRecordSource(tmp_path / "out").pipeline(batch_size=10, optimized=True, shuffle=False)
    )
    np.testing.assert_array_equal(read_x, x)
    np.testing.assert_array_equal(read_y, np.arange(10))


def test_image_folder_path_is_accepted(shapes_dir, tmp_path):
    to_tfrecord(str(shapes_dir), tmp_path / "out")
    assert TFRecordSource(tmp_path / "out").num_examples == 60


def test_shard_layout(tmp_path):
    source = NumpySource(np.zeros((50, 4), np.float32), np.zeros(50, np.int32))
    to_tfrecord(source, tmp_path / "default")
    to_tfrecord(source, tmp_path / "fixed", records_per_shard=20)
    to_tfrecord(source, tmp_path / "bytes", shard_bytes=10**9)
    records = {
        name: [s["records"] for s in json.loads((tmp_path / name / MANIFEST_NAME).read_text())["shards"]]
        for name in ("default", "fixed", "bytes")
    }
    assert records["default"] == [6, 6, 6, 7, 6, 6, 6, 7]  # 8 even shards even when small
    assert records["fixed"] == [20, 20, 10]
    assert len(records["bytes"]) == 8


@pytest.mark.parametrize("count", [8, 9, 20, 36])
def test_eight_examples_or_more_make_at_least_eight_shards(tmp_path, count):
    to_tfrecord((np.zeros((count, 2), np.float32), np.arange(count)), tmp_path / "out")
    shards = [shard["records"] for shard in json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["shards"]]
    assert len(shards) == 8 and sum(shards) == count and max(shards) - min(shards) <= 1


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_unsigned_32_and_64_bit_features_read_back_bit_for_bit(tmp_path, dtype):
    x = np.array([[0, 1], [2**31 + 5, np.iinfo(dtype).max]] * 4, dtype)
    to_tfrecord((x, np.arange(8)), tmp_path / "out")
    ((read_x, read_y),) = collect(
        TFRecordSource(tmp_path / "out").pipeline(batch_size=8, optimized=True, shuffle=False)
    )
    assert read_x.dtype == dtype
    np.testing.assert_array_equal(read_x, x)
    np.testing.assert_array_equal(read_y, np.arange(8))


def test_a_dataset_conversion_that_failed_part_way_is_done_again(tmp_path):
    x = np.arange(40, dtype=np.float32).reshape(20, 2)

    def failing_at(index):
        def checked(x, y):  # the source itself fails at example `index` (a file gone, a network read)
            tf.debugging.assert_less(y, tf.constant(index, tf.int64), message="source failed")
            return x, y

        return checked

    source = tf.data.Dataset.from_tensor_slices((x, np.arange(20)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="source failed"):
        to_tfrecord(source.map(failing_at(12)), tmp_path / "out", records_per_shard=2, num_workers=1)
    assert list((tmp_path / "out").glob("part-*")), "the failed conversion wrote no shard to resume from"
    to_tfrecord(source, tmp_path / "out", records_per_shard=2)  # not taken for the user's own files
    ((read_x, read_y),) = collect(
        TFRecordSource(tmp_path / "out").pipeline(batch_size=20, optimized=False, shuffle=False)
    )
    np.testing.assert_array_equal(read_x, x)
    np.testing.assert_array_equal(read_y, np.arange(20))


def test_second_conversion_of_the_same_input_is_a_no_op(shapes_dir, tmp_path):
    out = to_tfrecord(ImageFolderSource(shapes_dir, image_size=32), tmp_path / "out")
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    to_tfrecord(ImageFolderSource(shapes_dir, image_size=32, augment=True), out)  # augment is a read option
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


def test_second_conversion_of_the_same_dataset_is_a_no_op(tmp_path):
    dataset = tf.data.Dataset.range(12).map(lambda i: (tf.cast(i, tf.float32), i))
    out = to_tfrecord(dataset, tmp_path / "out")
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    to_tfrecord(dataset, out)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    with pytest.raises(DataError, match="another input"):
        to_tfrecord(dataset.map(lambda x, y: (x + 1, y)), out)
    unseeded = dataset.shuffle(12)
    reshuffled = to_tfrecord(unseeded, tmp_path / "unseeded")
    with pytest.raises(DataError, match=r"description is the same.*shuffle or a random map without a seed"):
        to_tfrecord(unseeded, reshuffled)  # a second pass draws another order (1 in 12! that it does not)


def test_other_options_redo_and_other_input_needs_overwrite(tmp_path):
    first = NumpySource(np.zeros((10, 2), np.float32), np.zeros(10, np.int32))
    second = NumpySource(np.ones((10, 2), np.float32), np.zeros(10, np.int32))
    out = to_tfrecord(first, tmp_path / "out")
    to_tfrecord(first, out, compression="GZIP")
    assert sorted(p.name for p in out.iterdir())[0] == "part-00000.tfrecord.gz"
    with pytest.raises(DataError, match="already holds a conversion of another input"):
        to_tfrecord(second, out, compression="GZIP")
    to_tfrecord(second, out, overwrite=True)
    ((x, _),) = collect(TFRecordSource(out).pipeline(batch_size=10, optimized=True, shuffle=False))
    assert np.all(x == 1.0)
    assert not any(".gz" in p.name for p in out.iterdir())


def _first_and_second(tmp_path):
    """A directory holding a complete conversion of `first`, and the arrays of `second`."""
    first = (np.zeros((10, 2), np.float32), np.arange(10))
    second = (np.ones((10, 2), np.float32), np.arange(10))
    return to_tfrecord(first, tmp_path / "out", records_per_shard=3), first, second


def _read(out):
    ((x, y),) = collect(TFRecordSource(out).pipeline(batch_size=100, optimized=False, shuffle=False))
    return x, y


def test_a_replacement_that_fails_keeps_the_conversion_there_was(tmp_path):
    out, first, second = _first_and_second(tmp_path)

    def failing(x, y):  # the new input fails part way (a file gone, a network read)
        tf.debugging.assert_less(y, tf.constant(6, tf.int64), message="source failed")
        return x, y

    failing_second = tf.data.Dataset.from_tensor_slices(second).map(failing)
    with pytest.raises(tf.errors.InvalidArgumentError, match="source failed"):
        to_tfrecord(failing_second, out, records_per_shard=2, overwrite=True)
    with pytest.raises(DataError, match="zero examples"):
        to_tfrecord(tf.data.Dataset.from_tensor_slices(second).filter(lambda x, y: y < 0), out, overwrite=True)
    verify(out)
    np.testing.assert_array_equal(_read(out)[0], first[0])
    (out / ".tfopt_manifest.json.k1l2m3.tmp").write_text("{")  # left by a run killed writing its manifest
    to_tfrecord(second, out, compression="GZIP", overwrite=True)
    np.testing.assert_array_equal(_read(out)[0], second[0])
    assert sorted(p.name for p in out.iterdir()) == [f"part-0000{i}.tfrecord.gz" for i in range(8)] + [MANIFEST_NAME]


def test_a_replacement_killed_while_put_in_place_is_finished_by_the_next_run(tmp_path):
    out, _, second = _first_and_second(tmp_path)  # 4 shards of 3
    replacement = out / ".tfopt_replacement"
    to_tfrecord(second, replacement, records_per_shard=5)  # complete: 2 shards of 5
    (out / MANIFEST_NAME).unlink()  # the kill came after the old manifest went and one shard moved
    os.replace(replacement / "part-00000.tfrecord", out / "part-00000.tfrecord")
    with pytest.raises(DataError, match="not a complete tfopt conversion"):
        TFRecordSource(out)
    to_tfrecord(second, out, records_per_shard=5)  # the same conversion: put in place, verified, nothing redone
    np.testing.assert_array_equal(_read(out)[0], second[0])
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.tfrecord", "part-00001.tfrecord", MANIFEST_NAME]


def test_a_second_conversion_into_a_directory_being_written_is_refused(tmp_path):
    import fcntl

    out, first, second = _first_and_second(tmp_path)
    held = os.open(out, os.O_RDONLY)  # as a conversion running in another process holds it
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(DataError, match=r"another conversion is writing .* now"):
            to_tfrecord(second, out, overwrite=True)
    finally:
        os.close(held)
    np.testing.assert_array_equal(_read(out)[0], first[0])
    to_tfrecord(second, out, overwrite=True)
    np.testing.assert_array_equal(_read(out)[0], second[0])


def test_foreign_files_in_the_output_directory_are_kept(tmp_path):
    (tmp_path / "README.txt").write_text("mine")
    to_tfrecord(NumpySource(np.zeros((3, 1)), np.zeros(3)), tmp_path)
    assert (tmp_path / "README.txt").read_text() == "mine"


_INTERRUPTED_CONVERSION = """
import sys, time
import numpy as np
from tfopt.data.tfrecord import codec
from tfopt.data.tfrecord.convert import to_tfrecord

write_records = codec.write_records

def slow_write_records(*args, **kwargs):
    time.sleep(0.2)  # long enough for the test to kill this process between shards
    return write_records(*args, **kwargs)

codec.write_records = slow_write_records
x = np.arange(4000 * 16, dtype=np.float32).reshape(4000, 16)
to_tfrecord((x, np.arange(4000) % 7), sys.argv[1], records_per_shard=50, num_workers=1, compression="GZIP")
"""


def test_conversion_killed_with_sigkill_is_resumed_to_a_complete_verified_output(tmp_path):
    out = tmp_path / "out"
    environment = child_environment(TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_CONVERSION, str(out)], env=environment)
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("part-*"))) < 5:
            assert process.poll() is None, "the conversion ended before it could be interrupted"
            assert time.monotonic() < deadline, "the conversion wrote no shards in 120 s"
            time.sleep(0.05)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert not (out / MANIFEST_NAME).exists()
    with pytest.raises(DataError, match="not a complete tfopt conversion"):
        TFRecordSource(out)
    written_before = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*")}

    x = np.arange(4000 * 16, dtype=np.float32).reshape(4000, 16)
    to_tfrecord((x, np.arange(4000) % 7), out, records_per_shard=50, num_workers=1, compression="GZIP")
    assert verify(out)["num_examples"] == 4000
    kept = [name for name, stamp in written_before.items() if (out / name).stat().st_mtime_ns == stamp]
    assert len(kept) >= 4  # finished shards were reused, not rewritten
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    batches = collect(TFRecordSource(out).pipeline(batch_size=1000, optimized=True, shuffle=False))
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), np.arange(4000) % 7)


def test_bad_inputs_and_options(tmp_path):
    with pytest.raises(DataError, match="cannot convert a dict"):
        to_tfrecord({"x": 1}, tmp_path / "a")
    pairs = tf.data.Dataset.from_tensor_slices((np.zeros((4, 2)), np.zeros(4)))
    for drop_remainder in (False, True):  # one batch is no example, whether or not its shape is static
        with pytest.raises(DataError, match=r"is batched.*dataset\.unbatch\(\)"):
            to_tfrecord(pairs.batch(2, drop_remainder=drop_remainder), tmp_path / "b")
    varying = tf.data.Dataset.range(1, 4).map(lambda i: (tf.range(i), i))
    with pytest.raises(DataError, match="not fixed"):
        to_tfrecord(varying, tmp_path / "b")
    with pytest.raises(DataError, match=r"its x is a dict of tensors.*tf\.concat"):
        to_tfrecord(pairs.map(lambda x, y: ({"a": x, "b": x}, y)), tmp_path / "b")
    with pytest.raises(DataError, match=r"x is a dict, not an array with one row per example"):
        to_tfrecord(({"a": np.zeros(2)}, np.zeros(2)), tmp_path / "b")
    with pytest.raises(DataError, match=r"x is not an array of one shape"):
        to_tfrecord(([[1.0], [1.0, 2.0]], np.zeros(2)), tmp_path / "b")
    with pytest.raises(DataError, match=r"y is a NoneType"):
        to_tfrecord((np.zeros((2, 1)), None), tmp_path / "b")
    with pytest.raises(DataError, match=r"holds 2\.0 GiB.*under 2 GiB"):
        to_tfrecord(tf.data.Dataset.from_tensors((tf.zeros((2**29,)), 0)).map(lambda x, y: (x, y)), tmp_path / "b")
    with pytest.raises(DataError, match="expected \\(x, y\\) pairs"):
        to_tfrecord(tf.data.Dataset.range(3), tmp_path / "c")
    ragged = tf.data.Dataset.range(1, 4).map(lambda i: (tf.RaggedTensor.from_tensor([tf.range(i)]), i))
    with pytest.raises(DataError, match=r"its x is a RaggedTensor.*\.to_tensor"):
        to_tfrecord(ragged, tmp_path / "c")
    weighted = tf.data.Dataset.from_tensor_slices((np.zeros((4, 2)), np.zeros(4), np.ones(4)))
    with pytest.raises(DataError, match=r"not sample weights.*lambda x, y, w: \(x, y\)"):
        to_tfrecord(weighted, tmp_path / "c")
    with pytest.raises(DataError, match=r"x has dtype bfloat16.*cast it to float32"):
        to_tfrecord(tf.data.Dataset.from_tensor_slices((tf.zeros((4, 2), tf.bfloat16), tf.range(4))), tmp_path / "c")
    with pytest.raises(DataError, match="zero examples"):
        to_tfrecord(tf.data.Dataset.from_tensor_slices((np.zeros((0, 2)), np.zeros(0))), tmp_path / "d")
    with pytest.raises(ValueError, match="compression='LZ4'"):
        to_tfrecord((np.zeros((2, 1)), np.zeros(2)), tmp_path / "e", compression="lz4")
    with pytest.raises(ValueError, match="records_per_shard=0"):
        to_tfrecord((np.zeros((2, 1)), np.zeros(2)), tmp_path / "f", records_per_shard=0)
    with pytest.raises(DataError, match="x has dtype <U1"):
        to_tfrecord((np.array(["a", "b"]), np.zeros(2)), tmp_path / "g")
    with pytest.raises(DataError, match=r"y has dtype <U3.*StringLookup"):
        to_tfrecord((np.zeros((2, 1), np.float32), np.array(["cat", "dog"])), tmp_path / "h")
    with pytest.raises(DataError, match=r"infinite.*without its repeat"):
        to_tfrecord(tf.data.Dataset.from_tensor_slices((np.zeros((4, 2)), np.zeros(4))).repeat(), tmp_path / "i")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(DataError, match="a_file is a file, not a directory"):
        to_tfrecord((np.zeros((2, 1)), np.zeros(2)), tmp_path / "a_file")


def test_a_directory_of_someone_elses_files_is_refused(tmp_path):
    import numpy as np

    from tfopt.data import NumpySource, to_tfrecord
    from tfopt.errors import DataError

    (tmp_path / "part-00000.tfrecord").write_text("MY OWN SHARD DATA")
    with pytest.raises(DataError, match=r"named like tfopt.s shards .*part-00000.tfrecord"):
        to_tfrecord(NumpySource(np.zeros((4, 2), np.float32), np.arange(4)), tmp_path)
    assert (tmp_path / "part-00000.tfrecord").read_text() == "MY OWN SHARD DATA"


@pytest.mark.parametrize("num_workers", [1, 2], ids=["in_process", "worker_processes"])
def test_a_truncated_jpeg_is_named_and_nothing_is_packed(tmp_path, num_workers):
    folder = tfopt.data.generate_shapes(tmp_path / "shapes", images_per_class=4, image_size=32)
    cut = sorted(folder.rglob("*.jpg"))[6]
    cut.write_bytes(cut.read_bytes()[:-64])
    with pytest.raises(
        DataError,
        match=rf"{cut} is a JPEG cut short \(no end marker after its last scan\)\. "
        "Replace or delete the file",
    ):
        to_tfrecord(ImageFolderSource(folder, image_size=32), tmp_path / "out", num_workers=num_workers)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()
