"""make_strategy: names and options checked before anything is created."""

import os
import subprocess
import sys
import textwrap

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


def test_every_build_over_the_same_devices_shares_one_mirrored_strategy():
    """Its collectives are numbered once for the process (two strategies' numbers collide: see the module)."""
    first = make_strategy("mirrored", devices=["/cpu:0"])
    assert make_strategy("mirrored", devices=["/cpu:0"]) is first
    assert make_strategy("mirrored") is not first  # other devices: all of this machine's


def test_communication_options_carry_the_timeout():
    assert communication_options(12.5).timeout_seconds == 12.5
    assert communication_options(0).timeout_seconds is None
    with pytest.raises(RecipeConfigError, match=r"'auto', 'ring'|auto, ring"):
        communication_options(1, implementation="mpi")


def test_multi_worker_strategy_is_joined_once_per_process():
    # TensorFlow allows one MultiWorkerMirroredStrategy per process, made before any op: a second call
    # must hand back the first (a worker joins at start, build() later asks again), in a fresh process.
    code = textwrap.dedent("""
        from tfopt.distribute.strategy import make_strategy
        from tfopt.errors import DistributionError
        first = make_strategy("multi_worker", communication_timeout_seconds=30)
        print("SAME", make_strategy("multi_worker", communication_timeout_seconds=30.0) is first)
        try:
            make_strategy("multi_worker", communication_timeout_seconds=60)
        except DistributionError as error:
            print("REFUSED", "one MultiWorkerMirroredStrategy per process" in str(error))
    """)
    environment = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)
    assert process.returncode == 0, process.stderr[-2000:]
    assert [line for line in process.stdout.splitlines() if line.startswith(("SAME", "REFUSED"))] == [
        "SAME True",
        "REFUSED True",
    ]
