"""Settings of the process, which TensorFlow fixes when it initialises its devices: GPU memory, and
joining a multi-worker cluster.

They are not recipes: a recipe changes a Plan, and by the time a plan exists TensorFlow has usually
touched its devices already (its first op or device query initialises them), after which neither can be
changed. So they are made at the start of a process: `tfopt-recipe run` applies a recipe file's
`runtime:` section (and joins the cluster its `distribution` item asks for) before anything else
(`tfopt.run.process`); a script or notebook calls `configure_gpu_memory` at its top.

- **GPU memory.** By default TensorFlow reserves nearly all of every GPU's memory when it initialises
  them, so a second process on the same GPU (a notebook next to a training run, two workers sharing a
  GPU) fails. `set_memory_growth` makes it allocate as needed; a logical device with `memory_limit` caps
  it. The two exclude each other (TensorFlow refuses growth on a device with a virtual-device
  configuration). Peak memory is measured with `tfopt.training.peak_memory.track_peak_memory`.
- **The cluster.** TensorFlow allows one MultiWorkerMirroredStrategy per process, made before its first
  op ("Collective ops must be configured at program startup"; a second one hangs), so a worker joins at
  start and the run's build is handed the same strategy (`tfopt.distribute.strategy` keeps it).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tfopt.errors import RecipeConfigError

_log = logging.getLogger("tfopt")

_TOO_LATE = (
    "GPU memory settings must be made before TensorFlow initialises the GPUs (its first op or "
    "device query), and this process already did. Call tfopt.runtime.configure_gpu_memory({args}) at the "
    "top of your script, before building models or datasets; in a notebook, restart the kernel and call it "
    "in the first cell. Or set the environment variable TF_FORCE_GPU_ALLOW_GROWTH=true before Python "
    "starts (for memory growth), or write the setting under `runtime:` in the recipe file: "
    "`tfopt-recipe run` applies it first."
)


def configure_gpu_memory(*, growth: bool = True, limit_bytes: int | None = None) -> list[str]:
    """Sets memory growth, or a memory limit, on every GPU. Call it before any TensorFlow work.

    Args:
        growth: Allocate GPU memory as needed instead of reserving it all at start.
        limit_bytes: Cap this process' memory on each GPU instead (a logical device with this limit);
            needs growth=False.

    Returns:
        The GPUs configured (empty on a machine without GPUs).

    Raises:
        RecipeConfigError: The settings are invalid or conflict, or TensorFlow already initialised the
            GPUs with another setting (the message says how to get it in force).

    Example:
        >>> configure_gpu_memory(growth=True)  # at the top of a script  # doctest: +SKIP
        ['/physical_device:GPU:0']
    """
    import tensorflow as tf

    check_gpu_memory(growth=growth, limit_bytes=limit_bytes)
    gpus = tf.config.list_physical_devices("GPU")
    if gpu_memory_in_force(growth=growth, limit_bytes=limit_bytes):  # a cell run again, TF_FORCE_GPU_ALLOW_GROWTH
        return [gpu.name for gpu in gpus]
    for gpu in gpus:
        try:
            if limit_bytes is not None:
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_bytes // 2**20)]
                )  # in MiB
            else:
                tf.config.experimental.set_memory_growth(gpu, growth)
        except RuntimeError as error:
            raise RecipeConfigError(
                f"gpu_memory: TensorFlow refused the setting ({error}). "
                + _TOO_LATE.format(args=f"growth={growth}, limit_bytes={limit_bytes}")
            ) from error
    return [gpu.name for gpu in gpus]


def check_gpu_memory(*, growth: Any, limit_bytes: Any) -> None:
    """Refuses GPU memory settings that are invalid or exclude each other, naming the setting.

    Raises:
        RecipeConfigError: With `setting` the argument to change.

    Example:
        >>> check_gpu_memory(growth=True, limit_bytes=2**30)
        Traceback (most recent call last):
        ...
        tfopt.errors.RecipeConfigError: gpu_memory: growth=True and limit_bytes=1073741824 exclude each other ...
    """
    if not isinstance(growth, bool):
        raise RecipeConfigError(f"gpu_memory: growth={growth!r}. Expected true or false.", setting="growth")
    if limit_bytes is not None and (
        isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 2**20
    ):
        raise RecipeConfigError(
            f"gpu_memory: limit_bytes={limit_bytes!r}. Expected a number of bytes of at least "
            "1 MiB (e.g. 4294967296 for 4 GiB), or null for no limit.",
            setting="limit_bytes",
        )
    if growth and limit_bytes is not None:
        raise RecipeConfigError(
            f"gpu_memory: growth=True and limit_bytes={limit_bytes} exclude each other (TensorFlow refuses memory "
            "growth on a device with a memory limit). Set growth false to cap memory, or drop limit_bytes to grow "
            "as needed.",
            setting="growth",
        )


def gpu_memory_in_force(*, growth: bool, limit_bytes: int | None) -> bool:
    """Whether every GPU runs with this setting already (True on a machine without GPUs).

    TensorFlow's allocator reads TF_FORCE_GPU_ALLOW_GROWTH ("true"/"false") over `set_memory_growth`, and
    `get_memory_growth()` reports only what `set_memory_growth` was told, so the variable counts.
    """
    import tensorflow as tf

    forced = {"true": True, "false": False}.get(os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "").lower())
    for gpu in tf.config.list_physical_devices("GPU"):
        if limit_bytes is not None:
            limits = [config.memory_limit for config in tf.config.get_logical_device_configuration(gpu) or []]
            if limits != [limit_bytes // 2**20]:
                return False
        elif (bool(tf.config.experimental.get_memory_growth(gpu)) if forced is None else forced) != growth:
            return False
    return True


def join_cluster(*, communication_timeout_seconds: float | None, start_timeout_seconds: float) -> Any | None:
    """Joins the multi-worker cluster this process is a worker of (TF_CONFIG or Slurm list several
    workers), before TensorFlow's first op; None where it is no such worker.

    Returns:
        The MultiWorkerMirroredStrategy joined (the run's build is handed the same one), or None.

    Raises:
        DistributionError: The cluster could not be joined.
    """
    from tfopt.distribute.environment import detect_environment
    from tfopt.distribute.strategy import make_strategy

    cluster = detect_environment()
    if cluster.launcher not in ("tf_config", "slurm") or cluster.num_workers < 2:
        return None
    _log.info("joining the cluster: %s", cluster.reason)
    return make_strategy(
        "multi_worker",
        communication_timeout_seconds=communication_timeout_seconds,
        start_timeout_seconds=start_timeout_seconds,
        cluster_resolver="slurm" if cluster.launcher == "slurm" else "tf_config",
    )
