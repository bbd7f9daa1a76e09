"""make_strategy: names and options checked before anything is created."""

import pytest

from tfopt.distribute.strategy import communication_options, make_strategy
from tfopt.errors import RecipeConfigError


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(RecipeConfigError, match="Expected one of default, one_device, mirrored, multi_worker"):
        make_strategy("gpu_farm")


def test_unknown_option_is_named():
    with pytest.raises(RecipeConfigError, match=r"does not take option\(s\) \['device'\]"):
        make_strategy("mirrored", device="/cpu:0")


def test_one_device_and_mirrored_on_cpu():
    assert make_strategy("one_device", device="/cpu:0").num_replicas_in_sync == 1
    assert make_strategy("mirrored", devices=["/cpu:0"]).num_replicas_in_sync == 1


def test_communication_options_carry_the_timeout():
    assert communication_options(12.5).timeout_seconds == 12.5
    assert communication_options(0).timeout_seconds is None
    with pytest.raises(RecipeConfigError, match="'auto', 'ring'|auto, ring"):
        communication_options(1, implementation="mpi")
