"""tf.distribute strategies by name, so a Plan can say which one without holding a live strategy.

A strategy owns devices and (for multi-worker) a cluster connection, so it is created by `build()`, not
by the recipe that chooses it. Options are plain YAML-safe values; this module turns them into the
TensorFlow objects (cluster resolvers, communication options).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tfopt.errors import DistributionError, RecipeConfigError

if TYPE_CHECKING:
    import tensorflow as tf

STRATEGY_NAMES = ("default", "one_device", "mirrored", "multi_worker", "horovod", "tpu")

# Every collective gives up after this long by default, so a lost worker ends in an error, not a hang.
# Generous: the first collective also waits for the slowest worker to start TensorFlow.
DEFAULT_COMMUNICATION_TIMEOUT_SECONDS = 300.0
# How long a worker waits for its peers to start before it joins them (`tfopt.distribute.rendezvous`).
DEFAULT_START_TIMEOUT_SECONDS = 300.0

_OPTIONS = {
    "default": set(),
    "one_device": {"device"},
    "mirrored": {"devices"},
    "multi_worker": {"communication_timeout_seconds", "start_timeout_seconds", "cluster_resolver", "implementation"},
    "horovod": set(),
    "tpu": {"tpu"},
}


def make_strategy(name: str, **options: Any) -> tf.distribute.Strategy:
    """Creates the tf.distribute strategy called `name`.

    Args:
        name: One of `STRATEGY_NAMES`:
            "default": whatever strategy is current (usually none: one device).
            "one_device": `OneDeviceStrategy`; option `device` (default: first GPU, else CPU).
            "mirrored": `MirroredStrategy` over this machine's devices; option `devices`.
            "multi_worker": `MultiWorkerMirroredStrategy`; options `cluster_resolver` ("tf_config", the
                default, or "slurm"), `communication_timeout_seconds` (default 300; 0 waits forever)
                `start_timeout_seconds` (default 300: how long to wait for every peer to start before joining
                them) and `implementation` ("auto", "ring" or "nccl").
            "horovod": initialises Horovod and returns a `tfopt.distribute.horovod.HorovodStrategy`.
            "tpu": `TPUStrategy`; option `tpu` (the TPU name or address; "" for a TPU VM).
        **options: The options listed for that strategy.

    Returns:
        A `tf.distribute.Strategy` (a `HorovodStrategy` for "horovod").

    Raises:
        RecipeConfigError: `name` is not a known strategy, or an option is not one it takes.
        DistributionError: The cluster could not be joined (bad TF_CONFIG, Horovod missing, no TPU).

    Example:
        >>> make_strategy("one_device", device="/cpu:0").num_replicas_in_sync
        1
    """
    import tensorflow as tf

    if name not in _OPTIONS:
        raise RecipeConfigError(f"Unknown strategy {name!r}. Expected one of {', '.join(STRATEGY_NAMES)}.")
    unknown = set(options) - _OPTIONS[name]
    if unknown:
        raise RecipeConfigError(
            f"Strategy {name!r} does not take option(s) {sorted(unknown)}; it takes "
            f"{sorted(_OPTIONS[name]) or 'no options'}."
        )
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(options.get("device") or _first_device(tf))
    if name == "mirrored":
        return _mirrored(tf, options.get("devices"))
    if name == "multi_worker":
        return _multi_worker(tf, **options)
    if name == "horovod":
        from tfopt.distribute.horovod import HorovodStrategy

        return HorovodStrategy()
    return _tpu(tf, options.get("tpu", ""))


def communication_options(timeout_seconds: float | None, implementation: str = "auto") -> Any:
    """The collective options tfopt uses: a timeout on every collective, so a lost peer cannot hang.

    Args:
        timeout_seconds: Seconds after which a collective raises DeadlineExceededError; None or 0 waits
            forever (TensorFlow's default).
        implementation: "auto", "ring" or "nccl".

    Returns:
        A `tf.distribute.experimental.CommunicationOptions`.
    """
    import tensorflow as tf

    implementations = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }
    if implementation not in implementations:
        raise RecipeConfigError(
            f"implementation={implementation!r} is not a collective implementation. Expected one of "
            f"{', '.join(implementations)}."
        )
    return tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=timeout_seconds or None, implementation=implementations[implementation]
    )


# Each MirroredStrategy numbers its collectives from the same start, and TensorFlow keys what it knows of a
# collective by that number and the devices: a second strategy over the same devices whose gradients are packed
# to another size (a model with a bias folded away, beside the model without) fails "Shape mismatch in the
# collective instance 100". So one strategy per set of devices serves every build of the process.
_mirrored_by_devices: dict[tuple[str, ...] | None, Any] = {}


def adopt_mirrored(strategy: Any) -> tuple[str, ...]:
    """Hands out the user's own `MirroredStrategy` for its devices from here on: a model made under it can be
    copied only under it (TensorFlow refuses variables of one strategy in another's scope). Returns the devices,
    the option that names it."""
    devices = tuple(strategy.extended.worker_devices)
    _mirrored_by_devices[_devices_key(devices)] = strategy
    return devices


def _mirrored(tf: Any, devices: list[str] | None) -> Any:
    key = _devices_key(devices)
    if key not in _mirrored_by_devices:
        _mirrored_by_devices[key] = tf.distribute.MirroredStrategy(devices=devices)
    return _mirrored_by_devices[key]


def _devices_key(devices: Any) -> tuple[tuple[str, int], ...] | None:
    """The devices however named: a strategy the user made over them is the one their model's variables need."""
    return None if devices is None else tuple(sorted(device_key(device) for device in devices))


def device_key(name: str) -> tuple[str, int]:
    """A device as (type, index), however named: "/cpu:1" and "/job:localhost/replica:0/task:0/device:CPU:1" are
    ("CPU", 1).

    Example:
        >>> device_key("/gpu:1"), device_key("/job:localhost/replica:0/task:0/device:GPU:1")
        (('GPU', 1), ('GPU', 1))
    """
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(name)
    return (spec.device_type or "").upper(), spec.device_index or 0


# TensorFlow allows one MultiWorkerMirroredStrategy per process, created before the process's first op
# ("Collective ops must be configured at program startup"; a second one hangs). So the first one made
# is kept and handed out again: a worker can join the cluster at start, and build() later gets the same.
_joined_cluster: dict[tuple[Any, ...], Any] = {}


def _multi_worker(
    tf: Any,
    *,
    communication_timeout_seconds: float | None = DEFAULT_COMMUNICATION_TIMEOUT_SECONDS,
    start_timeout_seconds: float = DEFAULT_START_TIMEOUT_SECONDS,
    cluster_resolver: str = "tf_config",
    implementation: str = "auto",
) -> Any:
    options = (communication_timeout_seconds, cluster_resolver, implementation)
    if _joined_cluster:
        ((joined_options, strategy),) = _joined_cluster.items()
        if joined_options != options:
            raise DistributionError(
                f"This process already joined a multi-worker cluster with (communication_timeout_seconds, "
                f"cluster_resolver, implementation)={joined_options}; TensorFlow allows one "
                f"MultiWorkerMirroredStrategy per process, so it cannot join again with {options}. Use the "
                "same distribution settings everywhere in one process."
            )
        return strategy
    _joined_cluster[options] = _new_multi_worker(
        tf, communication_timeout_seconds, start_timeout_seconds, cluster_resolver, implementation
    )
    return _joined_cluster[options]


def _new_multi_worker(
    tf: Any,
    communication_timeout_seconds: float | None,
    start_timeout_seconds: float,
    cluster_resolver: str,
    implementation: str,
) -> Any:
    from tfopt.distribute.rendezvous import await_peers

    if cluster_resolver == "tf_config":
        from tfopt.distribute.environment import parse_tf_config
        from tfopt.environment_variables import text

        resolver = None  # MultiWorkerMirroredStrategy reads TF_CONFIG itself
        if text("TF_CONFIG"):
            config = parse_tf_config(text("TF_CONFIG"))  # a clear error instead of TensorFlow's KeyError
            task = config["task"]
            await_peers(config["cluster"], task.get("type", "worker"), int(task.get("index", 0)), start_timeout_seconds)
    elif cluster_resolver == "slurm":
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver()
        await_peers(resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id, start_timeout_seconds)
    else:
        raise RecipeConfigError(
            f"cluster_resolver={cluster_resolver!r} is not supported. Expected 'tf_config' or 'slurm'."
        )
    try:
        with _python_sigterm_kept():
            return tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver,
                communication_options=communication_options(communication_timeout_seconds, implementation),
            )
    except (RuntimeError, ValueError, tf.errors.OpError) as error:
        if "must be configured at program startup" in str(error):
            raise DistributionError(
                f"MultiWorkerMirroredStrategy could not join the cluster: {error}. TensorFlow ran an op in this "
                "worker before the strategy existed (making the dataset or the model does): join first, at the "
                "top of the script, with tfopt.runtime.join_cluster(communication_timeout_seconds="
                f"{DEFAULT_COMMUNICATION_TIMEOUT_SECONDS:g}, start_timeout_seconds={DEFAULT_START_TIMEOUT_SECONDS:g}), "
                "before anything else touches TensorFlow."
            ) from error
        raise DistributionError(
            f"MultiWorkerMirroredStrategy could not join the cluster: {error}. Check that every worker "
            "was started with the same cluster in TF_CONFIG and a distinct task index, and that the "
            "addresses are reachable."
        ) from error


@contextlib.contextmanager
def _python_sigterm_kept() -> Iterator[None]:
    """Puts Python's SIGTERM handling back after the block: joining a cluster, TensorFlow's coordination service
    installs a SIGTERM handler of its own (its preemption notifier), which swallows the SIGTERM a worker gets
    when its launcher dies (`PR_SET_PDEATHSIG`) or a scheduler stops it, and replaces the command line's."""
    import threading

    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)


def _tpu(tf: Any, tpu: str) -> Any:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        raise DistributionError(
            f"No TPU could be reached (tpu={tpu!r}): {error}. On a TPU VM pass tpu=''; on Colab/Kaggle "
            "select a TPU runtime; elsewhere pass the TPU's name or grpc:// address."
        ) from error
    return tf.distribute.TPUStrategy(resolver)


def _first_device(tf: Any) -> str:
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else tf.config.list_logical_devices("CPU")[0].name
