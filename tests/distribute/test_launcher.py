"""The local launcher with tiny Python workers (no TensorFlow): prefixes, TF_CONFIG, failures, no hangs."""

import json
import pathlib
import subprocess
import sys

import pytest

from tests.processes import alive, kill_all, wait_gone
from tfopt.distribute.launcher import free_ports, launch_local_workers
from tfopt.errors import DistributionError

REPO = pathlib.Path(__file__).resolve().parents[2]
PRINT_TASK = "import json, os; print(json.loads(os.environ['TF_CONFIG'])['task']['index'])"


def test_free_ports_are_distinct():
    ports = free_ports(4)
    assert len(set(ports)) == 4 and all(port > 0 for port in ports)


def test_workers_get_their_own_tf_config_and_prefixed_output():
    lines = []
    result = launch_local_workers([sys.executable, "-c", PRINT_TASK], 3, output=lines.append)
    assert result.returncodes == (0, 0, 0)
    assert sorted(lines) == ["[worker 0] 0", "[worker 1] 1", "[worker 2] 2"]
    clusters = [json.loads(config)["cluster"]["worker"] for config in result.tf_configs]
    assert clusters[0] == clusters[2] and all(address.startswith("127.0.0.1:") for address in clusters[0])


def test_failed_worker_stops_a_hanging_one_after_the_grace_period():
    script = (
        "import json, os, sys, time\n"
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
        "sys.exit(5) if index == 1 else time.sleep(600)\n"
    )
    with pytest.raises(DistributionError) as error:
        launch_local_workers([sys.executable, "-c", script], 2, output=lambda line: None, failure_grace_seconds=1)
    assert str(error.value).startswith("Worker 1 exited with code 5 (first failure); workers [0] were still running")


def test_timeout_stops_everything():
    with pytest.raises(DistributionError, match="did not finish within timeout_seconds=1"):
        launch_local_workers(
            [sys.executable, "-c", "import time; time.sleep(600)"], 2, output=lambda line: None, timeout_seconds=1
        )


def test_rejects_no_workers():
    with pytest.raises(ValueError, match="at least 1, received 0"):
        launch_local_workers([sys.executable], 0)


LAUNCH_SLEEPERS = """
import sys
from tfopt.distribute.launcher import launch_local_workers
launch_local_workers([sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"], 2,
                     output=lambda line: print(line, flush=True))
"""


def test_workers_of_a_launcher_killed_outright_are_stopped_too():
    """SIGKILL leaves the launcher no time to clean up: the kernel sends its workers SIGTERM (PDEATHSIG)."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCH_SLEEPERS], stdout=subprocess.PIPE, text=True, cwd=REPO)
    pids = []
    try:
        pids += [int(launcher.stdout.readline().split()[-1]) for _ in range(2)]
        assert all(alive(pid) for pid in pids)
        launcher.kill()
        launcher.wait(timeout=30)
        assert wait_gone(pids) == [], "a worker outlived its launcher"
    finally:
        kill_all(launcher, pids)
