"""Tests of tfopt.data.image_folder.ImageFolderSource."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from PIL import Image

from tfopt.data.generated import DEFAULT_CLASSES
from tfopt.data.image_folder import ImageFolderSource
from tfopt.errors import DataError

from .helpers import assert_same_batches, collect, unbatched


def test_finds_classes_files_and_labels(shapes_dir):
    source = ImageFolderSource(shapes_dir, image_size=32)
    assert source.class_names == sorted(DEFAULT_CLASSES)
    assert source.num_examples == 60
    assert collections.Counter(source.labels) == dict.fromkeys(range(5), 12)
    assert all(source.class_names[label] == path.parent.name for path, label in zip(source.files, source.labels))
    assert "60 images in 5 classes" in source.describe()


def test_config_round_trips(shapes_dir):
    source = ImageFolderSource(shapes_dir, image_size=[24, 28], augment=True)
    config = source.get_config()
    assert config == {"path": str(shapes_dir), "image_size": [24, 28], "channels": 3, "augment": True}
    assert ImageFolderSource(**config).get_config() == config


def test_yields_float_images_matching_the_files(shapes_dir):
    source = ImageFolderSource(shapes_dir, image_size=32)
    batches = collect(source.pipeline(batch_size=16, optimized=False, shuffle=False))
    x, y = batches[0]
    assert x.dtype == np.float32 and x.shape == (16, 32, 32, 3)
    assert y.dtype == np.int32 and list(y) == source.labels[:16]
    expected = np.asarray(Image.open(source.files[3]), dtype=np.float32) / 255.0
    # TF's and PIL's JPEG decoders upsample chroma differently: a few levels apart at colour edges.
    difference = np.abs(x[3] - expected)
    assert difference.mean() < 2.0 / 255.0 and difference.max() < 10.0 / 255.0
    assert [len(b[1]) for b in batches] == [16, 16, 16, 12]


@pytest.mark.parametrize("augment", [False, True])
@pytest.mark.parametrize("cache", ["cache", "no_cache"])
def test_optimized_and_naive_yield_identical_elements(shapes_dir, augment, cache, request):
    if cache == "no_cache":
        request.getfixturevalue("no_cache")
    source = ImageFolderSource(shapes_dir, image_size=(20, 24), augment=augment)
    naive = collect(source.pipeline(batch_size=7, optimized=False, shuffle=False, seed=5))
    optimized = collect(source.pipeline(batch_size=7, optimized=True, shuffle=False, seed=5))
    assert_same_batches(naive, optimized)
    assert naive[0][0].shape == (7, 20, 24, 3)


def test_augmentation_changes_images_between_epochs_but_keeps_range(shapes_dir):
    source = ImageFolderSource(shapes_dir, image_size=32, augment=True)
    dataset = source.pipeline(batch_size=60, optimized=True, shuffle=False)
    ((first, labels),) = collect(dataset)
    ((second, _),) = collect(dataset)
    (plain,) = collect(
        ImageFolderSource(shapes_dir, image_size=32).pipeline(batch_size=60, optimized=True, shuffle=False)
    )
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, plain[0])
    assert first.min() >= 0.0 and first.max() <= 1.0
    np.testing.assert_array_equal(labels, plain[1])


def test_shuffle_reorders_each_epoch_and_keeps_every_example(shapes_dir):
    source = ImageFolderSource(shapes_dir, image_size=32)
    ordered = unbatched(collect(source.pipeline(batch_size=8, optimized=True, shuffle=False)))
    dataset = source.pipeline(batch_size=8, optimized=True, shuffle=True, seed=1)
    epoch_one, epoch_two = unbatched(collect(dataset)), unbatched(collect(dataset))
    assert sorted(epoch_one) == sorted(ordered) == sorted(epoch_two)
    assert epoch_one != ordered and epoch_one != epoch_two


def test_shards_are_disjoint_and_cover_everything(shapes_dir):
    source = ImageFolderSource(shapes_dir, image_size=16)
    everything = unbatched(collect(source.pipeline(batch_size=64, optimized=False, shuffle=False)))
    shards = [
        unbatched(collect(source.pipeline(batch_size=5, optimized=True, shuffle=True, num_shards=3, shard_index=i)))
        for i in range(3)
    ]
    assert [len(s) for s in shards] == [20, 20, 20]
    assert sorted(itertools.chain.from_iterable(shards)) == sorted(everything)


def test_drop_remainder_gives_static_batch_shape(shapes_dir):
    dataset = ImageFolderSource(shapes_dir, image_size=32).pipeline(batch_size=16, optimized=True, drop_remainder=True)
    assert dataset.element_spec[0].shape.as_list() == [16, 32, 32, 3]
    assert len(collect(dataset)) == 3


def test_resizes_png_and_grayscale(tmp_path):
    for name, size in (("a", (10, 14)), ("b", (30, 20))):
        (tmp_path / name).mkdir()
        Image.fromarray(np.full(size + (3,), 200, np.uint8)).save(tmp_path / name / "x.png")
    source = ImageFolderSource(tmp_path, image_size=8, channels=1)
    ((x, y),) = collect(source.pipeline(batch_size=2, optimized=True, shuffle=False))
    assert x.shape == (2, 8, 8, 1)
    assert list(y) == [0, 1]
    assert np.all(np.abs(x - x.mean()) < 0.02)


@pytest.mark.parametrize("suffix", ["png", "bmp", "gif", "jpg"])
def test_every_format_decodes_to_grayscale(tmp_path, suffix):
    (tmp_path / "a").mkdir()
    for number, level in enumerate((40, 200)):
        Image.fromarray(np.full((8, 8, 3), level, np.uint8)).save(tmp_path / "a" / f"{number}.{suffix}")
    source = ImageFolderSource(tmp_path, image_size=8, channels=1)
    ((x, _),) = collect(source.pipeline(batch_size=2, optimized=False, shuffle=False))
    assert x.shape == (2, 8, 8, 1)
    np.testing.assert_allclose(x.reshape(2, -1).mean(axis=1), [40 / 255, 200 / 255], atol=2 / 255)


def test_missing_directory_names_the_path(tmp_path):
    with pytest.raises(DataError, match=r"nowhere.*does not exist"):
        ImageFolderSource(tmp_path / "nowhere")


def test_file_instead_of_directory(tmp_path):
    (tmp_path / "file.jpg").write_bytes(b"x")
    with pytest.raises(DataError, match="is a file"):
        ImageFolderSource(tmp_path / "file.jpg")


def test_loose_images_without_class_folders(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.jpg")
    with pytest.raises(DataError, match=r"no class folders.*1 images directly"):
        ImageFolderSource(tmp_path)


def test_class_folders_without_images(tmp_path):
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "notes.txt").write_text("no image")
    with pytest.raises(DataError, match="hold no images"):
        ImageFolderSource(tmp_path)


@pytest.mark.parametrize(
    "kwargs, message, setting",
    [
        ({"image_size": [0, 3]}, "image_size=", "image_size"),
        ({"channels": 4}, "channels=4", "channels"),
    ],
)
def test_bad_arguments(shapes_dir, kwargs, message, setting):
    with pytest.raises(DataError, match=message) as error:
        ImageFolderSource(shapes_dir, **kwargs)
    assert error.value.setting == setting


def test_bad_pipeline_arguments(shapes_dir):
    source = ImageFolderSource(shapes_dir)
    with pytest.raises(ValueError, match="batch_size=0"):
        source.pipeline(batch_size=0, optimized=True)
    with pytest.raises(ValueError, match="shard_index=2"):
        source.pipeline(batch_size=4, optimized=True, num_shards=2, shard_index=2)
