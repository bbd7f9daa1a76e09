"""Whether an encoded image file is whole, read from its bytes without decoding it (no TensorFlow).

A JPEG cut short (a copy or download interrupted) fails in TensorFlow's decoder as `jpeg::Uncompress
failed` in the middle of an epoch, naming no file, and a TFRecord conversion would pack it silently.
Each format says where it ends: a JPEG's last scan (SOS, FF DA) is followed by its end marker (EOI, FF D9;
bytes after it are allowed, cameras pad), a PNG ends with its IEND chunk, a GIF with its trailer byte, and a
BMP states its size in its header. Checking that costs one pass over bytes the caller has already read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"


def problem(data: bytes) -> str | None:
    """What is wrong with an encoded image, or None where it looks whole.

    Example:
        >>> problem(b"\\xff\\xd8\\xff\\xe0" + b"\\x00" * 8 + b"\\xff\\xda" + b"scan" + b"\\xff\\xd9") is None
        True
        >>> problem(b"\\xff\\xd8\\xff\\xe0" + b"\\x00" * 8 + b"\\xff\\xda" + b"scan, cut")
        'a JPEG cut short (no end marker after its last scan)'
    """
    if data.startswith(b"\xff\xd8\xff"):
        scan = data.rfind(b"\xff\xda")
        if scan < 0:
            return "a JPEG cut short (no image scan)"
        return None if data.find(b"\xff\xd9", scan) >= 0 else "a JPEG cut short (no end marker after its last scan)"
    if data.startswith(_PNG_SIGNATURE):
        return None if _PNG_END in data else "a PNG cut short (no IEND chunk)"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return None if data.rstrip(b"\x00").endswith(b";") else "a GIF cut short (no trailer)"
    if data.startswith(b"BM") and len(data) >= 6:
        size = int.from_bytes(data[2:6], "little")
        return None if len(data) >= size else f"a BMP cut short ({len(data)} of its {size} bytes)"
    if not data:
        return "an empty file"
    return f"not a JPEG, PNG, GIF or BMP file (it starts with {data[:8]!r})"


def damaged(paths: Iterable[str | os.PathLike]) -> list[tuple[str, str]]:
    """The files among `paths` that are not whole images, with what is wrong with each."""
    found = []
    for path in paths:
        with open(path, "rb") as file:
            issue = problem(file.read())
        if issue:
            found.append((os.fspath(path), issue))
    return found
