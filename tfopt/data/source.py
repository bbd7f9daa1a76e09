"""The `DataSource` contract every dataset source implements.

A source knows where its examples live and how to turn them into a `tf.data.Dataset` of `(x, y)`
batches. It offers the same data through two pipelines: the naive one a newcomer writes (sequential
map, no prefetch, no cache), which is the honest "before" of a measurement, and the optimized one
tfopt's data recipe uses as the "after". Both must yield the same elements, and with `shuffle=False`
in the same order, so that a speed-up is never bought with different data; the tests check this
element by element for every source.

The constructor is the schema: `get_config()` returns the constructor's keyword arguments, so a YAML
item `data: {source: image_folder, path: ..., image_size: [64, 64]}` is exactly
`ImageFolderSource(path=..., image_size=[64, 64])`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

from tfopt.errors import DataError


@dataclasses.dataclass(frozen=True)
class PipelineRequest:
    """The arguments of `DataSource.pipeline`, checked once there and handed to each source as one value."""

    batch_size: int
    optimized: bool
    shuffle: bool
    seed: int
    drop_remainder: bool
    num_shards: int
    shard_index: int
    ram_budget_bytes: int | None = None
    cache: bool = True
    deterministic: bool = True


class DataSource(abc.ABC):
    """A dataset that can build a naive and an optimized `tf.data` pipeline of `(x, y)` batches.

    Subclasses set the class attribute `name` (the registry name used in YAML), take their whole
    configuration as constructor arguments, and implement `_build_pipeline` (given a checked
    `PipelineRequest`), `describe` and `get_config`.

    Example:
        >>> from tfopt.data import SyntheticSource
        >>> source = SyntheticSource(kind="image", examples=8, image_size=(4, 4))
        >>> x, y = next(iter(source.pipeline(batch_size=4, optimized=True)))
        >>> isinstance(source, DataSource), x.shape.as_list(), y.shape.as_list()
        (True, [4, 4, 4, 3], [4])
    """

    name: ClassVar[str] = ""

    def pipeline(
        self,
        *,
        batch_size: int,
        optimized: bool,
        shuffle: bool = True,
        seed: int = 0,
        drop_remainder: bool = False,
        num_shards: int = 1,
        shard_index: int = 0,
        ram_budget_bytes: int | None = None,
        cache: bool = True,
        deterministic: bool = True,
    ):
        """Builds the `tf.data.Dataset` of `(x, y)` batches for one epoch.

        Args:
            batch_size: Examples per batch (per worker when sharded).
            optimized: False for the pipeline as a newcomer writes it (sequential map, no prefetch, no
                cache); True for the tuned one (parallel maps, cache within a RAM budget, bounded
                prefetch). Both yield the same elements.
            shuffle: Whether to shuffle the examples, differently in each epoch.
            seed: Seed of the shuffle and of any random augmentation.
            drop_remainder: Drop the last, smaller batch (static batch shapes, e.g. for XLA or TPUs).
            num_shards: Number of workers reading disjoint parts of the data.
            shard_index: This worker's index in `[0, num_shards)`.
            ram_budget_bytes: What the optimized pipeline's cache, autotuned buffers and prefetch may hold;
                `tfopt.data.ram_budget`'s default share of the available RAM when None.
            cache: Whether the optimized pipeline may cache decoded examples (within the budget).
            deterministic: Keep element order in the optimized pipeline; False lets parallel stages
                deliver out of order (faster, different order).

        Returns:
            A `tf.data.Dataset` yielding `(x, y)` batches.
        """
        check_pipeline_arguments(self.name, batch_size=batch_size, num_shards=num_shards, shard_index=shard_index)
        return self._build_pipeline(
            PipelineRequest(
                batch_size=batch_size,
                optimized=optimized,
                shuffle=shuffle,
                seed=seed,
                drop_remainder=drop_remainder,
                num_shards=num_shards,
                shard_index=shard_index,
                ram_budget_bytes=ram_budget_bytes,
                cache=cache,
                deterministic=deterministic,
            )
        )

    @abc.abstractmethod
    def _build_pipeline(self, request: PipelineRequest):
        """Builds the pipeline `pipeline()` describes, for arguments it has already checked."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Returns a one-line human description (kind, location, size) for reports and manifests."""

    @abc.abstractmethod
    def get_config(self) -> dict[str, Any]:
        """Returns the constructor's keyword arguments, so `type(source)(**source.get_config())` round-trips."""

    def explain_failure(self, error: BaseException) -> str | None:
        """Why reading this source failed, where TensorFlow's error does not say (a damaged file, named),
        or None. Called only after a failure, so it may read the source's files."""
        return None

    def __repr__(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.get_config().items())
        return f"{type(self).__name__}({arguments})"


def check_pipeline_arguments(source_name: str, *, batch_size: int, num_shards: int, shard_index: int) -> None:
    """Validates the arguments every `pipeline()` takes, before any TensorFlow work starts.

    Raises:
        ValueError: `batch_size` or `num_shards` is not a positive integer, or `shard_index` is out of range.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"{source_name}: batch_size={batch_size!r} is not a positive integer. Pass e.g. batch_size=32."
        )
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(
            f"{source_name}: num_shards={num_shards!r} is not a positive integer. Pass the number of workers, "
            "or 1 when not sharding."
        )
    if not isinstance(shard_index, int) or not 0 <= shard_index < num_shards:
        raise ValueError(
            f"{source_name}: shard_index={shard_index!r} is not in [0, num_shards={num_shards}). Pass this "
            "worker's index, e.g. the task index from TF_CONFIG."
        )


def image_size_pair(source_name: str, image_size) -> tuple[int, int]:
    """Normalizes an `image_size` given as an int or a `[height, width]` pair (YAML gives lists).

    Raises:
        DataError: The value is not a positive int or a pair of positive ints.
    """
    if isinstance(image_size, int) and not isinstance(image_size, bool):
        image_size = (image_size, image_size)
    try:
        height, width = (int(v) for v in image_size)
        valid = all(isinstance(v, int) and not isinstance(v, bool) for v in image_size) and height > 0 and width > 0
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise DataError(
            f"{source_name}: image_size={image_size!r} is not a size. Expected an int or [height, width] of "
            "positive ints, e.g. image_size: [64, 64].",
            setting="image_size",
        )
    return height, width
