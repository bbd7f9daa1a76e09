"""Tests of tfopt.data.tfrecord.codec: the TensorFlow-free TFRecord writer/reader and Example encoder."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfopt.data.tfrecord.codec import CorruptRecordError, encode_example, read_records, write_records


@pytest.mark.parametrize("size", [0, 9, 127, 128, 20_000, 3_000_000])  # 1-, 2-, 3- and 4-byte length varints
def test_encoded_example_equals_a_tf_train_example(size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    labels = list(range(size % 200))
    encoded = encode_example({"image": data, "label": labels, "": b"\x01"})
    reference = tf.train.Example(
        features=tf.train.Features(
            feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=labels)),
                "": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\x01"])),
            }
        )
    )
    assert tf.train.Example.FromString(encoded) == reference


def test_encoded_example_parses_like_a_tf_train_example():
    encoded = encode_example({"x": b"\x00\xffpixels", "y": [3, -1, 2**40]})
    parsed = tf.io.parse_single_example(
        encoded, {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([3], tf.int64)}
    )
    assert parsed["x"].numpy() == b"\x00\xffpixels"
    assert parsed["y"].numpy().tolist() == [3, -1, 2**40]


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_tensorflow_reads_what_is_written_and_so_do_we(tmp_path, compression):
    records = [bytes([i]) * (i * 37) for i in range(50)] + [b"x" * 3_000_000]
    info = write_records(tmp_path / "file", records, compression)
    assert info["records"] == 51 and info["bytes"] == (tmp_path / "file").stat().st_size
    read_by_tf = [
        r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "file"), compression_type=compression or "")
    ]
    assert read_by_tf == records
    assert list(read_records(tmp_path / "file", compression)) == records


def test_same_records_give_identical_bytes(tmp_path):
    first = write_records(tmp_path / "a", [b"abc", b"de"], "GZIP")
    second = write_records(tmp_path / "b", [b"abc", b"de"], "GZIP")
    assert first["sha256"] == second["sha256"]


def test_truncated_and_corrupted_files_are_detected(tmp_path):
    path = tmp_path / "file"
    write_records(path, [b"a" * 100, b"b" * 100], None)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(CorruptRecordError, match=r"record 1: .*truncated"):
        list(read_records(path, None))
    flipped = bytearray(data)
    flipped[20] ^= 0x01
    path.write_bytes(bytes(flipped))
    with pytest.raises(CorruptRecordError, match="record 0: the data checksum"):
        list(read_records(path, None))


def test_truncated_gzip_stream_is_detected(tmp_path):
    path = tmp_path / "file"
    write_records(path, [np.random.default_rng(0).bytes(5000)], "GZIP")
    path.write_bytes(path.read_bytes()[:-6])
    with pytest.raises(CorruptRecordError, match="truncated"):
        list(read_records(path, "GZIP"))
