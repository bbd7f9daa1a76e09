"""Tests of tfopt.data.tfrecord.verify.verify: damaged shards are found and named."""

from __future__ import annotations

import logging
import os

import pytest

from tfopt.data.image_folder import ImageFolderSource
from tfopt.data.tfrecord.convert import to_tfrecord
from tfopt.data.tfrecord.verify import verify
from tfopt.errors import DataError


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_verify_names_a_damaged_shard_and_converting_again_repairs_it(shapes_dir, tmp_path, damage, caplog):
    out = to_tfrecord(ImageFolderSource(shapes_dir), tmp_path / "out", compression=None)
    assert verify(out) == {
        "num_examples": 60,
        "num_shards": 8,
        "bytes": sum(p.stat().st_size for p in out.glob("part-*")),
    }
    shard = out / "part-00003.tfrecord"
    whole = shard.read_bytes()
    data = bytearray(whole)
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
    with caplog.at_level(logging.WARNING, logger="tfopt"):
        to_tfrecord(ImageFolderSource(shapes_dir), out, compression=None)  # converting again repairs it
    assert "writing the conversion again" in caplog.text and "part-00003.tfrecord" in caplog.text
    assert shard.read_bytes() == whole and verify(out)["num_examples"] == 60


def test_overwrite_writes_a_whole_conversion_of_the_same_input_again(shapes_dir, tmp_path):
    out = to_tfrecord(ImageFolderSource(shapes_dir), tmp_path / "out")
    kept = tmp_path / "kept"  # hard links keep the first shards' inodes alive, so none is reused
    kept.mkdir()
    for path in out.glob("part-*"):
        os.link(path, kept / path.name)
    to_tfrecord(ImageFolderSource(shapes_dir), out)
    assert all(os.path.samefile(path, out / path.name) for path in kept.iterdir())
    to_tfrecord(ImageFolderSource(shapes_dir), out, overwrite=True)
    assert sorted(path.name for path in out.glob("part-*")) == sorted(path.name for path in kept.iterdir())
    for path in kept.iterdir():
        assert not os.path.samefile(path, out / path.name) and path.read_bytes() == (out / path.name).read_bytes()


def test_verify_detects_damage_inside_a_gzip_shard(shapes_dir, tmp_path):
    out = to_tfrecord(ImageFolderSource(shapes_dir), tmp_path / "out", compression="GZIP")
    shard = out / "part-00001.tfrecord.gz"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"part-00001.tfrecord.gz is corrupted"):
        verify(out)


def test_verify_needs_a_manifest(tmp_path):
    with pytest.raises(DataError, match="not a complete tfopt conversion"):
        verify(tmp_path)
