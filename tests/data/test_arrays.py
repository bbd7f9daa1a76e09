"""Tests of tfopt.data.arrays.NumpySource."""

from __future__ import annotations

import numpy as np
import pytest

from tfopt.data.arrays import NumpySource
from tfopt.errors import DataError

from .helpers import assert_same_batches, collect, unbatched


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return rng.normal(size=(23, 4, 3)).astype(np.float32), (np.arange(23) % 4).astype(np.int64)


def test_yields_the_arrays_unchanged_in_order(arrays):
    x, y = arrays
    batches = collect(NumpySource(x, y).pipeline(batch_size=10, optimized=True, shuffle=False))
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y)
    assert batches[0][0].dtype == np.float32 and batches[0][1].dtype == np.int64


def test_optimized_and_naive_yield_identical_elements(arrays):
    source = NumpySource(*arrays)
    assert_same_batches(
        collect(source.pipeline(batch_size=6, optimized=False, shuffle=False)),
        collect(source.pipeline(batch_size=6, optimized=True, shuffle=False)),
    )


def test_reads_npy_and_npz_files_and_config_round_trips(arrays, tmp_path):
    x, y = arrays
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.savez(tmp_path / "data.npz", features=x, labels=y)
    from_npy = NumpySource(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    from_npz = NumpySource(tmp_path / "data.npz", x_key="features", y_key="labels")
    for source in (from_npy, from_npz):
        np.testing.assert_array_equal(source.x, x)
        np.testing.assert_array_equal(source.y, y)
        clone = NumpySource(**source.get_config())
        np.testing.assert_array_equal(clone.x, x)
    assert from_npz.get_config() == {"x": str(tmp_path / "data.npz"), "x_key": "features", "y_key": "labels"}
    assert "23 examples" in from_npz.describe()


def test_shards_are_disjoint_and_cover_everything(arrays):
    source = NumpySource(*arrays)
    everything = unbatched(collect(source.pipeline(batch_size=50, optimized=False, shuffle=False)))
    shards = [
        unbatched(collect(source.pipeline(batch_size=4, optimized=True, num_shards=2, shard_index=i))) for i in (0, 1)
    ]
    assert [len(s) for s in shards] == [12, 11]
    assert sorted(shards[0] + shards[1]) == sorted(everything)


def test_errors_name_the_problem(arrays, tmp_path):
    x, y = arrays
    with pytest.raises(DataError, match="x has 23 examples but y has shape \\(5,\\)"):
        NumpySource(x, y[:5])
    with pytest.raises(DataError, match="zero examples"):
        NumpySource(np.zeros((0, 3)), np.zeros((0,)))
    with pytest.raises(DataError, match="y \\(the labels\\) is missing"):
        NumpySource(x)
    with pytest.raises(DataError, match=r"missing.npy does not exist"):
        NumpySource(tmp_path / "missing.npy", y)
    np.savez(tmp_path / "data.npz", x=x)
    with pytest.raises(DataError, match=r"no array named 'y'.*\['x'\]"):
        NumpySource(tmp_path / "data.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="cannot read"):
        NumpySource(tmp_path / "bad.npz")
