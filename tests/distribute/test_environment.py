"""Launcher detection from a faked environment."""

import json

import pytest

from tfopt.distribute.environment import detect_environment
from tfopt.errors import EnvironmentVariableError


def tf_config(task_type, index, chief=False):
    cluster = {"worker": ["h1:1", "h2:1"]}
    if chief:
        cluster["chief"] = ["h0:1"]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


@pytest.mark.parametrize(
    "environ, launcher, workers, index",
    [
        ({}, "none", 1, 0),
        ({"TF_CONFIG": tf_config("worker", 1)}, "tf_config", 2, 1),
        ({"TF_CONFIG": tf_config("chief", 0, chief=True)}, "tf_config", 3, 0),
        ({"TF_CONFIG": tf_config("worker", 0, chief=True)}, "tf_config", 3, 1),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "3"}, "slurm", 4, 3),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}, "none", 1, 0),
        ({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "5"}, "horovod", 8, 5),
        ({"HOROVOD_SIZE": "2", "HOROVOD_RANK": "1", "TF_CONFIG": tf_config("worker", 0)}, "horovod", 2, 1),
    ],
)
def test_detects_launcher(environ, launcher, workers, index):
    environment = detect_environment(environ)
    assert (environment.launcher, environment.num_workers, environment.worker_index) == (launcher, workers, index)
    assert environment.is_chief == (index == 0)


@pytest.mark.parametrize(
    "text, words",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"cluster": {}}), "needs a 'cluster' and a 'task'"),
        (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}), "is not in its cluster"),
    ],
)
def test_bad_tf_config_is_explained(text, words):
    with pytest.raises(EnvironmentVariableError, match=words):
        detect_environment({"TF_CONFIG": text})
