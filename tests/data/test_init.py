"""Tests of the tfopt.data package surface."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tfopt.data


def test_public_surface_is_exactly_this():
    assert tfopt.data.__all__ == sorted(
        [
            "DataSource",
            "ImageFolderSource",
            "NumpySource",
            "SOURCES",
            "SyntheticSource",
            "TFRecordSource",
            "TfdsSource",
            "default_dataset_dir",
            "generate_shapes",
            "make_source",
            "to_tfrecord",
            "verify",
        ]
    )
    for name in tfopt.data.__all__:
        assert getattr(tfopt.data, name) is not None


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tfopt.data.nope  # noqa: B018


def test_importing_the_package_and_the_generator_does_not_import_tensorflow():
    code = "import sys, tfopt.data; tfopt.data.generate_shapes; print('tensorflow' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(__import__("pathlib").Path(tfopt.data.__file__).resolve().parents[2]),
    )
    assert result.stdout.strip() == "False"
