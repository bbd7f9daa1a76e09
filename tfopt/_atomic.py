"""Writing a file so that readers, and a crash, see the old file or the new one, never a partial one.

Reports, resolved recipes, training records and TFRecord manifests all promise that a failed run leaves
earlier outputs as they were: each is written to a temporary file in the same directory, flushed to
disk, renamed over the target, and the directory synced so the rename itself survives a crash. The file
gets the mode a plain `open()` would give it (0666 less the umask): `mkstemp` makes it 0600.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tfopt.errors import storage_error


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Writes `text` to `path` atomically; returns the path.

    Raises:
        StorageError: The disk refused the write (full, read-only, ...); `path` is left as it was.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "out" / "report.json"
        >>> write_atomic(target, "{}").read_text()
        '{}'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            os.fchmod(file.fileno(), 0o666 & ~_umask())
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        storage = isinstance(error, OSError) and storage_error(error, path, f"{path} is as it was before.")
        if storage:
            raise storage from error
        raise
    _fsync_directory(path.parent)
    return path


def _umask() -> int:
    """The process's umask (reading it means setting it; it is put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    """Makes a rename inside `directory` durable (a no-op where directories cannot be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(descriptor)
