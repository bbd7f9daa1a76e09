"""Tests of tfopt.data.tfrecord.source.TFRecordSource: the reader built from the manifest."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tfopt.data.arrays import NumpySource
from tfopt.data.image_folder import ImageFolderSource
from tfopt.data.tfrecord.convert import to_tfrecord
from tfopt.data.tfrecord.source import TFRecordSource
from tfopt.errors import DataError

from ..helpers import assert_same_batches, collect, unbatched


@pytest.fixture(scope="module", params=[None, "GZIP"])
def converted(request, shapes_dir, tmp_path_factory):
    """The 60-image shapes dataset converted to 8 shards, uncompressed and GZIP."""
    out = tmp_path_factory.mktemp("converted")
    return to_tfrecord(ImageFolderSource(shapes_dir, image_size=32), out, compression=request.param)


@pytest.fixture(scope="module")
def uncompressed(shapes_dir, tmp_path_factory):
    """The shapes dataset converted uncompressed, for tests where compression makes no difference."""
    return to_tfrecord(ImageFolderSource(shapes_dir, image_size=32), tmp_path_factory.mktemp("uncompressed"))


@pytest.mark.parametrize("augment", [False, True])
def test_optimized_and_naive_yield_identical_elements(converted, augment):
    source = TFRecordSource(converted, augment=augment)
    assert_same_batches(
        collect(source.pipeline(batch_size=9, optimized=False, shuffle=False, seed=2)),
        collect(source.pipeline(batch_size=9, optimized=True, shuffle=False, seed=2)),
    )


def test_optimized_without_cache_yields_identical_elements(converted, no_cache):
    source = TFRecordSource(converted)
    assert_same_batches(
        collect(source.pipeline(batch_size=9, optimized=False, shuffle=False)),
        collect(source.pipeline(batch_size=9, optimized=True, shuffle=False)),
    )


def test_shuffle_reorders_each_epoch_and_keeps_every_example(converted):
    source = TFRecordSource(converted)
    ordered = unbatched(collect(source.pipeline(batch_size=8, optimized=True, shuffle=False)))
    for optimized in (False, True):
        dataset = source.pipeline(batch_size=8, optimized=optimized, shuffle=True, seed=4)
        first, second = unbatched(collect(dataset)), unbatched(collect(dataset))
        assert sorted(first) == sorted(ordered) == sorted(second)
        assert first != ordered and first != second


@pytest.mark.parametrize("workers, expected_by_file", [(3, True), (11, False)])
def test_worker_shards_are_disjoint_and_cover_everything(uncompressed, workers, expected_by_file):
    source = TFRecordSource(uncompressed)
    everything = unbatched(collect(source.pipeline(batch_size=64, optimized=False, shuffle=False)))
    parts = [
        unbatched(collect(source.pipeline(batch_size=4, optimized=True, num_shards=workers, shard_index=index)))
        for index in range(workers)
    ]
    assert sorted(itertools.chain.from_iterable(parts)) == sorted(everything)
    assert len(source.files) == 8 and (len(source.files) >= workers) == expected_by_file


def test_sharding_by_data_when_fewer_files_than_workers(tmp_path):
    out = to_tfrecord(
        NumpySource(np.arange(20, dtype=np.int32)[:, None], np.arange(20)), tmp_path, records_per_shard=10
    )
    source = TFRecordSource(out)
    parts = [
        np.concatenate(
            [
                b[0][:, 0]
                for b in collect(
                    source.pipeline(batch_size=3, optimized=True, shuffle=False, num_shards=3, shard_index=i)
                )
            ]
        )
        for i in range(3)
    ]
    assert [part.tolist() for part in parts] == [list(range(i, 20, 3)) for i in range(3)]


def test_image_size_override_and_config_round_trip(uncompressed):
    source = TFRecordSource(uncompressed, image_size=[16, 20])
    ((x, _),) = collect(source.pipeline(batch_size=60, optimized=True, shuffle=False))
    assert x.shape == (60, 16, 20, 3)
    config = source.get_config()
    assert config == {"path": str(uncompressed), "image_size": [16, 20], "augment": False}
    assert TFRecordSource(**config).get_config() == config
    assert "60 examples in 8 shards" in source.describe()


def test_options_that_need_images_are_refused_for_arrays(tmp_path):
    out = to_tfrecord(NumpySource(np.zeros((4, 3), np.float32), np.zeros(4, np.int32)), tmp_path)
    with pytest.raises(ValueError, match=r"image_size=.*not\s+encoded images"):
        TFRecordSource(out, image_size=8)
    with pytest.raises(ValueError, match="augment=True needs images"):
        TFRecordSource(out, augment=True)


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        TFRecordSource(tmp_path / "nowhere")
