"""Tests of tfopt.data.tfrecord.manifest: reading and checking the conversion manifest."""

from __future__ import annotations

import json

import pytest

from tfopt.data.tfrecord.manifest import MANIFEST_NAME, VERSION, read_manifest, shard_file_name, write_manifest
from tfopt.errors import DataError


def test_written_manifest_reads_back_with_format_and_version(tmp_path):
    write_manifest(tmp_path, {"shards": [], "num_examples": 0})
    manifest = read_manifest(tmp_path)
    assert manifest["version"] == VERSION and manifest["shards"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_NAME]


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match=r"nowhere does not exist.*to_tfrecord"):
        read_manifest(tmp_path / "nowhere")


def test_directory_without_manifest_is_an_incomplete_conversion(tmp_path):
    (tmp_path / shard_file_name(0, None)).write_bytes(b"")
    with pytest.raises(DataError, match=r"not a complete tfopt conversion.*interrupted"):
        read_manifest(tmp_path)


def test_unknown_version_names_both_versions(tmp_path):
    write_manifest(tmp_path, {"shards": []})
    content = json.loads((tmp_path / MANIFEST_NAME).read_text())
    content["version"] = 99
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(content))
    with pytest.raises(DataError, match=f"manifest version 99; this tfopt .* reads version {VERSION}"):
        read_manifest(tmp_path)


def test_foreign_or_broken_json(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text('{"format": "other"}')
    with pytest.raises(DataError, match="not a tfopt TFRecord manifest"):
        read_manifest(tmp_path)


def test_shard_names_sort_in_order_and_carry_the_compression():
    assert shard_file_name(3, None) == "part-00003.tfrecord"
    assert shard_file_name(12, "GZIP") == "part-00012.tfrecord.gz"
    assert shard_file_name(2, "ZLIB") < shard_file_name(10, "ZLIB")
