"""Fixtures shared by the tfopt.data tests: small datasets generated once per session."""

from __future__ import annotations

import pytest

from tfopt.data.generated import generate_shapes

from .helpers import TfoptTinyPatches


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory):
    """A 5-class x 12-image, 32x32 shapes dataset (60 JPEG files), shared read-only by the tests."""
    return generate_shapes(tmp_path_factory.mktemp("shapes") / "shapes", images_per_class=12, image_size=32)


@pytest.fixture
def no_cache(monkeypatch):
    """Makes every RAM budget zero, so the optimized pipeline takes its no-cache path."""
    from tfopt.data import pipeline

    monkeypatch.setattr(pipeline, "ram_budget_bytes", lambda *fraction: 0)


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    TfoptTinyPatches(data_dir=str(data_dir)).download_and_prepare()
    return data_dir
