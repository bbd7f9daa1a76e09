"""Helpers shared by the tfopt.data tests: batch comparisons and a tiny offline tfds builder."""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds


def collect(dataset):
    """All batches of one pass over `dataset` as lists of NumPy `(x, y)` pairs."""
    return [(np.asarray(x), np.asarray(y)) for x, y in dataset]


def assert_same_batches(first, second):
    """Asserts two lists of `(x, y)` batches are equal batch by batch: values, dtypes and shapes."""
    assert len(first) == len(second), f"{len(first)} batches != {len(second)} batches"
    for index, ((x1, y1), (x2, y2)) in enumerate(zip(first, second)):
        assert x1.dtype == x2.dtype and y1.dtype == y2.dtype, f"batch {index}: dtypes differ"
        assert x1.shape == x2.shape and y1.shape == y2.shape, f"batch {index}: shapes differ"
        np.testing.assert_array_equal(x1, x2, err_msg=f"batch {index}: x differs")
        np.testing.assert_array_equal(y1, y2, err_msg=f"batch {index}: y differs")


def unbatched(batches):
    """Flattens `(x, y)` batches to a list of `(x_bytes, y)` keys, to compare contents as multisets."""
    return [(x[i].tobytes(), y[i].tobytes()) for x, y in batches for i in range(len(y))]


class TfoptTinyPatches(tfds.core.GeneratorBasedBuilder):
    """30 train / 9 test 16x16 images whose label is the brightest colour channel; built offline."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {"image": tfds.features.Image(shape=(16, 16, 3)), "label": tfds.features.ClassLabel(num_classes=3)}
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        return {"train": self._generate_examples(30, 0), "test": self._generate_examples(9, 1)}

    def _generate_examples(self, count, seed):
        rng = np.random.default_rng(seed)
        for index in range(count):
            image = rng.integers(0, 120, (16, 16, 3), dtype=np.uint8)
            image[..., index % 3] += 120
            yield index, {"image": image, "label": index % 3}


class TfoptTinyRegression(tfds.core.GeneratorBasedBuilder):
    """8 feature vectors with a float target (a regression's); built offline."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "features": tfds.features.Tensor(shape=(4,), dtype=np.float32),
                    "target": tfds.features.Tensor(shape=(), dtype=np.float32),
                }
            ),
            supervised_keys=("features", "target"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for index in range(8):
            yield index, {"features": np.full(4, index, np.float32), "target": np.float32(index * 0.37 + 0.5)}


class TfoptTinyFlags(tfds.core.GeneratorBasedBuilder):
    """24 numbered examples with a bool label, prepared into several files: `first` numbers the first one."""

    VERSION = tfds.core.Version("1.0.0")
    first = 0

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "x": tfds.features.Tensor(shape=(2,), dtype=np.float32),
                    "flag": tfds.features.Tensor(shape=(), dtype=np.bool_),
                }
            ),
            supervised_keys=("x", "flag"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for index in range(self.first, self.first + 24):
            yield index, {"x": np.array([index, -index], np.float32), "flag": index % 3 == 0}
