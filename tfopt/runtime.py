"""Settings of the process, which TensorFlow fixes when it initialises its devices: GPU memory, the GPUs'
threads, and joining a multi-worker cluster.

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
- **GPU threads.** By default TensorFlow launches every GPU op from the process-wide inter-op thread pool,
  which the input pipeline's threads and every CPU op share: when they keep it busy, kernel launches wait
  and the GPU idles. `TF_GPU_THREAD_MODE=gpu_private` gives each GPU threads of its own (TF_GPU_THREAD_COUNT,
  2 by default), `gpu_shared` one pool for all GPUs; TensorFlow reads both when it creates each GPU device.
  NVIDIA's and the Model Garden's training scripts set `gpu_private`. It is not tfopt's default: no GPU run
  has measured it beside TensorFlow's own yet (`benchmarks/gpu_threads.py` does, in child processes, since a
  process cannot try both).
- **The cluster.** TensorFlow allows one MultiWorkerMirroredStrategy per process, made before its first
  op ("Collective ops must be configured at program startup"; a second one hangs), so a worker joins at
  start and the run's build is handed the same strategy (`tfopt.distribute.strategy` keeps it).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tfopt import environment_variables
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


GPU_THREAD_MODES = ("global", "gpu_private", "gpu_shared")
"""TF_GPU_THREAD_MODE's values; TensorFlow refuses to start a GPU with any other (and "global" is its default)."""


def configure_gpu_threads(mode: str = "gpu_private", count: int | None = None) -> list[str]:
    """Sets how TensorFlow's GPUs get the threads that launch their kernels. Call it before any TensorFlow work.

    It sets TF_GPU_THREAD_MODE (and TF_GPU_THREAD_COUNT, where given) in this process' environment, which
    TensorFlow reads when it creates the GPU devices; child processes inherit it.

    Args:
        mode: One of `GPU_THREAD_MODES`.
        count: Threads per GPU (gpu_private) or for all GPUs (gpu_shared); None leaves TF_GPU_THREAD_COUNT as
            the environment has it (unset: TensorFlow's 2).

    Returns:
        The GPUs it applies to (empty on a machine without GPUs, where the variables have no effect).

    Raises:
        RecipeConfigError: The settings are invalid, or TensorFlow already started the GPUs with other ones
            (the message says how to get them in force).

    Example:
        >>> configure_gpu_threads("gpu_private")  # at the top of a script  # doctest: +SKIP
        ['/physical_device:GPU:0']
    """
    import tensorflow as tf

    check_gpu_threads(mode=mode, count=count)
    gpus = [gpu.name for gpu in tf.config.list_physical_devices("GPU")]
    wanted = {"TF_GPU_THREAD_MODE": mode}
    if count is not None:
        wanted["TF_GPU_THREAD_COUNT"] = str(count)
    now = {"TF_GPU_THREAD_MODE": gpu_thread_mode_in_force()}
    if count is not None:  # unset: TensorFlow's 2
        now["TF_GPU_THREAD_COUNT"] = (environment_variables.text("TF_GPU_THREAD_COUNT") or "2").strip()
    if gpus and _devices_started() and now != wanted:
        started = ", ".join(f"{name}={value}" for name, value in now.items())
        raise RecipeConfigError(
            f"gpu_threads: TensorFlow started the GPUs with {started}, and reads them only then. Call "
            f"tfopt.runtime.configure_gpu_threads({mode!r}, count={count}) at the top of your script, before "
            "building models or datasets; in a notebook, restart the kernel and call it in the first cell. Or set "
            f"TF_GPU_THREAD_MODE={mode} before Python starts, or write `runtime: {{gpu_thread_mode: {mode}}}` in "
            "the recipe file: `tfopt-recipe run` applies it first.",
            setting="mode" if now["TF_GPU_THREAD_MODE"] != mode else "count",
        )
    os.environ.update(wanted)
    return gpus


def check_gpu_threads(*, mode: Any, count: Any) -> None:
    """Refuses GPU thread settings TensorFlow would refuse (or ignore), naming the setting.

    Raises:
        RecipeConfigError: With `setting` the argument to change.

    Example:
        >>> check_gpu_threads(mode="global", count=4)
        Traceback (most recent call last):
        ...
        tfopt.errors.RecipeConfigError: gpu_threads: count=4 with mode 'global' ...
    """
    if mode not in GPU_THREAD_MODES:
        raise RecipeConfigError(
            f"gpu_threads: mode={mode!r}. Expected one of {', '.join(GPU_THREAD_MODES)} (TensorFlow refuses to "
            "start a GPU with any other).",
            setting="mode",
        )
    if count is None:
        return
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise RecipeConfigError(
            f"gpu_threads: count={count!r}. Expected a number of threads of at least 1, or null for TensorFlow's 2.",
            setting="count",
        )
    if mode == "global":
        raise RecipeConfigError(
            f"gpu_threads: count={count} with mode 'global' changes nothing: the GPUs share TensorFlow's inter-op "
            "pool, whose size is set apart. Give the GPUs threads of their own (mode gpu_private), or drop count.",
            setting="count",
        )


def gpu_thread_mode_in_force() -> str:
    """TF_GPU_THREAD_MODE as TensorFlow reads it (lower case; "global" where unset)."""
    return (environment_variables.text("TF_GPU_THREAD_MODE") or "global").strip().lower()


def _devices_started() -> bool:
    """Whether TensorFlow created its devices in this process (its first op did; listing them does not).
    TensorFlow has no public question for it: its eager context holds a handle from then on."""
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None


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
