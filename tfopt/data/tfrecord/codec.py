"""TFRecord files and `tf.train.Example` protos, written and read without TensorFlow.

Why not `tf.io.TFRecordWriter`: it holds the GIL while it serializes and compresses, so threads do not
speed it up (measured: 2 threads writing GZIP shards were slower than one), and a worker process that
imports TensorFlow pays seconds of start-up. The format is small and stable (each record is
`uint64 length | masked crc32c(length) | data | masked crc32c(data)`, the file optionally one GZIP or
ZLIB stream), so tfopt writes it in pure Python plus `zlib`/`hashlib`/`google_crc32c`,
which release the GIL on large buffers and start in milliseconds in a worker process. TensorFlow reads
the files as usual; the tests check that round trip.

Reading here serves `verify`: it checks every CRC and the stream end, so it can name a truncated or
corrupted shard instead of failing somewhere inside a training run.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from collections.abc import Iterable, Iterator

import google_crc32c

# TFRecordOptions compression names -> zlib window bits (31: gzip wrapper, 15: zlib wrapper).
COMPRESSIONS = {None: None, "GZIP": 31, "ZLIB": 15}
_MASK_DELTA = 0xA282EAD8
_LENGTH, _CRC = struct.Struct("<Q"), struct.Struct("<I")
_CHUNK_BYTES = 1 << 20


class CorruptRecordError(Exception):
    """A TFRecord file is truncated or a checksum does not match; the message says where."""


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _frame(record: bytes) -> tuple[bytes, bytes, bytes]:
    """The pieces of one framed record: header (length and its CRC), the record, its CRC."""
    length = _LENGTH.pack(len(record))
    return length + _CRC.pack(_masked_crc(length)), record, _CRC.pack(_masked_crc(record))


_SMALL_VARINTS = [bytes((value,)) for value in range(0x80)]


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL_VARINTS[value]  # the common case (tags, small labels), without a loop
    value &= 0xFFFFFFFFFFFFFFFF  # negative int64 values are encoded as 10-byte two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_head(field: int, length: int) -> bytes:
    """Tag and length of a length-delimited protobuf field whose payload is `length` bytes."""
    return _SMALL_VARINTS[(field << 3) | 2] + _varint(length)


def encode_example(features: dict[str, bytes | list[int]]) -> bytes:
    """Serializes a `tf.train.Example` whose features are single byte strings or lists of int64.

    The nested messages are laid out as a list of heads and payloads joined once at the end, so an
    image's bytes are copied once (this runs once per record of a conversion, holding the GIL).

    Args:
        features: Feature name -> `bytes` (a one-value BytesList) or a list of ints (an Int64List).

    Returns:
        The serialized proto; `tf.io.parse_single_example` reads it like a `tf.train.Example` built in
        Python. (Not always byte-identical to `SerializeToString()`: protobuf gives no order for map
        entries, and measured upb output orders them differently from one process to the next.)
    """
    pieces = []
    for name, value in features.items():
        key = name.encode()
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value)
            list_head = _field_head(1, len(value))  # BytesList.value
            feature_field = 1  # Feature.bytes_list
        else:
            value = b"".join(_varint(int(v)) for v in value)
            list_head = _field_head(1, len(value))  # Int64List.value, packed
            feature_field = 3  # Feature.int64_list
        list_length = len(list_head) + len(value)
        feature_head = _field_head(feature_field, list_length)
        entry_head = _field_head(1, len(key)) + key + _field_head(2, len(feature_head) + list_length)  # map key, value
        entry_length = len(entry_head) + len(feature_head) + list_length
        pieces += [_field_head(1, entry_length), entry_head, feature_head, list_head, value]  # Features.feature entry
    return b"".join([_field_head(1, sum(map(len, pieces))), *pieces])  # Example.features


def write_records(path: str | os.PathLike, records: Iterable[bytes], compression: str | None) -> dict:
    """Writes records to one TFRecord file and returns its record count, size and sha256.

    The caller chooses `path`; tfopt passes a temporary name and renames it once this returns, so a
    killed writer never leaves a file under its final name.

    Args:
        path: The file to create (overwritten).
        records: The serialized records, in order.
        compression: None, "GZIP" or "ZLIB" (the names `tf.io.TFRecordOptions` uses).

    Returns:
        `{"records": int, "bytes": int, "sha256": str}` of the file as written.
    """
    window_bits = COMPRESSIONS[compression]
    compressor = None if window_bits is None else zlib.compressobj(6, zlib.DEFLATED, window_bits)
    digest = hashlib.sha256()
    count = size = 0
    pending, pending_bytes = [], 0
    with open(path, "wb") as file:

        def emit(data: bytes) -> None:
            nonlocal size
            if compressor is not None:
                data = compressor.compress(data)
            if data:
                file.write(data)
                digest.update(data)
                size += len(data)

        for record in records:
            pending += _frame(record)
            pending_bytes += len(record) + 16
            count += 1
            # Batch small records into ~1 MB writes: fewer calls, and zlib releases the GIL per call.
            if pending_bytes >= _CHUNK_BYTES:
                emit(b"".join(pending))
                pending, pending_bytes = [], 0
        emit(b"".join(pending))
        if compressor is not None:
            tail = compressor.flush()
            file.write(tail)
            digest.update(tail)
            size += len(tail)
        file.flush()
        os.fsync(file.fileno())
    return {"records": count, "bytes": size, "sha256": digest.hexdigest()}


def read_records(path: str | os.PathLike, compression: str | None) -> Iterator[bytes]:
    """Yields the records of a TFRecord file, checking every length and data CRC.

    Raises:
        CorruptRecordError: The file ends inside a record, a CRC does not match, or the compressed stream
            is damaged or incomplete. The message gives the record index.
    """
    window_bits = COMPRESSIONS[compression]
    stream = _decompressed_chunks(path, window_bits)
    buffer = bytearray()
    index = 0
    exhausted = False

    def fill(needed: int) -> bool:
        nonlocal exhausted
        while len(buffer) < needed and not exhausted:
            try:
                buffer.extend(next(stream))
            except StopIteration:
                exhausted = True
        return len(buffer) >= needed

    while True:
        if not fill(1):
            return
        if not fill(12):
            raise CorruptRecordError(f"record {index}: the file ends inside the record header (truncated)")
        length_bytes = bytes(buffer[:8])
        (length,) = _LENGTH.unpack(length_bytes)
        (length_crc,) = _CRC.unpack(buffer[8:12])
        if _masked_crc(length_bytes) != length_crc:
            raise CorruptRecordError(f"record {index}: the length checksum does not match (corrupted)")
        if not fill(12 + length + 4):
            raise CorruptRecordError(f"record {index}: the file ends inside the record data (truncated)")
        data = bytes(buffer[12 : 12 + length])
        (data_crc,) = _CRC.unpack(buffer[12 + length : 16 + length])
        if _masked_crc(data) != data_crc:
            raise CorruptRecordError(f"record {index}: the data checksum does not match (corrupted)")
        del buffer[: 16 + length]
        index += 1
        yield data


def _decompressed_chunks(path, window_bits) -> Iterator[bytes]:
    decompressor = None if window_bits is None else zlib.decompressobj(window_bits)
    with open(path, "rb") as file:
        while True:
            chunk = file.read(_CHUNK_BYTES)
            if not chunk:
                break
            if decompressor is None:
                yield chunk
                continue
            try:
                yield decompressor.decompress(chunk)
            except zlib.error as error:
                raise CorruptRecordError(f"the compressed stream is damaged ({error})") from error
    if decompressor is not None:
        if not decompressor.eof:
            raise CorruptRecordError("the compressed stream ends early (truncated)")
        if decompressor.unused_data:
            raise CorruptRecordError("there are bytes after the end of the compressed stream")
