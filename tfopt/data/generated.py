"""The embedded default dataset: small, real, learnable JPEG images of five shapes, generated locally.

tfopt must be able to run a recipe end to end on a machine with no internet and no dataset of its own,
and an input-pipeline benchmark is only honest when it decodes real JPEG files from disk. So instead of
random noise (which a model cannot learn, and which compresses unlike a photo) we draw shapes with PIL:
a circle, square, triangle, cross or ring at a random position, size, colour and rotation on a textured
noisy background, with a few distractor strokes. A small CNN learns it well above chance in a few epochs,
but not instantly.

The output is a plain image-folder dataset (`<out_dir>/<class>/<index>.jpg`) so every image-folder
tool, tfopt's `ImageFolderSource` included, reads it. Generation is deterministic for a seed and
atomic: images go into a temporary sibling directory, a manifest is written last, and the directory is
renamed into place, so a reader never sees a half-written dataset.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import shutil
import uuid

import numpy as np

from tfopt.data.drawing import DRAWABLE_SHAPES, draw_example, shape_id
from tfopt.errors import DataError

logger = logging.getLogger("tfopt")

DEFAULT_CLASSES = DRAWABLE_SHAPES
MANIFEST_NAME = "tfopt_shapes.json"
_FORMAT_VERSION = 1
_DATASET_NAME = "shapes-v1"
_DEFAULT_IMAGES_PER_CLASS = 120
_DEFAULT_IMAGE_SIZE = 64
_JPEG_QUALITY = 90


def generate_shapes(
    out_dir: str | os.PathLike,
    *,
    images_per_class: int = 100,
    image_size: int = 64,
    seed: int = 0,
    classes: tuple[str, ...] | list[str] = DEFAULT_CLASSES,
) -> pathlib.Path:
    """Writes the shapes image-classification dataset as JPEG files in class folders.

    Calling it again on a directory that already holds a complete dataset with the same parameters does
    nothing, so it is safe to call at the start of every run. A directory left incomplete (no manifest,
    or files missing) is deleted and regenerated, but only when it holds nothing but this dataset's own
    files, so a mistyped path never deletes user data.

    Args:
        out_dir: The dataset directory to create. Its parent is created if needed.
        images_per_class: Number of images drawn for each class (>= 1).
        image_size: Height and width of the square images in pixels (>= 16).
        seed: Seed of the random generator; the same seed gives byte-identical files.
        classes: Class names, each one of `DEFAULT_CLASSES` (the shapes the generator can draw).

    Returns:
        The dataset directory as a `pathlib.Path`.

    Raises:
        ValueError: An argument is out of range or a class name is not a drawable shape.
        DataError: `out_dir` exists, is not a complete dataset with these parameters, and holds files
            that this generator did not write.

    Example:
        >>> path = generate_shapes("/tmp/shapes", images_per_class=10, image_size=32)
        >>> sorted(p.name for p in path.iterdir() if p.is_dir())
        ['circle', 'cross', 'ring', 'square', 'triangle']
    """
    classes = tuple(classes)
    _check_arguments(images_per_class, image_size, classes)
    out_dir = pathlib.Path(out_dir).expanduser()
    parameters = {
        "format_version": _FORMAT_VERSION,
        "images_per_class": int(images_per_class),
        "image_size": int(image_size),
        "seed": int(seed),
        "classes": list(classes),
    }
    if _is_complete(out_dir, parameters):
        return out_dir
    if out_dir.exists():
        _remove_incomplete(out_dir, parameters)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out_dir)
    temporary = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        _write_images(temporary, parameters)
        _write_manifest(temporary, parameters)
        try:
            os.rename(temporary, out_dir)
        except OSError:
            # Another process finished the same dataset first (rename onto a non-empty directory fails).
            if not _is_complete(out_dir, parameters):
                raise
            logger.debug("shapes dataset at %s was completed by another process", out_dir)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return out_dir


def default_dataset_dir() -> pathlib.Path:
    """Returns the directory of tfopt's embedded default dataset, generating it on first use.

    The dataset is 5 classes x 120 JPEG images of 64x64 pixels (about 1.5 MB, a few seconds to
    generate). It lives in `$TFOPT_DATA_DIR/shapes-v1` when that variable is set (useful on read-only
    home directories and in CI), else in `~/.cache/tfopt/datasets/shapes-v1`.

    Returns:
        The dataset directory, complete and ready to read.

    Example:
        >>> from tfopt.data import ImageFolderSource
        >>> source = ImageFolderSource(default_dataset_dir())
    """
    from tfopt.environment_variables import directory

    root = directory("TFOPT_DATA_DIR", purpose="tfopt's generated datasets")
    base = root or pathlib.Path.home() / ".cache" / "tfopt" / "datasets"
    return generate_shapes(
        base / _DATASET_NAME,
        images_per_class=_DEFAULT_IMAGES_PER_CLASS,
        image_size=_DEFAULT_IMAGE_SIZE,
        seed=0,
    )


def _check_arguments(images_per_class: int, image_size: int, classes: tuple[str, ...]) -> None:
    if not isinstance(images_per_class, int) or images_per_class < 1:
        raise ValueError(
            f"generate_shapes: images_per_class={images_per_class!r} is not a positive integer. "
            "Pass an int >= 1, e.g. images_per_class=100."
        )
    if not isinstance(image_size, int) or image_size < 16:
        raise ValueError(
            f"generate_shapes: image_size={image_size!r} is too small to draw a recognisable shape. "
            "Pass an int >= 16, e.g. image_size=64."
        )
    unknown = [name for name in classes if name not in DRAWABLE_SHAPES]
    if unknown or not classes:
        raise ValueError(
            f"generate_shapes: classes={list(classes)!r} contains shapes the generator cannot draw "
            f"({unknown!r}). Expected a non-empty subset of {list(DEFAULT_CLASSES)!r}."
        )
    if len(set(classes)) != len(classes):
        raise ValueError(f"generate_shapes: classes={list(classes)!r} repeats a class; list each shape once.")


def _file_name(index: int) -> str:
    return f"{index:05d}.jpg"


def _is_complete(out_dir: pathlib.Path, parameters: dict) -> bool:
    manifest = out_dir / MANIFEST_NAME
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    if recorded.get("parameters") != parameters:
        return False
    count = parameters["images_per_class"]
    return all((out_dir / name / _file_name(count - 1)).is_file() for name in parameters["classes"])


def _remove_incomplete(out_dir: pathlib.Path, parameters: dict) -> None:
    """Deletes an incomplete or stale dataset, refusing if the directory holds anything foreign."""
    if not out_dir.is_dir():
        raise DataError(
            f"generate_shapes: {out_dir} exists and is not a directory. Pass a path to a new or "
            "existing dataset directory."
        )
    foreign = []
    for entry in out_dir.iterdir():
        if entry.name == MANIFEST_NAME:
            continue
        if entry.is_dir() and entry.name in DRAWABLE_SHAPES and all(f.suffix == ".jpg" for f in entry.iterdir()):
            continue
        foreign.append(entry.name)
    if foreign:
        raise DataError(
            f"generate_shapes: {out_dir} is not a complete shapes dataset with parameters {parameters} "
            f"and holds files the generator did not write ({sorted(foreign)[:5]}). Pass an empty or new "
            "directory, or delete this one."
        )
    logger.info("regenerating incomplete or different shapes dataset at %s", out_dir)
    shutil.rmtree(out_dir)


def _remove_stale_temporaries(out_dir: pathlib.Path) -> None:
    """Deletes temporary siblings left by generator processes that were killed mid-way."""
    for candidate in out_dir.parent.glob(f".{out_dir.name}.tmp-*"):
        try:
            pid = int(candidate.name.split(".tmp-")[1].split("-")[0])
        except (IndexError, ValueError):
            continue
        if not _process_alive(pid):
            shutil.rmtree(candidate, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_images(directory: pathlib.Path, parameters: dict) -> None:
    size = parameters["image_size"]
    for name in parameters["classes"]:
        class_dir = directory / name
        class_dir.mkdir(parents=True)
        for index in range(parameters["images_per_class"]):
            # One generator per image, keyed by (seed, shape, index): an image does not depend on which
            # other classes were requested or how many images came before it.
            rng = np.random.default_rng([parameters["seed"], shape_id(name), index])
            image = draw_example(rng, name, size)
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=_JPEG_QUALITY)
            (class_dir / _file_name(index)).write_bytes(buffer.getvalue())


def _write_manifest(directory: pathlib.Path, parameters: dict) -> None:
    counts = dict.fromkeys(parameters["classes"], parameters["images_per_class"])
    manifest = {"name": _DATASET_NAME, "parameters": parameters, "counts": counts}
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True))
