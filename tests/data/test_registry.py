"""Tests of tfopt.data.registry: SOURCES and make_source."""

from __future__ import annotations

import pytest

from tfopt.data.arrays import NumpySource
from tfopt.data.image_folder import ImageFolderSource
from tfopt.data.registry import SOURCES, make_source
from tfopt.data.source import DataSource
from tfopt.data.synthetic import SyntheticSource
from tfopt.data.tfds_source import TfdsSource
from tfopt.data.tfrecord.source import TFRecordSource
from tfopt.errors import DataError


def test_every_source_is_registered_under_its_name():
    assert {
        "image_folder": ImageFolderSource,
        "numpy": NumpySource,
        "synthetic": SyntheticSource,
        "tfds": TfdsSource,
        "tfrecord": TFRecordSource,
    } == SOURCES
    assert all(issubclass(cls, DataSource) and cls.name == name for name, cls in SOURCES.items())


def test_yaml_keys_build_the_source(shapes_dir):
    source = make_source("image_folder", path=str(shapes_dir), image_size=[32, 32])
    assert isinstance(source, ImageFolderSource) and source.image_size == (32, 32)
    assert make_source("image_folder", **source.get_config()).get_config() == source.get_config()


def test_unknown_name_lists_known_and_closest():
    with pytest.raises(DataError, match=r"'imagefolder' is not known. Did you mean 'image_folder'.*'numpy'"):
        make_source("imagefolder")


def test_unknown_key_lists_valid_keys(shapes_dir):
    with pytest.raises(DataError, match=r"no argument 'imag_size'. Did you mean 'image_size'.*'channels'"):
        make_source("image_folder", path=str(shapes_dir), imag_size=[3, 3])


def test_missing_required_key():
    with pytest.raises(DataError, match="needs the argument 'path'"):
        make_source("tfrecord")


def test_a_source_argument_called_name_can_be_passed(tfds_dir):
    source = make_source("tfds", name="tfopt_tiny_patches", split="test", data_dir=str(tfds_dir))
    assert isinstance(source, TfdsSource) and source.num_examples == 9
    assert source.class_names == ["0", "1", "2"]
