"""`ImageFolderSource`: class folders of JPEG/PNG files, the layout most image datasets ship in.

`root/<class_name>/<file>.jpg`; the label of a file is the index of its folder among the sorted folder
names (the same convention as `keras.utils.image_dataset_from_directory`), so labels do not depend on
the file system's listing order.
"""

from __future__ import annotations

import os
import pathlib

import tensorflow as tf

from tfopt.data import image_files, images, pipeline
from tfopt.data.source import DataSource, PipelineRequest, image_size_pair
from tfopt.errors import DataError, chained_messages

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


class ImageFolderSource(DataSource):
    """Images in class folders, decoded and resized to `image_size`, as float32 in [0, 1] with int32 labels.

    Args:
        path: The root directory holding one sub-directory per class.
        image_size: `(height, width)` every image is resized to (an int means a square).
        channels: 3 for RGB, 1 for grayscale.
        augment: Apply random flip, translation and brightness (after the cache, differently each epoch).

    Raises:
        DataError: `path` is missing, is not a directory, has no class folders, or holds no images, or
            `image_size` or `channels` is invalid.

    Example:
        >>> import tempfile
        >>> from tfopt.data import generate_shapes
        >>> folder = generate_shapes(tempfile.mkdtemp(), images_per_class=4, image_size=32)
        >>> source = ImageFolderSource(folder, image_size=(32, 32), augment=True)
        >>> source.class_names[:2], source.num_examples
        (['circle', 'cross'], 20)
        >>> images, labels = next(iter(source.pipeline(batch_size=8, optimized=True)))
        >>> tuple(images.shape), images.dtype.name, labels.dtype.name
        ((8, 32, 32, 3), 'float32', 'int32')
    """

    name = "image_folder"

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        image_size: int | tuple[int, int] | list[int] = (64, 64),
        channels: int = 3,
        augment: bool = False,
    ):
        self.path = pathlib.Path(path).expanduser()
        self.image_size = image_size_pair(self.name, image_size)
        if channels not in (1, 3):
            raise DataError(
                f"{self.name}: channels={channels!r} is not supported. Expected 1 (grayscale) or 3 (RGB).",
                setting="channels",
            )
        self.channels = channels
        self.augment = bool(augment)
        self.class_names, self.files, self.labels = _scan(self.path)

    @property
    def num_examples(self) -> int:
        """Number of image files found."""
        return len(self.files)

    def _build_pipeline(self, request: PipelineRequest) -> tf.data.Dataset:
        records = tf.data.Dataset.from_tensor_slices(([str(p) for p in self.files], tf.constant(self.labels, tf.int32)))
        # Sharding the list of files is sharding by data at no cost: every worker decodes only its files.
        records = records.shard(request.num_shards, request.shard_index)
        image_size, channels = self.image_size, self.channels

        def decode(path, label):
            return images.decode_image(tf.io.read_file(path), image_size, channels), label

        height, width = image_size
        pixels = height * width * channels
        return pipeline.assemble(
            records,
            decode=decode,
            finish=images.to_unit_float,
            augment=images.random_augment if self.augment else None,
            request=request,
            num_examples=len(range(request.shard_index, self.num_examples, request.num_shards)),
            decoded_example_bytes=pixels,
            output_example_bytes=4 * pixels,
            sharded_by_source=request.num_shards > 1,
        )

    def explain_failure(self, error: BaseException) -> str | None:
        """Names the damaged image files behind a decode error (TensorFlow names none), reading every file."""
        if not any("decode" in text.lower() or "uncompress" in text.lower() for text in chained_messages(error)):
            return None
        found = image_files.damaged(self.files)
        if not found:
            return None
        listed = "; ".join(f"{path} is {issue}" for path, issue in found[:5])
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        return (
            f"image_folder: {len(found)} image file(s) in {self.path} cannot be decoded: {listed}{more}. Replace "
            "or delete them, then run again."
        )

    def describe(self) -> str:
        height, width = self.image_size
        return (
            f"image folder {self.path}: {self.num_examples} images in {len(self.class_names)} classes, "
            f"resized to {height}x{width}x{self.channels}" + (", augmented" if self.augment else "")
        )

    def get_config(self) -> dict:
        return {
            "path": str(self.path),
            "image_size": list(self.image_size),
            "channels": self.channels,
            "augment": self.augment,
        }


def _scan(root: pathlib.Path) -> tuple[list[str], list[pathlib.Path], list[int]]:
    """Lists class folders and their image files, sorted, or raises a DataError saying what is wrong."""
    if not root.exists():
        raise DataError(
            f"image_folder: the directory {root} does not exist. Pass the root of a dataset laid out as "
            "<root>/<class_name>/<image>.jpg, or use tfopt.data.default_dataset_dir() for the built-in one.",
            setting="path",
        )
    if not root.is_dir():
        raise DataError(
            f"image_folder: {root} is a file, not a directory. Pass the directory holding the class folders.",
            setting="path",
        )
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        loose = [p.name for p in root.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS]
        hint = f" It holds {len(loose)} images directly; move them into one folder per class." if loose else ""
        raise DataError(
            f"image_folder: {root} has no class folders.{hint} Expected <root>/<class_name>/<image>.jpg.",
            setting="path",
        )
    files, labels = [], []
    for label, class_dir in enumerate(class_dirs):
        found = sorted(p for p in class_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        files.extend(found)
        labels.extend([label] * len(found))
    if not files:
        raise DataError(
            f"image_folder: the class folders of {root} ({[p.name for p in class_dirs][:5]}) hold no images with "
            f"extensions {list(IMAGE_EXTENSIONS)}. Put the images in the class folders.",
            setting="path",
        )
    return [p.name for p in class_dirs], files, labels
