"""Shard writers in worker processes: how `to_tfrecord` converts files on disk in parallel.

Why processes and not threads: building a record is Python work that holds the GIL (read the file,
encode the `tf.train.Example`, frame it), so threads take turns on one core and write slower than a plain
sequential loop, where worker processes write faster (docs/recipes/tfrecord.md).

Why plain `python` subprocesses running `serve()` and not `multiprocessing`: its spawn and forkserver
start methods import the caller's `__main__` script again in every worker (measured), and a training
script imports TensorFlow at its top, seconds per worker; fork is unsafe in a process that runs
TensorFlow's threads. This module imports neither TensorFlow nor the caller's script, so a worker
starts at once.

Tasks and answers are JSON lines over the workers' stdin and stdout. A task describes its records (e.g.
file paths and labels, see `task_records`) rather than carrying them, so nothing large
crosses a pipe. A worker whose stdin closes exits after its current shard, so killing the parent
leaves no lasting process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import queue
import subprocess
import sys
from collections.abc import Iterable, Iterator

from tfopt.data import image_files
from tfopt.data.tfrecord import codec
from tfopt.data.tfrecord.manifest import shard_file_name
from tfopt.errors import DataError, StorageError, storage_error


def write_shard(out_dir: pathlib.Path, index: int, records: Iterable[bytes], compression: str | None) -> dict:
    """Writes shard `index` under a temporary name and renames it into place once complete.

    Raises:
        StorageError: The disk refused the shard (full, ...); no part of it is left.

    Returns:
        The manifest entry of the shard: `{"file", "records", "bytes", "sha256"}`.

    Example:
        >>> import pathlib, tempfile
        >>> out = pathlib.Path(tempfile.mkdtemp())
        >>> shard = write_shard(out, 3, [b"first record", b"second"], "GZIP")
        >>> shard["file"], shard["records"], sorted(p.name for p in out.iterdir())
        ('part-00003.tfrecord.gz', 2, ['part-00003.tfrecord.gz'])
    """
    name = shard_file_name(index, compression)
    temporary = out_dir / f".{name}.tmp-{os.getpid()}"
    try:
        info = codec.write_records(temporary, records, compression)
        os.replace(temporary, out_dir / name)
    except OSError as error:
        storage = storage_error(error, out_dir / name, KEPT)
        if storage:
            raise storage from error
        raise
    finally:
        temporary.unlink(missing_ok=True)
    return {"file": name, **info}


# What a conversion that failed for want of space leaves usable.
KEPT = (
    "The shards written before it are kept, with the journal of the finished ones: the same conversion run again "
    "resumes from them where its input can be read from any point (an image folder, arrays), else starts afresh."
)


def task_records(task: dict) -> Iterator[bytes]:
    """The serialized records a conversion task describes (kind "image_files": the files' bytes).

    Raises:
        DataError: An image file is cut short or not an image (`tfopt.data.image_files`), naming it.

    Example:
        >>> import tempfile, tensorflow as tf
        >>> image = tempfile.NamedTemporaryFile(suffix=".jpg", delete=False).name
        >>> with open(image, "wb") as file:  # a JPEG's start, its last scan and its end marker
        ...     _ = file.write(b"\\xff\\xd8\\xff\\xe0 header \\xff\\xda scan \\xff\\xd9")
        >>> (record,) = task_records({"kind": "image_files", "files": [image], "labels": [4]})
        >>> tf.train.Example.FromString(record).features.feature["y"].int64_list.value
        [4]
    """
    if task["kind"] != "image_files":
        raise ValueError(f"unknown conversion task kind {task['kind']!r}")
    for path, label in zip(task["files"], task["labels"]):
        with open(path, "rb") as file:
            data = file.read()
        issue = image_files.problem(data)
        if issue:  # packed, it would fail training mid-epoch without a word of which file it was
            raise DataError(f"{path} is {issue}. Replace or delete the file, then convert again.")
        yield codec.encode_example({"x": data, "y": [label]})


class ShardWriterPool:
    """`count` worker processes writing shards; `write` may be called from `count` threads at once.

    Use it as a context manager: leaving the block closes the workers' stdin and waits for them (or
    kills them when the block is left by an exception, so Ctrl-C does not wait for shards to finish).

    Example:
        >>> import pathlib, tempfile
        >>> from tfopt.data import generate_shapes
        >>> folder = generate_shapes(tempfile.mkdtemp(), images_per_class=2, image_size=16)
        >>> files = sorted(str(p) for p in pathlib.Path(folder).rglob("*.jpg"))
        >>> out = pathlib.Path(tempfile.mkdtemp())
        >>> with ShardWriterPool(2) as pool:
        ...     shard = pool.write(out, 0, {"kind": "image_files", "files": files, "labels": [0] * 10}, None)
        >>> shard["file"], shard["records"]
        ('part-00000.tfrecord', 10)
    """

    def __init__(self, count: int):
        # `python -c` puts the working directory first on sys.path, where another checkout of tfopt (or a
        # file named like a standard module) would shadow this one: the worker replaces that entry.
        package_root = str(pathlib.Path(__file__).resolve().parents[2])
        command = [
            sys.executable,
            "-c",
            f"import sys; sys.path[0] = {package_root!r}; from tfopt.data.tfrecord.workers import serve; serve()",
        ]
        self._idle: queue.Queue[subprocess.Popen] = queue.Queue()
        self._workers = []
        self._out_dirs: set[pathlib.Path] = set()  # where killed workers may leave a shard half-written
        try:
            for _ in range(count):
                worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                self._workers.append(worker)
                self._idle.put(worker)
        except BaseException:
            self._stop(kill=True)
            raise

    def write(self, out_dir: pathlib.Path, index: int, task: dict, compression: str | None) -> dict:
        """Has an idle worker write shard `index` from `task`; returns the shard's manifest entry.

        Raises:
            DataError: The worker could not write the shard (e.g. a file vanished), or died.
        """
        self._out_dirs.add(pathlib.Path(out_dir))
        worker = self._idle.get()
        answer = ""
        try:
            if worker.poll() is None:
                request = {"out_dir": str(out_dir), "index": index, "task": task, "compression": compression}
                worker.stdin.write(json.dumps(request) + "\n")
                worker.stdin.flush()
                answer = worker.stdout.readline()
        except BrokenPipeError:
            pass
        finally:
            self._idle.put(worker)  # a dead worker goes back too, so that other threads fail instead of waiting
        if not answer.endswith("\n"):  # nothing, or half an answer: the worker died
            code = worker.wait()
            raise DataError(
                f"to_tfrecord: the worker process writing shard {index} exited with code {code} "
                "(its messages, if any, are above). Run again to resume the conversion."
            )
        result = json.loads(answer)
        if "error" in result:
            failure = StorageError if result.get("storage") else DataError
            raise failure(f"to_tfrecord: writing shard {index} failed: {result['error']}")
        return result

    def __enter__(self) -> ShardWriterPool:
        return self

    def __exit__(self, error_type, error, traceback) -> None:
        self._stop(kill=error_type is not None)

    def _stop(self, *, kill: bool) -> None:
        for worker in self._workers:
            if kill:
                worker.kill()
            with contextlib.suppress(BrokenPipeError):
                worker.stdin.close()
        for worker in self._workers:
            worker.wait()
            worker.stdout.close()
            for out_dir in self._out_dirs:  # a killed worker's shard, under its temporary name (`write_shard`)
                for temporary in out_dir.glob(f".part-*.tmp-{worker.pid}"):
                    temporary.unlink(missing_ok=True)


def serve() -> None:
    """A worker's loop: one JSON task per stdin line, one JSON answer per stdout line, until stdin ends."""
    try:
        for line in sys.stdin:
            request = json.loads(line)
            try:
                records = task_records(request["task"])
                answer = write_shard(
                    pathlib.Path(request["out_dir"]), request["index"], records, request["compression"]
                )
            except StorageError as error:  # the parent raises it again as it is
                answer = {"error": str(error), "storage": True}
            except Exception as error:  # noqa: BLE001 - the parent turns it into a DataError naming the shard
                answer = {"error": f"{type(error).__name__}: {error}"}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        sys.exit(130)
