"""`NumpySource`: examples held in NumPy arrays, given directly or as `.npy`/`.npz` files.

In-memory data has no decode to parallelize or cache, so the optimized pipeline differs from the
naive one only by batching before any per-batch work and by a bounded prefetch. The source exists so
that numpy data goes through the same interface (sharding, TFRecord conversion, reports) as the rest.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import tensorflow as tf

from tfopt.data import pipeline
from tfopt.data.source import DataSource, PipelineRequest
from tfopt.errors import DataError


class NumpySource(DataSource):
    """Features `x` and labels `y` from NumPy arrays or `.npy`/`.npz` files, passed through unchanged.

    Args:
        x: An array whose first axis indexes examples, a `.npy` file holding it, or a `.npz` file
            holding both `x` and `y` under the keys `x_key` and `y_key` (then leave `y` as None).
        y: Labels: an array or a `.npy` file, with as many entries as `x` has examples.
        x_key: Key of the features inside a `.npz` file.
        y_key: Key of the labels inside a `.npz` file.

    Raises:
        DataError: A file is missing or unreadable, a key is missing, the lengths differ, or there are
            no examples.

    Example:
        >>> import tempfile, pathlib
        >>> source = NumpySource(np.zeros((100, 8), np.float32), np.arange(100) % 2)
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "train.npz"
        >>> np.savez(path, x=np.ones((6, 2), np.float32), y=np.arange(6))
        >>> NumpySource(path).num_examples  # keys "x" and "y"
        6
    """

    name = "numpy"

    def __init__(self, x, y=None, *, x_key: str = "x", y_key: str = "y"):
        self._x_argument, self._y_argument = x, y
        self.x_key, self.y_key = x_key, y_key
        if isinstance(x, (str, os.PathLike)) and str(x).endswith(".npz"):
            if y is not None:
                raise DataError(
                    f"numpy: x={str(x)!r} is a .npz file, which holds the labels too, but y={y!r} was also "
                    f"given. Leave y unset (the labels are read from key {y_key!r}) or pass x as a .npy file.",
                    setting="y",
                )
            self.x, self.y = _load_npz(pathlib.Path(x).expanduser(), x_key, y_key)
        else:
            if y is None:
                raise DataError(
                    "numpy: y (the labels) is missing. Pass y as an array or a .npy file, or pass x as a .npz "
                    f"file holding keys {x_key!r} and {y_key!r}.",
                    setting="y",
                )
            self.x, self.y = _as_array(x, "x"), _as_array(y, "y")
        _check_lengths(self.x, self.y, self._origin())

    @property
    def num_examples(self) -> int:
        """Number of examples (the length of the first axis)."""
        return len(self.x)

    def _build_pipeline(self, request: PipelineRequest) -> tf.data.Dataset:
        return in_memory_pipeline(
            self.x,
            self.y,
            finish=lambda x, y: (x, y),
            request=request,
        )

    def _origin(self) -> str:
        if isinstance(self._x_argument, (str, os.PathLike)):
            return f"{self._x_argument}" + (f" + {self._y_argument}" if self._y_argument is not None else "")
        return "in-memory arrays"

    def describe(self) -> str:
        return (
            f"numpy {self._origin()}: {self.num_examples} examples, x {self.x.dtype}{list(self.x.shape[1:])}, "
            f"y {self.y.dtype}{list(self.y.shape[1:])}"
        )

    def get_config(self) -> dict:
        """Returns the constructor arguments: paths stay paths (YAML-safe), arrays stay arrays (not YAML-safe)."""

        def plain(value):
            return str(value) if isinstance(value, os.PathLike) else value

        config = {"x": plain(self._x_argument), "y": plain(self._y_argument)}
        if config["y"] is None:
            del config["y"]
        config.update(x_key=self.x_key, y_key=self.y_key)
        return config


def in_memory_pipeline(
    x: np.ndarray,
    y: np.ndarray,
    *,
    finish,
    request: PipelineRequest,
) -> tf.data.Dataset:
    """The naive or optimized pipeline over arrays already in memory (used by the numpy and synthetic sources).

    `finish` is the element-wise conversion (e.g. uint8 -> float32) applied per element (naive) or per
    batch (optimized); there is nothing to decode and nothing worth caching.
    """
    # Shard the arrays in NumPy before they become constants, so a worker holds only its part.
    x_shard, y_shard = x[request.shard_index :: request.num_shards], y[request.shard_index :: request.num_shards]
    records = tf.data.Dataset.from_tensor_slices((x_shard, y_shard))
    return pipeline.assemble(
        records,
        decode=lambda a, b: (a, b),
        finish=finish,
        augment=None,
        request=request,
        num_examples=len(x_shard),
        decoded_example_bytes=int(x[:1].nbytes + y[:1].nbytes),
        output_example_bytes=int(4 * x[:1].size + y[:1].nbytes),
        sharded_by_source=request.num_shards > 1,
        cache_allowed=False,
    )


def _as_array(value, role: str) -> np.ndarray:
    if isinstance(value, (str, os.PathLike)):
        path = pathlib.Path(value).expanduser()
        if not path.is_file():
            raise DataError(
                f"numpy: the {role} file {path} does not exist. Pass the path of a .npy file (or an array).",
                setting=role,
            )
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise DataError(
                f"numpy: cannot read {path} as a .npy array ({error}). Save it with numpy.save().", setting=role
            ) from error
    return np.asarray(value)


def _load_npz(path: pathlib.Path, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(
            f"numpy: the file {path} does not exist. Pass the path of a .npz file saved with numpy.savez().",
            setting="x",
        )
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as error:
        raise DataError(
            f"numpy: cannot read {path} as a .npz archive ({error}). Save it with numpy.savez().", setting="x"
        ) from error
    missing = [key for key in (x_key, y_key) if key not in arrays]
    if missing:
        raise DataError(
            f"numpy: {path} has no array named {missing[0]!r}; it holds {sorted(arrays)}. Pass "
            "x_key=/y_key= naming the feature and label arrays.",
            setting="x_key" if missing[0] == x_key else "y_key",
        )
    return arrays[x_key], arrays[y_key]


def _check_lengths(x: np.ndarray, y: np.ndarray, origin: str) -> None:
    if x.ndim == 0 or len(x) == 0:
        raise DataError(
            f"numpy: {origin} holds zero examples (x has shape {x.shape}). Pass at least one example.", setting="x"
        )
    if y.ndim == 0 or len(y) != len(x):
        raise DataError(
            f"numpy: {origin}: x has {len(x)} examples but y has shape {y.shape}. Pass one label per example.",
            setting="y",
        )
