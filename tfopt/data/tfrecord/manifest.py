"""The manifest of a tfopt TFRecord conversion: what the shards hold and how to decode them.

The manifest (`tfopt_manifest.json`) is the last file a conversion writes, atomically (temporary file,
fsync, rename). Its presence is the only sign that a directory holds a complete conversion: readers
refuse a directory without one, so an interrupted conversion is never half-used.

Features are stored as an `x` and a `y` feature in each `tf.train.Example`:

* `x` of kind "image": the ENCODED file bytes (JPEG/PNG as they were on disk, typically 10x smaller
  than decoded pixels), decoded and resized to `image_size` when read, then scaled to float32 [0, 1];
* `x` of kind "tensor": the raw little-endian bytes of a fixed-shape array, with its dtype and shape;
  `finish: "unit_float"` records that the source scaled uint8 to float32 [0, 1] after reading;
* `y` of kind "int": an int64 list (a class index or a fixed-shape int vector), read back as `dtype`;
  `y` of kind "tensor": raw bytes, as for `x`.
"""

from __future__ import annotations

import json
import os
import pathlib

from tfopt._atomic import write_atomic
from tfopt._version import __version__
from tfopt.errors import DataError

MANIFEST_NAME = "tfopt_manifest.json"
FORMAT = "tfopt.tfrecord"
VERSION = 1
_SUFFIXES = {None: ".tfrecord", "GZIP": ".tfrecord.gz", "ZLIB": ".tfrecord.zz"}


def shard_file_name(index: int, compression: str | None) -> str:
    """The file name of shard `index` (ordered names, so a listing sorts in record order)."""
    return f"part-{index:05d}{_SUFFIXES[compression]}"


def write_manifest(out_dir: pathlib.Path, manifest: dict) -> None:
    """Writes the manifest atomically: a reader sees either no manifest or the complete one."""
    content = dict(manifest, format=FORMAT, version=VERSION, created_by=f"tfopt {__version__}")
    write_atomic(out_dir / MANIFEST_NAME, json.dumps(content, indent=2, sort_keys=True))


def read_manifest(out_dir: str | os.PathLike) -> dict:
    """Reads and checks the manifest of a conversion directory.

    Args:
        out_dir: The directory `to_tfrecord` wrote.

    Returns:
        The manifest as a dict.

    Raises:
        DataError: The directory does not exist, has no manifest (missing, or an interrupted
            conversion), the manifest is not JSON, or its format or version is not one this tfopt reads.
    """
    out_dir = pathlib.Path(out_dir).expanduser()
    if not out_dir.is_dir():
        raise DataError(
            f"tfrecord: the directory {out_dir} does not exist. Convert a dataset into it first with "
            "tfopt.data.to_tfrecord(source, out_dir) (or the `tfrecord` recipe)."
        )
    path = out_dir / MANIFEST_NAME
    if not path.is_file():
        raise DataError(
            f"tfrecord: {out_dir} holds no {MANIFEST_NAME}, so it is not a complete tfopt conversion (it may "
            "have been interrupted). Run tfopt.data.to_tfrecord(source, out_dir) again: it resumes or redoes it."
        )
    try:
        manifest = json.loads(path.read_text())
    except ValueError as error:
        raise DataError(f"tfrecord: {path} is not valid JSON ({error}). Convert the dataset again.") from error
    found_format = manifest.get("format") if isinstance(manifest, dict) else None
    if found_format != FORMAT:
        raise DataError(
            f"tfrecord: {path} is not a tfopt TFRecord manifest (format={found_format!r}, expected {FORMAT!r}). "
            "Convert the dataset with tfopt.data.to_tfrecord."
        )
    if manifest.get("version") != VERSION:
        raise DataError(
            f"tfrecord: {path} has manifest version {manifest.get('version')!r}; this tfopt ({__version__}) reads "
            f"version {VERSION}. Convert the dataset again with this tfopt, or use the tfopt that wrote it "
            f"({manifest.get('created_by', 'unknown')})."
        )
    return manifest
