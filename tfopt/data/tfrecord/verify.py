"""`verify`: re-read a TFRecord conversion and check it against its manifest.

A shard can be damaged after the conversion (a copy cut short, a bad disk, a sync tool that rewrote a
file). TensorFlow would report that as a DataLossError somewhere in the middle of training; `verify`
finds it up front and names the shard, by checking each file's size, every record's CRC, the record
count and the sha256 recorded when it was written.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import pathlib

from tfopt.data.tfrecord import codec
from tfopt.data.tfrecord.manifest import read_manifest
from tfopt.errors import DataError


def verify(out_dir: str | os.PathLike, *, num_workers: int | None = None) -> dict:
    """Re-reads a conversion and checks every shard's size, record CRCs, record count and sha256.

    Args:
        out_dir: A directory written by `to_tfrecord`.
        num_workers: Shards checked at the same time (default: the number of CPUs).

    Returns:
        `{"num_examples": int, "num_shards": int, "bytes": int}` of the verified conversion.

    Raises:
        DataError: The manifest is missing or unreadable, or a shard is missing, truncated or corrupted;
            the message names every bad shard and what is wrong with it.

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> from tfopt.data import NumpySource, to_tfrecord
        >>> out = to_tfrecord(NumpySource(np.zeros((10, 4), np.float32), np.arange(10)), tempfile.mkdtemp())
        >>> verify(out)["num_examples"]
        10
    """
    out_dir = pathlib.Path(out_dir).expanduser()
    manifest = read_manifest(out_dir)
    compression = manifest["compression"]
    with concurrent.futures.ThreadPoolExecutor(num_workers or os.cpu_count() or 1) as pool:
        problems = [p for p in pool.map(lambda s: shard_problem(out_dir, s, compression), manifest["shards"]) if p]
    if problems:
        raise DataError(
            f"tfrecord: {out_dir} is damaged: " + "; ".join(problems) + ". Convert the dataset again with "
            "tfopt.data.to_tfrecord(source, out_dir) (it writes a damaged conversion again) or "
            "`tfopt-recipe convert RECIPE --out DIR`."
        )
    return {
        "num_examples": manifest["num_examples"],
        "num_shards": len(manifest["shards"]),
        "bytes": sum(shard["bytes"] for shard in manifest["shards"]),
    }


def shard_problem(out_dir: pathlib.Path, shard: dict, compression: str | None) -> str | None:
    """What is wrong with one shard, or None where it matches its entry (of the manifest, or of a conversion's
    journal)."""
    path = out_dir / shard["file"]
    if not path.is_file():
        return f"shard {shard['file']} is missing"
    size = path.stat().st_size
    if size != shard["bytes"]:
        return f"shard {shard['file']} has {size} bytes, the manifest says {shard['bytes']} (truncated or modified)"
    count = 0
    try:
        for _ in codec.read_records(path, compression):
            count += 1
    except codec.CorruptRecordError as error:
        return f"shard {shard['file']} is corrupted: {error}"
    if count != shard["records"]:
        return f"shard {shard['file']} holds {count} records, the manifest says {shard['records']}"
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != shard["sha256"]:
        return f"shard {shard['file']} does not match its sha256 checksum (corrupted)"
    return None
