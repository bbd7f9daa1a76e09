"""Tests of tfopt.data.source: the DataSource contract and shared argument checks."""

from __future__ import annotations

import pytest

from tfopt.data.source import DataSource, check_pipeline_arguments, image_size_pair


def test_a_source_must_implement_the_whole_contract():
    class Incomplete(DataSource):
        name = "incomplete"

        def describe(self):
            return "incomplete"

    with pytest.raises(TypeError, match="_build_pipeline"):
        Incomplete()


def test_repr_shows_the_config():
    class Fixed(DataSource):
        name = "fixed"

        def _build_pipeline(self, request):
            return request

        def describe(self):
            return "fixed"

        def get_config(self):
            return {"size": 3}

    assert repr(Fixed()) == "Fixed(size=3)"


def test_pipeline_checks_its_arguments_once_for_every_source():
    class Echo(DataSource):
        name = "echo"

        def _build_pipeline(self, request):
            return request

        def describe(self):
            return "echo"

        def get_config(self):
            return {}

    request = Echo().pipeline(batch_size=4, optimized=True, num_shards=2, shard_index=1)
    assert (
        request.batch_size,
        request.optimized,
        request.shuffle,
        request.seed,
        request.drop_remainder,
        request.num_shards,
        request.shard_index,
    ) == (4, True, True, 0, False, 2, 1)
    with pytest.raises(ValueError, match="echo: shard_index=2 is not in"):
        Echo().pipeline(batch_size=4, optimized=True, num_shards=2, shard_index=2)


@pytest.mark.parametrize("value, expected", [(8, (8, 8)), ([4, 6], (4, 6)), ((5, 7), (5, 7))])
def test_image_size_pair_accepts_int_list_and_tuple(value, expected):
    assert image_size_pair("test", value) == expected


@pytest.mark.parametrize("value", [0, [3], [3, -1], "64", [2.5, 3], True])
def test_image_size_pair_rejects_other_values(value):
    with pytest.raises(ValueError, match=r"image_size=.*Expected an int or \[height, width\]"):
        image_size_pair("test", value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0, "num_shards": 1, "shard_index": 0}, "batch_size=0"),
        ({"batch_size": True, "num_shards": 1, "shard_index": 0}, "batch_size=True"),
        ({"batch_size": 2, "num_shards": 0, "shard_index": 0}, "num_shards=0"),
        ({"batch_size": 2, "num_shards": 2, "shard_index": -1}, "shard_index=-1"),
    ],
)
def test_pipeline_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_pipeline_arguments("test", **kwargs)
