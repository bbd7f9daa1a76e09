"""Tests of tfopt.data.tfrecord.verify.verify: damaged shards are found and named."""

from __future__ import annotations

import pytest

from tfopt.data.image_folder import ImageFolderSource
from tfopt.data.tfrecord.convert import to_tfrecord
from tfopt.data.tfrecord.verify import verify
from tfopt.errors import DataError


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_verify_names_a_damaged_shard(shapes_dir, tmp_path, damage):
    out = to_tfrecord(ImageFolderSource(shapes_dir), tmp_path / "out", compression=None)
    assert verify(out) == {
        "num_examples": 60,
        "num_shards": 8,
        "bytes": sum(p.stat().st_size for p in out.glob("part-*")),
    }
    shard = out / "part-00003.tfrecord"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(bytes(data[: len(data) // 2]))
        message = "part-00003.tfrecord has .* bytes, the manifest says"
    elif damage == "flip":
        data[len(data) // 2] ^= 0x10
        shard.write_bytes(bytes(data))
        message = "part-00003.tfrecord is corrupted: record .* checksum"
    else:
        shard.unlink()
        message = "part-00003.tfrecord is missing"
    with pytest.raises(DataError, match=message):
        verify(out)


def test_verify_detects_damage_inside_a_gzip_shard(shapes_dir, tmp_path):
    out = to_tfrecord(ImageFolderSource(shapes_dir), tmp_path / "out", compression="GZIP")
    shard = out / "part-00001.tfrecord.gz"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="part-00001.tfrecord.gz is corrupted"):
        verify(out)


def test_verify_needs_a_manifest(tmp_path):
    with pytest.raises(DataError, match="not a complete tfopt conversion"):
        verify(tmp_path)
