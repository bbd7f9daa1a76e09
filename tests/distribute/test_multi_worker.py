"""Two real worker processes over 127.0.0.1 under MultiWorkerMirroredStrategy, started by tfopt's launcher.

Every worker runs worker_script.py; the test compares what they wrote with single-device Keras training on
the same global batches (the exact reference: same initial weights, same batch order).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tfopt.distribute import launch_local_workers
from tfopt.distribute.probe import keras_fit_works_multi_worker
from tfopt.errors import DistributionError

sys.path.insert(0, str(Path(__file__).parent))
from worker_script import train_reference as reference

SCRIPT = str(Path(__file__).parent / "worker_script.py")
pytestmark = pytest.mark.multi_worker


def run_workers(out_dir, *args, grace=120.0):
    lines = []
    launch_local_workers(
        [sys.executable, SCRIPT, str(out_dir), *args],
        2,
        output=lines.append,
        failure_grace_seconds=grace,
        timeout_seconds=240,
    )
    return [json.loads((out_dir / f"worker_{index}.json").read_text()) for index in range(2)], lines


def test_two_workers_train_one_model_on_disjoint_data(tmp_path):
    (first, second), _ = run_workers(tmp_path, "--epochs", "2")
    assert first["replicas"] == second["replicas"] == 2
    assert first["is_chief"] and not second["is_chief"]
    assert set(first["ids"]).isdisjoint(second["ids"])
    assert sorted(first["ids"] + second["ids"]) == list(range(64))
    assert first["weights"] == second["weights"]
    expected_loss, expected_weights = reference(2)
    np.testing.assert_allclose(first["loss"], expected_loss, rtol=1e-5)
    for got, want in zip(first["weights"], expected_weights):
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.fixture(scope="module")
def dead_worker_run(tmp_path_factory):
    """Worker 1 dies at the start of epoch 2 of 3; returns the error, the output and the checkpoint dir."""
    out_dir, checkpoints = tmp_path_factory.mktemp("dead"), tmp_path_factory.mktemp("checkpoints")
    lines = []
    with pytest.raises(DistributionError) as error:
        launch_local_workers(
            [
                sys.executable,
                SCRIPT,
                str(out_dir),
                "--epochs",
                "3",
                "--die-at-epoch",
                "1",
                "--checkpoint-dir",
                str(checkpoints),
                "--timeout",
                "20",
            ],
            2,
            output=lines.append,
            failure_grace_seconds=120,
            timeout_seconds=240,
        )
    return str(error.value), lines, checkpoints


@pytest.mark.slow
def test_dead_worker_makes_the_other_fail_clearly(dead_worker_run):
    message, lines, _ = dead_worker_run
    assert message.startswith("Worker 1 exited with code 17 (first failure); then worker 0: exit code 1")
    survivor = "\n".join(line for line in lines if line.startswith("[worker 0]"))
    # Worker 0 failed by itself (the launcher's 120 s grace did not have to stop it), with tfopt's message.
    assert "DistributionError: Worker 0 lost contact with the other workers during epoch 2" in survivor
    assert "were stopped" not in message


@pytest.mark.slow
def test_restarted_cluster_resumes_from_last_checkpoint(dead_worker_run, tmp_path):
    _, _, checkpoints = dead_worker_run
    (first, second), _ = run_workers(tmp_path, "--epochs", "3", "--checkpoint-dir", str(checkpoints))
    assert first["epochs"] == second["epochs"] == [1, 2]
    assert first["iterations"] == 12  # 4 steps x 3 epochs: the restored optimizer counted epoch 1 too
    assert first["weights"] == second["weights"]
    expected_loss, expected_weights = reference(3)
    # Two replicas' gradients of 8 examples summed round differently from one of 16: over 12 momentum steps
    # that reached 4e-5 on a 16-core host. A restart that lost the optimizer's state is 0.7 away.
    np.testing.assert_allclose(first["loss"], expected_loss[1:], rtol=1e-4)
    for got, want in zip(first["weights"], expected_weights):
        np.testing.assert_allclose(got, want, atol=1e-4)
    assert not any(path.name.startswith(".tfopt_worker") for path in checkpoints.iterdir())


@pytest.mark.slow
def test_probe_sees_the_upstream_keras_fit_bug(tmp_path):
    works = keras_fit_works_multi_worker(refresh=True, cache_path=tmp_path / "probe.json")
    cache = json.loads((tmp_path / "probe.json").read_text())
    (entry,) = cache.values()
    # When this fails, keras-team/keras#20585 is fixed here: engine="auto" will then use Keras' fit.
    assert works is False, f"Keras fit now works under multi-worker ({cache})"
    assert "PerReplica" in entry["detail"]


LAUNCH_JOINED_WORKERS = """
import sys
from tfopt.distribute.launcher import launch_local_workers
WORKER = "import os, time; from tfopt.distribute import make_strategy; make_strategy('multi_worker'); "
WORKER += "print('joined', os.getpid(), flush=True); time.sleep(600)"
launch_local_workers([sys.executable, "-c", WORKER], 2, output=lambda line: print(line, flush=True))
"""


def test_workers_that_joined_the_cluster_end_with_their_launcher():
    """Joining, TensorFlow's coordination service puts a SIGTERM handler of its own in, which swallowed the SIGTERM
    the kernel sends a worker when its launcher dies: killed outright, the launcher left both training on."""
    import subprocess

    from tests.processes import child_environment, kill_all, wait_gone

    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCH_JOINED_WORKERS],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env=child_environment(TF_CPP_MIN_LOG_LEVEL="3"),
    )
    pids = []
    try:
        for line in launcher.stdout:
            if "joined" in line:
                pids.append(int(line.split()[-1]))
            if len(pids) == 2:
                break
        assert len(pids) == 2
        launcher.kill()
        launcher.wait(timeout=30)
        assert wait_gone(pids) == [], "a worker outlived its launcher"
    finally:
        kill_all(launcher, pids)
