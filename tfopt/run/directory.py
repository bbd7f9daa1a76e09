"""The run directory: a new one per run, or an earlier one taken up again with `--resume`.

A new run never writes into a directory that holds files, so a run cannot overwrite the outputs of an
earlier one. `--resume` is the one exception, and it checks that the directory holds a run of the same
recipe (only `train.epochs` may differ, so a finished run can be trained longer): resuming with other
settings would mix two experiments in one directory and restore checkpoints into another model.

One run at a time writes into a directory: the run holds an advisory lock on `.tfopt.lock` in it
(`fcntl.flock`, which the kernel drops when the holder dies, so a killed run's lock is taken over at once).
Worker processes started by `run --workers N` inherit their launcher's lock: they hold it while any of
them lives, so a second run is refused even while orphaned workers of a killed launcher still train.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import pathlib
from collections.abc import Iterator
from typing import Any

from tfopt.errors import TfoptError

RESOLVED_RECIPE_NAME = "recipe.yaml"
CHECKPOINTS_NAME = "checkpoints"
TRAINING_NAME = "training.json"
LOCK_NAME = ".tfopt.lock"
# Set by a launcher for the processes it starts: the run directory whose lock they inherited.
LOCK_HELD_ENV = "TFOPT_RUN_DIR_LOCKED"
_log = logging.getLogger("tfopt")
# Settings a resumed run may change: more epochs continue a finished run.
_RESUMABLE_CHANGES = {("train", "epochs")}


def check_out_dir(out_dir: str | os.PathLike | None, *, resume: bool) -> None:
    """Refuses, before any work starts, a directory the run may not use: for a new run one that holds
    files, for `--resume` none given or one that holds no run.

    Raises:
        TfoptError: The directory cannot be used; the message says what to give instead.
    """
    path = None if out_dir is None else pathlib.Path(out_dir)
    if path is not None:
        check_writable(path, "--out")
    if resume and path is None:
        raise TfoptError(
            "--resume needs --out RUN_DIR: the directory of the run to continue, e.g. "
            "tfopt-recipe run recipes/small_cnn.yaml --out runs/small_cnn-20250101-120000 --resume."
        )
    if resume and not (path / RESOLVED_RECIPE_NAME).is_file():
        raise TfoptError(
            f"--resume: {path} holds no run to continue (no {RESOLVED_RECIPE_NAME} in it). Give the "
            "directory of an earlier run, or drop --resume to start a new run there."
        )
    if not resume and path is not None and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise TfoptError(
            f"--out {path} already holds files; a run never writes over earlier outputs. Choose a "
            "new directory, delete this one, or add --resume to continue the run it holds."
        )


def check_writable(path: pathlib.Path, what: str) -> None:
    """Refuses, before any work is done for it, a directory this process could not write into: a file, or a
    path whose nearest existing directory is read-only or not ours.

    Raises:
        TfoptError: Naming `what` (the option, e.g. "--out"), the directory and the reason.
    """
    try:
        if _exists(path) and not path.is_dir():
            raise TfoptError(f"{what} {path} is a file, not a directory. Give a directory (new or empty) instead.")
        existing = path.absolute()
        while not _exists(existing):
            existing = existing.parent
    except OSError as error:  # a name too long, a loop of links: the system refuses the path itself
        raise TfoptError(f"{what} {path}: the system refuses this path ({error.strerror}). Give another one.") from None
    if not existing.is_dir():
        raise TfoptError(
            f"{what} {path}: {existing} is a file, so no directory can be made there. Give another directory."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        reason = "is on a read-only file system" if _read_only(existing) else "is not writable by this user"
        raise TfoptError(f"{what} {path}: {existing} {reason}. Give a directory you can write to.")


def _exists(path: pathlib.Path) -> bool:
    """Whether `path` exists, raising where the system refuses to tell (`Path.exists` says False for a name too
    long on newer Pythons)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def _read_only(path: pathlib.Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


@contextlib.contextmanager
def run_dir_lock(path: pathlib.Path) -> Iterator[int | None]:
    """Holds the lock of a run directory while the block runs, so no second run writes into it.

    Yields:
        The locked file descriptor, for worker processes to inherit (`subprocess.Popen(pass_fds=...)`,
        with LOCK_HELD_ENV set to the directory); None in a process that inherited its launcher's lock.

    Raises:
        TfoptError: Another live process holds the lock; the message names it and what to do.
    """
    if os.environ.get(LOCK_HELD_ENV) == os.path.realpath(path):
        yield None
        return
    lock_path = path / LOCK_NAME
    while True:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = _holder(lock_path)
            raise TfoptError(
                f"{path} is in use by another tfopt run ({holder}); two runs writing one directory "
                "would mix their checkpoints and reports. Wait for it to finish, stop it, or give "
                "another --out."
            ) from None
        if os.path.exists(lock_path) and os.stat(lock_path).st_ino == os.fstat(descriptor).st_ino:
            break  # else the holder removed the file between our open and our lock: lock the new one
        os.close(descriptor)
    earlier = _holder(lock_path)
    if earlier != "no process":
        _log.warning("%s: taking over the lock of a run that is no longer running (%s)", path, earlier)
    os.ftruncate(descriptor, 0)
    os.write(descriptor, str(os.getpid()).encode())
    try:
        yield descriptor
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        os.close(descriptor)


def _holder(lock_path: pathlib.Path) -> str:
    try:
        text = lock_path.read_text().strip()
    except OSError:
        text = ""
    return f"started by process {text}" if text else "no process"


def new_run_dir(name: str, out_dir: str | os.PathLike | None, runs_root: str | os.PathLike) -> pathlib.Path:
    """Creates the run's directory: `out_dir` (new or empty) or `<runs_root>/<name>-<timestamp>`.

    Raises:
        TfoptError: `out_dir` holds files already.
    """
    check_out_dir(out_dir, resume=False)
    if out_dir is not None:
        path = pathlib.Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = pathlib.Path(runs_root)
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        path = root / (f"{name}-{stamp}" + (f"-{attempt}" if attempt > 1 else ""))
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise TfoptError(f"Could not create a new run directory under {root}: 999 runs started this second.")


def training_record(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """What the run's training did, as its chief saved it (training.json), or None where it did not train."""
    path = pathlib.Path(run_dir) / TRAINING_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def discard_unused(path: pathlib.Path) -> bool:
    """Removes a run directory that holds nothing but the resolved recipe the run saved (and empty
    folders), and returns True; leaves any other directory alone and returns False.

    A run that fails before its first output (its model cannot be built) then leaves no directory behind
    for the user to clean up; the runner calls this only for a directory it made itself.
    """
    entries = sorted(path.rglob("*"), reverse=True)  # deepest first, so folders are empty when removed
    if [entry for entry in entries if not entry.is_dir() and entry.name != LOCK_NAME] != [path / RESOLVED_RECIPE_NAME]:
        return False
    for entry in entries:
        entry.rmdir() if entry.is_dir() else entry.unlink(missing_ok=True)
    path.rmdir()
    return True


def resumed_run_dir(out_dir: str | os.PathLike | None, resolved: dict[str, Any]) -> pathlib.Path:
    """Checks that `out_dir` holds a run of the same recipe and returns it.

    Args:
        out_dir: The directory given with --out.
        resolved: The recipe now asked for, as `RecipeFile.to_dict()`.

    Raises:
        TfoptError: No directory was given, it holds no run, or its run used other settings (the message
            names the first differing key and both values).
    """
    from tfopt.recipe_file import load_recipe

    check_out_dir(out_dir, resume=True)
    path = pathlib.Path(out_dir)
    earlier = load_recipe(path / RESOLVED_RECIPE_NAME).to_dict()
    changes = differences(earlier, resolved)
    blocking = [
        found
        for found in changes
        if found[0] not in _RESUMABLE_CHANGES or (found[0] == ("train", "epochs") and found[2] < found[1])
    ]
    if blocking:
        key, before, now = blocking[0]
        raise TfoptError(
            f"--resume: the run in {path} was made with {'.'.join(map(str, key))}: {before!r}, and "
            f"this command asks for {now!r}. A run continues with the settings it started with "
            f"(only train.epochs may grow); start a new run (another --out) to change them."
        )
    return path


def differences(earlier: Any, now: Any, key: tuple = ()) -> list[tuple[tuple, Any, Any]]:
    """Every key path where two resolved recipes differ, with both values, in file order.

    Example:
        >>> differences({"train": {"epochs": 1, "seed": 0}}, {"train": {"epochs": 2, "seed": 0}})
        [(('train', 'epochs'), 1, 2)]
    """
    if isinstance(earlier, dict) and isinstance(now, dict):
        names = list(earlier) + [name for name in now if name not in earlier]
        return [found for name in names for found in differences(earlier.get(name), now.get(name), (*key, name))]
    return [] if earlier == now else [(key, earlier, now)]
