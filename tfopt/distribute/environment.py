"""Which cluster launched this process: TF_CONFIG, Slurm, horovodrun/mpirun, or none.

Reading the environment is kept apart from choosing a strategy so the choice can be tested with a faked
environment (a plain mapping) on a machine that has no cluster. Nothing here starts TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping

from tfopt.environment_variables import integer, text
from tfopt.errors import EnvironmentVariableError

# Variables horovodrun (Gloo) and Open MPI's mpirun set in every process they start.
_HOROVOD_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_HOROVOD_RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@dataclasses.dataclass(frozen=True)
class ClusterEnvironment:
    """The cluster this process belongs to, as its launcher described it.

    Attributes:
        launcher: "tf_config", "slurm", "horovod" or "none" (a single process started by hand).
        num_workers: The number of training processes in the cluster (1 for "none").
        worker_index: This process's index among them (its rank).
        reason: Which variables said so, for `Plan.applied` and error messages.
    """

    launcher: str
    num_workers: int
    worker_index: int
    reason: str

    @property
    def is_chief(self) -> bool:
        """Whether this process is the one that writes checkpoints and logs (index 0)."""
        return self.worker_index == 0


def detect_environment(environ: Mapping[str, str] | None = None) -> ClusterEnvironment:
    """Reads the launcher's variables to find the cluster this process is part of.

    Horovod's variables win over TF_CONFIG (horovodrun was asked for explicitly), TF_CONFIG over Slurm
    (a TF_CONFIG set inside a Slurm job is the more specific instruction). A Slurm job with one task is
    not a cluster.

    Args:
        environ: The environment to read; `os.environ` when None (tests pass a dict).

    Returns:
        The detected `ClusterEnvironment`.

    Raises:
        EnvironmentVariableError: TF_CONFIG is not valid JSON with a cluster and a task, or a launcher's
            count or index is not a number it can be.

    Example:
        >>> detect_environment({"HOROVOD_SIZE": "4", "HOROVOD_RANK": "1"}).num_workers
        4
        >>> detect_environment({}).launcher
        'none'
    """
    environ = os.environ if environ is None else environ
    horovod = _first_set(environ, _HOROVOD_SIZE_VARIABLES)
    if horovod is not None:
        name, size = horovod
        rank_variable = _first_set(environ, _HOROVOD_RANK_VARIABLES)
        rank = integer(rank_variable[0], default=0, environ=environ) if rank_variable else 0
        return ClusterEnvironment(
            "horovod",
            integer(name, default=1, at_least=1, environ=environ),
            rank,
            f"{name}={size} is set (horovodrun/mpirun)",
        )
    tf_config = text("TF_CONFIG", environ=environ)
    if tf_config:
        return _from_tf_config(tf_config)
    job = text("SLURM_JOB_ID", environ=environ)
    if job and integer("SLURM_NTASKS", default=1, at_least=1, environ=environ) > 1:
        tasks = integer("SLURM_NTASKS", default=1, at_least=1, environ=environ)
        return ClusterEnvironment(
            "slurm",
            tasks,
            integer("SLURM_PROCID", default=0, environ=environ),
            f"Slurm job {job} with SLURM_NTASKS={tasks}",
        )
    return ClusterEnvironment("none", 1, 0, "no TF_CONFIG, Slurm or Horovod variables: a single process")


def parse_tf_config(text: str) -> dict:
    """Parses TF_CONFIG and checks it has the parts MultiWorkerMirroredStrategy reads.

    Raises:
        EnvironmentVariableError: It is not JSON, or its cluster or task is missing or malformed.
    """
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise EnvironmentVariableError(
            f"TF_CONFIG is not valid JSON ({error}); received {text[:200]!r}. Expected e.g. "
            '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}.',
            variable="TF_CONFIG",
        ) from None
    if not isinstance(config, dict) or "cluster" not in config or "task" not in config:
        raise EnvironmentVariableError(
            f"TF_CONFIG needs a 'cluster' and a 'task' entry; received keys "
            f"{sorted(config) if isinstance(config, dict) else type(config).__name__}. Expected e.g. "
            f"{_TF_CONFIG_EXAMPLE}.",
            variable="TF_CONFIG",
        )
    problem = _tf_config_problem(config["cluster"], config["task"])
    if problem:
        raise EnvironmentVariableError(
            f"TF_CONFIG's {problem}. Expected e.g. {_TF_CONFIG_EXAMPLE}.", variable="TF_CONFIG"
        )
    return config


_TF_CONFIG_EXAMPLE = '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}'


def _tf_config_problem(cluster: object, task: object) -> str | None:
    """What is wrong with TF_CONFIG's cluster and task, in words, or None: the shapes TensorFlow's own reader
    would fail on with a KeyError or AttributeError, far from the variable."""
    if not isinstance(cluster, dict):
        return f"cluster is a {type(cluster).__name__}, not a mapping of job names to address lists"
    for job, addresses in cluster.items():
        if not isinstance(addresses, list):
            return f"cluster.{job} is {addresses!r}, not a list of host:port addresses"
        for address in addresses:
            host, separator, port = str(address).rpartition(":")
            if not isinstance(address, str) or not separator or not host or not port.isdigit():
                return f"cluster.{job} address {address!r} is not host:port"
    if not isinstance(task, dict):
        return f"task is a {type(task).__name__}, not a mapping with a type and an index"
    index = task.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return f"task.index is {index!r}, not a worker index (an integer >= 0)"
    return None


def _from_tf_config(text: str) -> ClusterEnvironment:
    config = parse_tf_config(text)
    cluster, task = config["cluster"], config["task"]
    # A "chief" task counts as a worker and comes first, as MultiWorkerMirroredStrategy orders them.
    members = [("chief", index) for index in range(len(cluster.get("chief", [])))]
    members += [("worker", index) for index in range(len(cluster.get("worker", [])))]
    me = (task.get("type"), int(task.get("index", 0)))
    if me not in members:
        raise EnvironmentVariableError(
            f"TF_CONFIG's task {task} is not in its cluster {cluster}: expected type 'chief' or 'worker' "
            "and an index below the number of addresses listed for it.",
            variable="TF_CONFIG",
        )
    return ClusterEnvironment(
        "tf_config", len(members), members.index(me), f"TF_CONFIG lists {len(members)} workers; this is {me[0]} {me[1]}"
    )


def _first_set(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        if environ.get(name):
            return name, environ[name]
    return None
