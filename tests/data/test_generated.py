"""Tests of tfopt.data.generated: the embedded shapes dataset."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from tfopt.data import generated
from tfopt.data.generated import DEFAULT_CLASSES, MANIFEST_NAME, default_dataset_dir, generate_shapes
from tfopt.errors import DataError


def _digest(directory):
    files = sorted(p for p in directory.rglob("*.jpg"))
    return [(p.relative_to(directory).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest()) for p in files]


def test_writes_class_folders_with_counts_and_decodable_images(tmp_path):
    path = generate_shapes(tmp_path / "shapes", images_per_class=7, image_size=40)
    assert path == tmp_path / "shapes"
    assert sorted(p.name for p in path.iterdir() if p.is_dir()) == sorted(DEFAULT_CLASSES)
    for name in DEFAULT_CLASSES:
        files = sorted((path / name).iterdir())
        assert len(files) == 7
        with Image.open(files[0]) as image:
            assert image.format == "JPEG"
            assert np.asarray(image).shape == (40, 40, 3)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    assert manifest["counts"] == dict.fromkeys(DEFAULT_CLASSES, 7)


def test_images_are_not_constant_and_differ_between_examples(tmp_path):
    path = generate_shapes(tmp_path / "shapes", images_per_class=3, image_size=32, classes=("circle",))
    first, second = (np.asarray(Image.open(path / "circle" / f"0000{i}.jpg"), dtype=np.float32) for i in (0, 1))
    assert first.std() > 10.0
    assert np.abs(first - second).mean() > 10.0


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    a = generate_shapes(tmp_path / "a", images_per_class=4, image_size=32, seed=3)
    b = generate_shapes(tmp_path / "b", images_per_class=4, image_size=32, seed=3)
    c = generate_shapes(tmp_path / "c", images_per_class=4, image_size=32, seed=4)
    assert _digest(a) == _digest(b)
    assert [h for _, h in _digest(a)] != [h for _, h in _digest(c)]


def test_an_image_does_not_depend_on_the_other_classes_requested(tmp_path):
    full = generate_shapes(tmp_path / "full", images_per_class=2, image_size=32)
    rings = generate_shapes(tmp_path / "rings", images_per_class=2, image_size=32, classes=("ring",))
    assert (full / "ring" / "00001.jpg").read_bytes() == (rings / "ring" / "00001.jpg").read_bytes()


def test_second_call_on_complete_directory_is_a_no_op(tmp_path):
    path = generate_shapes(tmp_path / "shapes", images_per_class=2, image_size=32)
    marker_mtime = (path / MANIFEST_NAME).stat().st_mtime_ns
    (path / "circle" / "00000.jpg").write_bytes(b"sentinel")  # a rewrite would replace this
    assert generate_shapes(path, images_per_class=2, image_size=32) == path
    assert (path / "circle" / "00000.jpg").read_bytes() == b"sentinel"
    assert (path / MANIFEST_NAME).stat().st_mtime_ns == marker_mtime


def test_incomplete_directory_is_redone(tmp_path):
    reference = _digest(generate_shapes(tmp_path / "reference", images_per_class=3, image_size=32))
    path = generate_shapes(tmp_path / "shapes", images_per_class=3, image_size=32)
    (path / MANIFEST_NAME).unlink()  # what a writer killed before the manifest leaves behind
    (path / "square" / "00002.jpg").unlink()
    generate_shapes(path, images_per_class=3, image_size=32)
    assert _digest(path) == reference
    assert (path / MANIFEST_NAME).is_file()


def test_different_parameters_regenerate(tmp_path):
    path = generate_shapes(tmp_path / "shapes", images_per_class=2, image_size=32)
    generate_shapes(path, images_per_class=3, image_size=32)
    assert len(list((path / "cross").iterdir())) == 3


def test_refuses_to_delete_a_directory_with_foreign_files(tmp_path):
    path = tmp_path / "mine"
    path.mkdir()
    (path / "thesis.tex").write_text("precious")
    with pytest.raises(DataError, match=r"thesis.tex"):
        generate_shapes(path, images_per_class=2, image_size=32)
    assert (path / "thesis.tex").read_text() == "precious"


def test_stale_temporary_of_a_dead_process_is_cleaned_and_no_temporary_is_left(tmp_path):
    stale = tmp_path / ".shapes.tmp-999999999-deadbeef"
    stale.mkdir()
    generate_shapes(tmp_path / "shapes", images_per_class=2, image_size=32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"images_per_class": 0}, "images_per_class=0"),
        ({"image_size": 8}, "image_size=8"),
        ({"classes": ("circle", "hexagon")}, "hexagon"),
        ({"classes": ("ring", "ring")}, "repeats"),
    ],
)
def test_bad_arguments_name_the_value(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_shapes(tmp_path / "shapes", **kwargs)


def test_default_dataset_dir_uses_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("TFOPT_DATA_DIR", str(tmp_path))
    path = default_dataset_dir()
    assert path == tmp_path / "shapes-v1"
    assert len(list((path / "triangle").glob("*.jpg"))) == generated._DEFAULT_IMAGES_PER_CLASS
    with Image.open(path / "ring" / "00000.jpg") as image:
        assert image.size == (generated._DEFAULT_IMAGE_SIZE, generated._DEFAULT_IMAGE_SIZE)


def test_default_dataset_dir_falls_back_to_home_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("TFOPT_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_dataset_dir() == tmp_path / ".cache" / "tfopt" / "datasets" / "shapes-v1"


@pytest.mark.slow
def test_a_tiny_cnn_learns_the_shapes_better_than_chance(tmp_path):
    import keras

    # Random colours and textured backgrounds make the shape the only cue, so a tiny CNN needs a few
    # hundred examples per class before it generalises; 32x32 keeps this test to a few seconds.
    path = generate_shapes(tmp_path / "shapes", images_per_class=240, image_size=32)
    images, labels = [], []
    for label, name in enumerate(sorted(DEFAULT_CLASSES)):
        for file in sorted((path / name).iterdir()):
            images.append(np.asarray(Image.open(file), dtype=np.float32) / 255.0)
            labels.append(label)
    images, labels = np.stack(images), np.asarray(labels)
    order = np.random.default_rng(0).permutation(len(labels))
    images, labels = images[order], labels[order]
    split = int(0.8 * len(labels))
    keras.utils.set_random_seed(0)
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            layers.Conv2D(16, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.GlobalMaxPooling2D(),
            layers.Dense(5),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=False,
    )
    model.fit(images[:split], labels[:split], batch_size=32, epochs=12, verbose=0)
    _, accuracy = model.evaluate(images[split:], labels[split:], verbose=0)
    assert accuracy > 0.4, f"held-out accuracy {accuracy:.2f}; chance is 0.20"
