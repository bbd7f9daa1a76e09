"""The run directory: a new one per run, or an earlier one taken up again with `--resume`.

A new run never writes into a directory that holds files, so a run cannot overwrite the outputs of an
earlier one. `--resume` is the one exception, and it checks that the directory holds a run of the same
recipe (only `train.epochs` may differ, so a finished run can be trained longer): resuming with other
settings would mix two experiments in one directory and restore checkpoints into another model.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
from typing import Any

from tfopt.errors import TfoptError

RESOLVED_RECIPE_NAME = "recipe.yaml"
CHECKPOINTS_NAME = "checkpoints"
TRAINING_NAME = "training.json"
# Settings a resumed run may change: more epochs continue a finished run.
_RESUMABLE_CHANGES = {("train", "epochs")}


def check_out_dir(out_dir: str | os.PathLike | None, *, resume: bool) -> None:
    """Refuses, before any work starts, a directory the run may not use: for a new run one that holds
    files, for `--resume` none given or one that holds no run.

    Raises:
        TfoptError: The directory cannot be used; the message says what to give instead.
    """
    path = None if out_dir is None else pathlib.Path(out_dir)
    if resume and path is None:
        raise TfoptError("--resume needs --out RUN_DIR: the directory of the run to continue, e.g. "
                         "tfopt-recipe run recipes/small_cnn.yaml --out runs/small_cnn-20250101-120000 --resume.")
    if resume and not (path / RESOLVED_RECIPE_NAME).is_file():
        raise TfoptError(f"--resume: {path} holds no run to continue (no {RESOLVED_RECIPE_NAME} in it). Give the "
                         "directory of an earlier run, or drop --resume to start a new run there.")
    if not resume and path is not None and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise TfoptError(f"--out {path} already holds files; a run never writes over earlier outputs. Choose a "
                         "new directory, delete this one, or add --resume to continue the run it holds.")


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
    if [entry for entry in entries if not entry.is_dir()] != [path / RESOLVED_RECIPE_NAME]:
        return False
    for entry in entries:
        entry.rmdir() if entry.is_dir() else entry.unlink()
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
    blocking = [found for found in changes if found[0] not in _RESUMABLE_CHANGES
                or found[0] == ("train", "epochs") and found[2] < found[1]]
    if blocking:
        key, before, now = blocking[0]
        raise TfoptError(f"--resume: the run in {path} was made with {'.'.join(map(str, key))}: {before!r}, and "
                         f"this command asks for {now!r}. A run continues with the settings it started with "
                         f"(only train.epochs may grow); start a new run (another --out) to change them.")
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
