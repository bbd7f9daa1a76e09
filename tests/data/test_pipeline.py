"""Tests of tfopt.data.pipeline: cache placement, bounded prefetch and options of the two pipelines."""

from __future__ import annotations

import shutil

import pytest
import tensorflow as tf

from tfopt.data.image_folder import ImageFolderSource

from .helpers import assert_same_batches, collect


def test_optimized_pipeline_caches_decoded_images_after_the_first_epoch(shapes_dir, tmp_path):
    copy = shutil.copytree(shapes_dir, tmp_path / "copy")
    source = ImageFolderSource(copy, image_size=32, augment=True)
    dataset = source.pipeline(batch_size=16, optimized=True, shuffle=True)
    first = collect(dataset)
    shutil.rmtree(copy)  # a second epoch can only succeed from the cache
    second = collect(dataset)
    assert [len(b[1]) for b in second] == [len(b[1]) for b in first]


def test_without_budget_the_optimized_pipeline_reads_the_files_every_epoch(shapes_dir, tmp_path, no_cache):
    copy = shutil.copytree(shapes_dir, tmp_path / "copy")
    dataset = ImageFolderSource(copy, image_size=32).pipeline(batch_size=16, optimized=True)
    collect(dataset)
    shutil.rmtree(copy)
    with pytest.raises(tf.errors.NotFoundError):
        collect(dataset)


def test_naive_pipeline_never_caches(shapes_dir, tmp_path):
    copy = shutil.copytree(shapes_dir, tmp_path / "copy")
    dataset = ImageFolderSource(copy, image_size=32).pipeline(batch_size=16, optimized=False)
    collect(dataset)
    shutil.rmtree(copy)
    with pytest.raises(tf.errors.NotFoundError):
        collect(dataset)


def test_options_of_optimized_and_sharded_pipelines(shapes_dir):
    source = ImageFolderSource(shapes_dir, image_size=32)
    naive = source.pipeline(batch_size=8, optimized=False)
    optimized = source.pipeline(batch_size=8, optimized=True, num_shards=2, shard_index=1)
    assert naive.options().autotune.ram_budget is None
    assert optimized.options().autotune.ram_budget > 0
    assert optimized.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF


def test_same_seed_same_shuffled_order(shapes_dir):
    source = ImageFolderSource(shapes_dir, image_size=16, augment=True)
    assert_same_batches(
        collect(source.pipeline(batch_size=8, optimized=True, seed=3)),
        collect(source.pipeline(batch_size=8, optimized=True, seed=3)),
    )
