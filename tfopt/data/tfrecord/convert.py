"""`to_tfrecord`: convert a dataset to sharded TFRecord files, safely and in parallel.

Safety rules, because a conversion can take hours and is often killed (preemption, Ctrl-C, OOM):

* every shard is written under a temporary name and renamed when complete;
* a journal (`.tfopt_progress.jsonl`) records each finished shard, so a killed conversion of an input
  with random access (image folder, arrays) resumes where it stopped; other inputs are redone (their
  journal says only that the directory holds a conversion of tfopt's in progress);
* the manifest is written last and atomically, and readers require it, so a directory is either a
  complete conversion or unusable, never half-used (`tfopt.data.verify` re-checks every byte);
* converting the same input with the same options again is a no-op once `verify` finds every shard
  whole; a damaged conversion is written again (and `overwrite=True` always writes it again);
* a directory holding a complete conversion keeps it until its replacement is complete: the new one is
  written into a subdirectory (`.tfopt_replacement`) and put in place only then, by a step a rerun finishes
  if it is killed, so a failed or killed conversion never costs the user the one they had;
* one conversion at a time writes a directory (a lock the system drops with its process): another would
  resume from, or delete, the first one's shards.

Shards are written in parallel with tfopt's own TensorFlow-free writer (`codec`):
`tf.io.TFRecordWriter` holds the GIL, so nothing runs beside it (measured). Image files are converted
by worker processes (`tfrecord_workers`), because reading and encoding records is GIL-bound Python;
in-memory inputs (arrays, datasets) by threads, which still overlap compression, hashing and I/O.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import math
import os
import pathlib
import re
import threading
from collections.abc import Iterator

from tfopt.data.tfrecord import codec
from tfopt.data.tfrecord.inputs import ConversionInput, conversion_input
from tfopt.data.tfrecord.manifest import MANIFEST_NAME, read_manifest, write_manifest
from tfopt.data.tfrecord.verify import shard_problem, verify
from tfopt.data.tfrecord.workers import KEPT, ShardWriterPool, write_shard
from tfopt.errors import DataError, describe_error, storage_error

logger = logging.getLogger("tfopt")

DEFAULT_SHARD_BYTES = 64 * 2**20
# Even a small dataset gets several shards, so that workers can shard by file and reads interleave.
_MIN_SHARDS = 8
_JOURNAL_NAME = ".tfopt_progress.jsonl"
_REPLACEMENT = ".tfopt_replacement"
_OWN_FILE = re.compile(
    r"^(part-\d{5}\.tfrecord(\.gz|\.zz)?|\.part-.*\.tmp-\d+|\.tfopt_progress\.jsonl|\.tfopt_manifest\.json\..*\.tmp)$"
)


def to_tfrecord(
    source,
    out_dir: str | os.PathLike,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    records_per_shard: int | None = None,
    compression: str | None = None,
    num_workers: int | None = None,
    overwrite: bool = False,
) -> pathlib.Path:
    """Converts a dataset to sharded TFRecord files with a manifest, in parallel.

    Image folders keep their ENCODED JPEG/PNG bytes (decoding happens when reading, in parallel), which
    keeps the files about as small as the originals. Read the result with `TFRecordSource(out_dir)`.

    Args:
        source: An `ImageFolderSource` or image-folder path, a `NumpySource`, a `SyntheticSource`, an
            `(x, y)` tuple of arrays, a `TfdsSource`, or an unbatched `tf.data.Dataset` of `(x, y)` (one that
            never ends is refused where tf.data knows it, after a `repeat()`; one it does not know the length of,
            a `repeat()` then a `filter()`, is converted until it is stopped).
        out_dir: The directory to write (created if needed).
        shard_bytes: Target bytes per shard before compression; ignored when `records_per_shard` is set.
            Where the number of examples is known up front, there are at least 8 shards when the dataset
            has 8 examples or more (a dataset of unknown length, after a `filter`, is cut by size only).
        records_per_shard: Exact number of records per shard (the last one may hold fewer).
        compression: None, "GZIP" or "ZLIB".
        num_workers: Shards written at the same time (default: the number of CPUs); by worker processes
            for an image folder, by threads otherwise.
        overwrite: Write the conversion again even where `out_dir` holds a complete one, of this input or
            of another.

    Returns:
        `out_dir` as a `pathlib.Path`.

    Raises:
        DataError: The input cannot be converted or is empty, or `out_dir` holds a conversion of another
            input and `overwrite` is False.
        ValueError: An option is out of range.

    Example:
        >>> import tempfile
        >>> from tfopt.data import ImageFolderSource, TFRecordSource, generate_shapes
        >>> folder = generate_shapes(tempfile.mkdtemp(), images_per_class=4, image_size=32)
        >>> out = to_tfrecord(ImageFolderSource(folder, image_size=32), tempfile.mkdtemp(), compression="GZIP")
        >>> TFRecordSource(out).num_examples
        20
    """
    compression = _check_options(compression, shard_bytes, records_per_shard, num_workers)
    out_dir = pathlib.Path(out_dir).expanduser()
    conversion = conversion_input(source)
    if conversion.num_examples == 0:
        raise DataError(f"to_tfrecord: {conversion.description} holds zero examples; there is nothing to convert.")
    options = {"compression": compression, "shard_bytes": shard_bytes, "records_per_shard": records_per_shard}
    _make_directory(out_dir)
    with _only_writer(out_dir):
        _put_replacement_in_place(out_dir)
        if (out_dir / MANIFEST_NAME).exists() and _is_same_conversion(out_dir, conversion, options, overwrite):
            try:
                verify(out_dir, num_workers=num_workers)
            except DataError as damage:
                logger.warning("to_tfrecord: %s; writing the conversion again", describe_error(damage))
            else:
                logger.info("to_tfrecord: %s already holds this conversion (verified); nothing to do", out_dir)
                return out_dir
        _refuse_foreign_files(out_dir)
        replacing = (out_dir / MANIFEST_NAME).exists()
        target = out_dir / _REPLACEMENT if replacing else out_dir
        _make_directory(target)
        _write_conversion(target, conversion, options, num_workers or os.cpu_count() or 1)
        if replacing:
            _put_replacement_in_place(out_dir)
    return out_dir


def _write_conversion(out_dir: pathlib.Path, conversion: ConversionInput, options: dict, workers: int) -> None:
    """Writes the shards, then the manifest, then drops the journal."""
    if conversion.records is not None:
        shards, fingerprint = _write_random_access(out_dir, conversion, options, workers), conversion.fingerprint
    else:
        _remove_own_files(out_dir)
        _write_journal(out_dir, {"options": options, "sequential": True})
        shards, content_sha256 = _write_sequential(out_dir, conversion, options, workers)
        fingerprint = conversion.fingerprint or content_sha256
    total = sum(shard["records"] for shard in shards)
    if total == 0:
        _remove_own_files(out_dir)
        raise DataError(f"to_tfrecord: {conversion.description} yielded zero examples; there is nothing to convert.")
    write_manifest(
        out_dir,
        {
            "source": conversion.description,
            "fingerprint": fingerprint,
            "options": options,
            "compression": options["compression"],
            "num_examples": total,
            "features": conversion.features,
            "class_names": conversion.class_names,
            "shards": shards,
        },
    )
    _unlink(out_dir / _JOURNAL_NAME)


@contextlib.contextmanager
def _only_writer(out_dir: pathlib.Path) -> Iterator[None]:
    """Holds the directory's lock while a conversion writes it; a second conversion is refused at once.

    A `flock` on the directory itself: the system drops it with the process however that ends, so a killed
    conversion never leaves a stale lock, and nothing is left in the directory. Where the file system takes
    no such lock (some network ones), the conversion goes on without it.
    """
    import fcntl

    descriptor = os.open(out_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(
                f"to_tfrecord: another conversion is writing {out_dir} now (it holds the directory's lock). Wait for "
                "it to finish, or convert into another out_dir."
            ) from None
        except OSError as error:
            logger.debug("to_tfrecord: %s takes no lock (%s); converting without one", out_dir, error)
        yield
    finally:
        os.close(descriptor)


def _put_replacement_in_place(out_dir: pathlib.Path) -> None:
    """Puts a complete replacement (its manifest written) in place of the conversion `out_dir` held.

    Each step can be repeated, so a rerun finishes what a killed one began: the old manifest goes first (the
    directory is then no complete conversion), then the old shards the new ones do not replace, then each new
    shard still in the replacement is moved over the old one of its name (one no longer there was moved
    already), and the manifest last. A replacement without a manifest is unfinished and stays to be resumed.
    """
    replacement = out_dir / _REPLACEMENT
    if not (replacement / MANIFEST_NAME).is_file():
        with contextlib.suppress(OSError):
            replacement.rmdir()  # left empty by a kill after its manifest moved; else it holds work to resume
        return
    new = {shard["file"] for shard in read_manifest(replacement)["shards"]}
    _unlink(out_dir / MANIFEST_NAME)
    for path in out_dir.iterdir():
        if path.is_file() and _OWN_FILE.match(path.name) and path.name not in new:
            _unlink(path)
    try:
        for name in sorted(new):
            if (replacement / name).exists():
                os.replace(replacement / name, out_dir / name)
        os.replace(replacement / MANIFEST_NAME, out_dir / MANIFEST_NAME)
    except OSError as error:
        storage = storage_error(error, out_dir, f"Run the conversion again: it puts {replacement} in place.")
        if storage:
            raise storage from error
        raise
    _remove_own_files(replacement)
    replacement.rmdir()


def _check_options(compression, shard_bytes, records_per_shard, num_workers) -> str | None:
    if isinstance(compression, str):
        compression = {"": None, "NONE": None}.get(compression.upper(), compression.upper())
    if compression not in codec.COMPRESSIONS:
        raise ValueError(f"to_tfrecord: compression={compression!r} is not supported. Expected None, 'GZIP' or 'ZLIB'.")
    values = {"shard_bytes": shard_bytes, "records_per_shard": records_per_shard, "num_workers": num_workers}
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"to_tfrecord: {name}={value!r} is not a positive integer.")
    return compression


def _is_same_conversion(out_dir, conversion: ConversionInput, options: dict, overwrite: bool) -> bool:
    """True when `out_dir` already holds this conversion and may keep it; raises when it holds another one."""
    if overwrite:
        return False
    try:
        manifest = read_manifest(out_dir)
    except DataError as error:
        raise DataError(f"{error} To replace it, pass overwrite=True (tfopt-recipe convert --overwrite).") from error
    fingerprint = conversion.fingerprint or _content_sha256(conversion.stream())
    if manifest.get("fingerprint") == fingerprint:
        return manifest.get("options") == options  # same input, other options: redo it
    same_description = manifest.get("source") == conversion.description
    why = (
        " Its description is the same and its contents are not: it holds other data, or it yields other elements "
        "each pass (a shuffle or a random map without a seed), which convert to other files each time; seed those."
        if same_description
        else ""
    )
    raise DataError(
        f"to_tfrecord: {out_dir} already holds a conversion of another input ({manifest.get('source')!r}); "
        f"this input is {conversion.description!r}.{why} Pass another out_dir, or overwrite=True (tfopt-recipe "
        "convert --overwrite) to replace it."
    )


def _content_sha256(records: Iterator[bytes]) -> str:
    digest = hashlib.sha256()
    for record in records:
        digest.update(len(record).to_bytes(8, "little"))
        digest.update(record)
    return "content:" + digest.hexdigest()


def _plan(num_examples: int, example_bytes: int, options: dict) -> list[tuple[int, int]]:
    per_shard = options["records_per_shard"]
    if per_shard is not None:
        return [(start, min(num_examples, start + per_shard)) for start in range(0, num_examples, per_shard)]
    count = max(math.ceil(num_examples * example_bytes / options["shard_bytes"]), min(_MIN_SHARDS, num_examples))
    count = min(count, num_examples)
    # Even shards, their sizes differing by one record at most: rounding one size up would make fewer of them.
    return [(index * num_examples // count, (index + 1) * num_examples // count) for index in range(count)]


def _write_random_access(out_dir, conversion: ConversionInput, options: dict, workers: int) -> list[dict]:
    plan = _plan(conversion.num_examples, conversion.example_bytes, options)
    header = {"fingerprint": conversion.fingerprint, "options": options, "plan": plan}
    done = _resume(out_dir, header)
    journal_lock = threading.Lock()
    todo = [index for index in range(len(plan)) if index not in done]
    if done:
        logger.info("to_tfrecord: resuming %s, %d of %d shards already written", out_dir, len(done), len(plan))
    workers = min(workers, max(1, len(todo)))
    in_processes = conversion.task is not None and workers > 1
    # The worker processes are stopped before the threads are joined, so that on an error or Ctrl-C the
    # threads waiting for a worker's answer fail at once instead of waiting for their shards to finish.
    with concurrent.futures.ThreadPoolExecutor(workers) as pool, contextlib.ExitStack() as stack:
        processes = stack.enter_context(ShardWriterPool(workers)) if in_processes else None

        def write(index: int) -> dict:
            start, stop = plan[index]
            if processes is not None:
                shard = processes.write(out_dir, index, conversion.task(start, stop), options["compression"])
            else:
                shard = write_shard(out_dir, index, conversion.records(start, stop), options["compression"])
            try:
                with journal_lock, open(out_dir / _JOURNAL_NAME, "a") as journal:
                    journal.write(json.dumps(dict(shard, index=index)) + "\n")
                    journal.flush()
                    os.fsync(journal.fileno())
            except OSError as error:  # a line torn here is where a resumed conversion stops reading
                storage = storage_error(error, out_dir / _JOURNAL_NAME, KEPT)
                if storage:
                    raise storage from error
                raise
            return shard

        written = dict(zip(todo, pool.map(write, todo)))
    return [done.get(index) or written[index] for index in range(len(plan))]


def _resume(out_dir: pathlib.Path, header: dict) -> dict[int, dict]:
    """Returns the shards a previous, interrupted run of the same conversion finished; else starts afresh."""
    journal = out_dir / _JOURNAL_NAME
    done = {}
    try:
        lines = journal.read_text().splitlines()
        if lines and json.loads(lines[0]) == json.loads(json.dumps(header)):
            for line in lines[1:]:
                try:
                    entry = json.loads(line)
                except ValueError:
                    break  # a line torn by the kill: everything after it is redone
                if shard_problem(out_dir, entry, header["options"]["compression"]) is None:
                    done[entry.pop("index")] = entry
    except (OSError, ValueError):
        done = {}
    if not done:
        _remove_own_files(out_dir)
        _write_journal(out_dir, header)
    for path in out_dir.glob(".part-*.tmp-*"):  # shards a killed run left half-written
        _unlink(path)
    return done


def _write_journal(out_dir: pathlib.Path, header: dict) -> None:
    """Starts the journal: from here on the directory holds a conversion of tfopt's in progress, which a
    rerun resumes or redoes, and never takes for the user's own files."""
    journal = out_dir / _JOURNAL_NAME
    try:
        journal.write_text(json.dumps(header) + "\n")
    except OSError as error:
        storage = storage_error(error, journal, "Nothing was converted; the directory is as it was.")
        if storage:
            raise storage from error
        raise


def _make_directory(out_dir: pathlib.Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"to_tfrecord: {out_dir} is a file, not a directory. Pass a new or empty directory as out_dir.")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        storage = storage_error(error, out_dir, "Nothing was converted.")
        if storage:
            raise storage from error
        raise


def _write_sequential(out_dir, conversion: ConversionInput, options: dict, workers: int) -> tuple[list[dict], str]:
    digest = hashlib.sha256()
    plan = _plan(conversion.num_examples, conversion.example_bytes, options) if conversion.num_examples else None
    limit_records = (plan[0][1] - plan[0][0]) if plan else options["records_per_shard"]
    futures, pending, pending_bytes = [], [], 0
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for record in conversion.stream():
            digest.update(len(record).to_bytes(8, "little"))
            digest.update(record)
            pending.append(record)
            pending_bytes += len(record)
            full = len(pending) >= limit_records if limit_records else pending_bytes >= options["shard_bytes"]
            if full:
                futures.append(pool.submit(write_shard, out_dir, len(futures), pending, options["compression"]))
                pending, pending_bytes = [], 0
                # Bound the shards held in memory while writers catch up.
                while sum(not f.done() for f in futures) > 2 * workers:
                    concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
        if pending or not futures:
            futures.append(pool.submit(write_shard, out_dir, len(futures), pending, options["compression"]))
        shards = [future.result() for future in futures]
    return shards, "content:" + digest.hexdigest()


def _refuse_foreign_files(out_dir: pathlib.Path) -> None:
    """Files named like tfopt's shards in a directory without a conversion of tfopt's (manifest or
    progress journal) are the user's: writing shards there would replace them, so refuse. Other files
    are left alone and kept."""
    if not out_dir.is_dir() or (out_dir / MANIFEST_NAME).exists() or (out_dir / _JOURNAL_NAME).exists():
        return
    foreign = sorted(path.name for path in out_dir.iterdir() if _OWN_FILE.match(path.name))
    if foreign:
        raise DataError(
            f"to_tfrecord: {out_dir} already holds files named like tfopt's shards that are not "
            f"a tfopt conversion ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}). "
            "Choose a new or empty directory; tfopt never writes over files it did not make."
        )


def _remove_own_files(out_dir: pathlib.Path) -> None:
    """Deletes shards, temporaries, journal and manifest this module wrote; never anything else."""
    for path in out_dir.iterdir():
        if path.is_file() and (_OWN_FILE.match(path.name) or path.name == MANIFEST_NAME):
            _unlink(path)


def _unlink(path: pathlib.Path) -> None:
    """Deletes one of the conversion's own files; a directory that refuses it (read-only) says so."""
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        storage = storage_error(error, path, "The directory is as it was.")
        if storage:
            raise storage from error
        raise
