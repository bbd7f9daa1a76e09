"""Tests of tfopt.data.tfds_source.TfdsSource, on a tiny dataset built locally by a tfds builder."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tfopt.data.tfds_source import TfdsSource
from tfopt.errors import DataError

from .helpers import TfoptTinyPatches, TfoptTinyRegression, assert_same_batches, collect, unbatched

_SIZE = 30


def test_reads_the_prepared_split_as_float_images(tfds_dir):
    source = TfdsSource("tfopt_tiny_patches", split="train", data_dir=tfds_dir)
    assert source.num_examples == _SIZE and source.is_image
    ((x, y),) = collect(source.pipeline(batch_size=_SIZE, optimized=True, shuffle=False))
    assert x.dtype == np.float32 and x.shape == (_SIZE, 16, 16, 3)
    assert y.dtype == np.int32
    assert np.array_equal(np.argmax(x.mean(axis=(1, 2)), axis=-1), y)
    reference = tfds.as_numpy(
        TfoptTinyPatches(data_dir=str(tfds_dir)).as_dataset(split="train", as_supervised=True, shuffle_files=False)
    )
    expected = np.stack([image for image, _ in reference]).astype(np.float32) / 255.0
    np.testing.assert_allclose(x, expected, rtol=1e-6)


def test_a_float_target_is_kept_as_it_is(tmp_path):
    TfoptTinyRegression(data_dir=str(tmp_path)).download_and_prepare()
    source = TfdsSource("tfopt_tiny_regression", data_dir=tmp_path)
    expected = np.array([index * 0.37 + 0.5 for index in range(8)], np.float32)
    for optimized in (False, True):
        ((x, y),) = collect(source.pipeline(batch_size=8, optimized=optimized, shuffle=False))
        assert y.dtype == np.float32
        np.testing.assert_array_equal(np.sort(y), expected)  # not truncated to 0, 0, 1, 1, 1, 2, 2, 3
        np.testing.assert_array_equal(y, (x[:, 0].astype(np.float64) * 0.37 + 0.5).astype(np.float32))  # each its own


@pytest.mark.parametrize("augment", [False, True])
def test_optimized_and_naive_yield_identical_elements(tfds_dir, augment):
    source = TfdsSource("tfopt_tiny_patches", split="train", data_dir=tfds_dir, image_size=[12, 12], augment=augment)
    naive = collect(source.pipeline(batch_size=8, optimized=False, shuffle=False))
    optimized = collect(source.pipeline(batch_size=8, optimized=True, shuffle=False))
    assert_same_batches(naive, optimized)
    assert naive[0][0].shape == (8, 12, 12, 3)


def test_split_slicing_shuffle_and_sharding(tfds_dir):
    source = TfdsSource("tfopt_tiny_patches", split="train[:20]", data_dir=tfds_dir)
    assert source.num_examples == 20
    everything = unbatched(collect(source.pipeline(batch_size=64, optimized=False, shuffle=False)))
    shards = [
        unbatched(collect(source.pipeline(batch_size=3, optimized=True, num_shards=2, shard_index=i))) for i in (0, 1)
    ]
    assert sorted(shards[0] + shards[1]) == sorted(everything)
    assert len(shards[0]) == len(shards[1]) == 10


def test_config_round_trips(tfds_dir):
    source = TfdsSource("tfopt_tiny_patches", split="test", data_dir=tfds_dir, image_size=8)
    config = source.get_config()
    assert config == {
        "name": "tfopt_tiny_patches",
        "split": "test",
        "data_dir": str(tfds_dir),
        "download": False,
        "image_size": [8, 8],
        "augment": False,
    }
    assert TfdsSource(**config).num_examples == 9
    assert "tfopt_tiny_patches split 'test' (9 examples)" in source.describe()


def test_unprepared_dataset_fails_fast_offline_with_how_to_prepare(tmp_path):
    started = time.monotonic()
    with pytest.raises(DataError, match=r"not prepared.*tfds build mnist --data_dir") as caught:
        TfdsSource("mnist", data_dir=tmp_path)
    assert "download: true" in str(caught.value)
    # No network access is attempted: the check reads only the local directory.
    assert time.monotonic() - started < 30


def test_unknown_name_suggests_the_closest(tmp_path):
    with pytest.raises(DataError, match=r"'mnistt' is not a TensorFlow Datasets dataset. Did you mean 'mnist'"):
        TfdsSource("mnistt", data_dir=tmp_path)


@pytest.mark.parametrize("name", ["tfopt_tiny_patches:9.9.9", "tfopt_tiny_patches/nope", ""])
def test_a_version_or_config_tfds_does_not_have_is_named(tfds_dir, name):
    with pytest.raises(DataError, match=rf"{name!r} names no dataset, version or config") as caught:
        TfdsSource(name, data_dir=tfds_dir)
    assert caught.value.setting == "name"


def test_features_of_varying_shape_are_refused_up_front(tmp_path):
    class TfoptTinySequences(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {"tokens": tfds.features.Tensor(shape=(None,), dtype=np.int64), "label": np.int64}
            return self.dataset_info_from_configs(
                features=tfds.features.FeaturesDict(features), supervised_keys=("tokens", "label")
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for index in range(3):
                yield index, {"tokens": np.arange(index + 1), "label": index}

    TfoptTinySequences(data_dir=str(tmp_path)).download_and_prepare()
    with pytest.raises(DataError, match=r"'tokens' of 'tfopt_tiny_sequences' has shape \(None,\), which varies"):
        TfdsSource("tfopt_tiny_sequences", data_dir=tmp_path)


def test_unknown_split_lists_the_splits(tfds_dir):
    with pytest.raises(DataError, match=r"no split 'validation'.*'test', 'train'"):
        TfdsSource("tfopt_tiny_patches", split="validation", data_dir=tfds_dir)


def test_a_download_without_network_fails_within_seconds_and_says_so(tmp_path, monkeypatch):
    import socket

    import tensorflow_datasets as tfds

    tried = []

    def unreachable(address, timeout):
        tried.append((address, timeout))
        raise OSError(101, "Network is unreachable")

    def never(*args, **kwargs):
        raise AssertionError("download_and_prepare must not start without network access")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", never)
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    with pytest.raises(
        DataError,
        match=r"cannot download 'mnist': this machine has no network access to "
        r"storage.googleapis.com:443 .*tfds build mnist --data_dir",
    ) as caught:
        TfdsSource("mnist", data_dir=tmp_path, download=True)
    assert tried == [(("storage.googleapis.com", 443), 5.0)] and caught.value.setting == "download"
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    with pytest.raises(DataError, match=r"no network access to proxy.internal:3128"):
        TfdsSource("mnist", data_dir=tmp_path, download=True)
