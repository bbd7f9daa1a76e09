"""Distribution: train on every device and worker there is, with the batch and learning rate to match.

The strategy must exist before the model's variables do, so this recipe only decides: which strategy
(from the hardware and the launcher's environment variables), how many replicas that gives, the global
batch (per-replica batch x replicas), optionally the learning rate (linear or square-root scaling, with
warm-up), and how tf.data shards the input across workers. `build()` then creates the strategy and the
model inside it, and `tfopt.distribute.fit` trains, also under multi-worker where Keras 3's own `fit` fails.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tfopt.data.batches import rebatch_counted
from tfopt.distribute.environment import ClusterEnvironment, detect_environment
from tfopt.distribute.strategy import (
    DEFAULT_COMMUNICATION_TIMEOUT_SECONDS,
    DEFAULT_START_TIMEOUT_SECONDS,
    device_key,
)
from tfopt.errors import RecipeClashError, RecipeConfigError
from tfopt.hardware import Hardware
from tfopt.plan import Plan
from tfopt.recipes.base import Recipe, Stage
from tfopt.recipes.learning_rate import check_rule, scale_learning_rate

if TYPE_CHECKING:
    import tensorflow as tf

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "horovod", "tpu")
SHARD_POLICIES = ("auto", "file", "data", "off")

# Keras 3.15 (TF 2.21) cannot train these under tf.distribute's mirrored strategies, in its own fit as in tfopt's
# step; plain Keras fails the same way (tests/recipes/test_distribution.py). Gradient accumulation applies its
# update inside a cond, where the strategy refuses the all-reduce ("merge_call called while defining a new graph"),
# whatever the replicas, under MultiWorkerMirroredStrategy too. Several steps per call fail with several replicas
# in this process ("You must feed a value for placeholder"); tfopt's loop for several workers runs one step per
# call. Horovod applies the update outside any tf.distribute strategy, and one device has no all-reduce.
ACCUMULATION_FAILS_UNDER = ("mirrored", "multi_worker")
ACCUMULATION_FAILS = (
    "Keras 3.15 cannot accumulate gradients under MirroredStrategy or MultiWorkerMirroredStrategy: the optimizer "
    'applies the accumulated update inside a cond, where the strategy refuses the all-reduce ("merge_call called '
    'while defining a new graph"; plain Keras fails the same way). Use distribution alone, whose global batch '
    "(scale_batch: true multiplies the batch by the replicas) is the larger batch accumulation would give, or "
    "grad_accum without distribution, on one device"
)


def choose_strategy(hardware: Hardware, environment: ClusterEnvironment) -> tuple[str, str]:
    """The strategy "auto" picks for this hardware and launcher, and why.

    A launcher that started several processes decides first (they must cooperate or they would train
    separate models); then the accelerators of this machine.

    Example:
        >>> from tfopt.distribute.environment import detect_environment
        >>> choose_strategy(Hardware(), detect_environment({"HOROVOD_SIZE": "2"}))[0]
        'horovod'
        >>> choose_strategy(Hardware(), detect_environment({}))[0]
        'default'
    """
    if environment.launcher == "horovod":
        return "horovod", f"launched by Horovod: {environment.reason}"
    if environment.launcher in ("tf_config", "slurm"):
        return "multi_worker", environment.reason
    if hardware.tpu_cores:
        return "tpu", f"{hardware.tpu_cores} TPU cores are visible"
    if len(hardware.gpus) > 1:
        return "mirrored", f"{len(hardware.gpus)} GPUs on this machine"
    if hardware.gpus:
        return "one_device", "one GPU: place the model on it"
    return "default", "a single CPU process: there is nothing to distribute over"


def count_replicas(
    strategy: str, hardware: Hardware, environment: ClusterEnvironment, devices: tuple[str, ...] | None = None
) -> int:
    """How many copies of the model train in sync under `strategy` (the factor the batch grows by)."""
    devices_per_worker = max(1, len(hardware.gpus))
    if strategy == "mirrored":
        return len(devices) if devices else devices_per_worker
    if strategy == "multi_worker":
        return environment.num_workers * devices_per_worker
    if strategy == "horovod":
        return environment.num_workers  # one process per device
    if strategy == "tpu":
        return max(1, hardware.tpu_cores)
    return 1


def several_steps_refused(plan: Plan) -> str | None:
    """Why the plan's strategy cannot train several steps per call of Keras' train function, or None where it can:
    Keras 3.15 fails with more than one under MirroredStrategy over several replicas in this process."""
    if plan.strategy != "mirrored":
        return None
    devices = plan.strategy_options.get("devices")
    # Mirrored replicas are this machine's devices: no launcher's environment counts them.
    replicas = count_replicas("mirrored", plan.hardware, detect_environment({}), tuple(devices) if devices else None)
    if replicas == 1:
        return None
    return (
        f"Keras 3.15 fails with more than one step per call under MirroredStrategy over {replicas} replicas in this "
        'process ("You must feed a value for placeholder"; plain Keras fails the same way)'
    )


def shard_dataset(dataset: tf.data.Dataset, shard_by: str) -> tf.data.Dataset:
    """Sets how tf.data splits `dataset` across workers: "auto", "file", "data" or "off".

    "file" gives each worker whole files (cheap, needs at least as many files as workers); "data" has every
    worker read everything and keep its share (always possible, reads N times); "auto" is TensorFlow's
    AUTO: by file where it can, else by data.
    """
    import tensorflow as tf

    policies = {
        "auto": tf.data.experimental.AutoShardPolicy.AUTO,
        "file": tf.data.experimental.AutoShardPolicy.FILE,
        "data": tf.data.experimental.AutoShardPolicy.DATA,
        "off": tf.data.experimental.AutoShardPolicy.OFF,
    }
    if shard_by not in policies:
        raise RecipeConfigError(
            f"distribution: shard_by={shard_by!r} is not a policy. Expected one of "
            f"{', '.join(repr(name) for name in SHARD_POLICIES)}.",
            setting="shard_by",
        )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policies[shard_by]
    return dataset.with_options(options)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Distribution(Recipe):
    """Trains on all devices/workers: picks the strategy, scales batch and learning rate, shards data.

    Args:
        strategy: "auto" (from hardware and launcher), "one_device", "mirrored", "multi_worker",
            "horovod" or "tpu".
        scale_batch: Multiply the batch by the replica count, so each replica keeps the batch the model
            was tuned for (and the devices stay busy). False splits the existing batch instead.
        scale_learning_rate: "linear" multiplies the learning rate by the replica count (with
            scale_batch), "sqrt" by its square root, "none" keeps it.
        warmup_steps: Steps over which the learning rate ramps up linearly to its (scaled) value.
        shard_by: How workers split the input: "auto", "file", "data" or "off".
        devices: The devices "mirrored" uses (default: all GPUs), e.g. ["/gpu:0", "/gpu:1"].
        communication_timeout_seconds: Multi-worker collectives fail after this long instead of hanging.
        start_timeout_seconds: A multi-worker worker waits this long for every peer to start before joining
            them, then fails naming those that did not.
        environ: The environment to read launcher variables from; the process's own when None.

    Example:
        >>> Distribution(strategy="mirrored", scale_learning_rate="linear").strategy
        'mirrored'
    """

    name: ClassVar[str] = "distribution"
    stage: ClassVar[Stage] = Stage.PLACEMENT

    strategy: str = "auto"
    scale_batch: bool = True
    scale_learning_rate: str = "none"
    warmup_steps: int = 0
    shard_by: str = "auto"
    devices: tuple[str, ...] | None = None
    communication_timeout_seconds: float = DEFAULT_COMMUNICATION_TIMEOUT_SECONDS
    start_timeout_seconds: float = DEFAULT_START_TIMEOUT_SECONDS
    environ: Mapping[str, str] | None = dataclasses.field(default=None, hash=False)

    def __post_init__(self) -> None:
        for field, value, allowed in (
            ("strategy", self.strategy, STRATEGIES),
            ("shard_by", self.shard_by, SHARD_POLICIES),
        ):
            if value not in allowed:
                raise RecipeConfigError(
                    f"distribution: {field}={value!r} is not valid. Expected one of "
                    f"{', '.join(repr(name) for name in allowed)}.",
                    setting=field,
                )
        check_rule(self.name, self.scale_learning_rate)
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise RecipeConfigError(
                f"distribution: warmup_steps={self.warmup_steps!r}: expected an integer >= 0.", setting="warmup_steps"
            )
        if not isinstance(self.communication_timeout_seconds, (int, float)) or self.communication_timeout_seconds < 0:
            raise RecipeConfigError(
                f"distribution: communication_timeout_seconds={self.communication_timeout_seconds!r}: "
                "expected seconds >= 0 (0 waits forever).",
                setting="communication_timeout_seconds",
            )
        seconds = self.start_timeout_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise RecipeConfigError(
                f"distribution: start_timeout_seconds={seconds!r}: expected seconds above 0, e.g. 600 where "
                "workers take long to be scheduled.",
                setting="start_timeout_seconds",
            )
        if self.devices is not None:
            if isinstance(self.devices, str) or not all(isinstance(device, str) for device in self.devices):
                raise RecipeConfigError(
                    f"distribution: devices={self.devices!r}: expected a list of device names "
                    "such as ['/gpu:0', '/gpu:1'].",
                    setting="devices",
                )
            object.__setattr__(self, "devices", tuple(self.devices))
            if self.strategy not in ("mirrored", "auto"):
                # Blamed on devices, which only 'mirrored' reads: another strategy says how the job is launched.
                raise RecipeConfigError(
                    f"distribution: devices is only used by strategy='mirrored'; received "
                    f"strategy={self.strategy!r}. Remove devices or use 'mirrored'.",
                    setting="devices",
                )

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["devices"] = list(self.devices) if self.devices is not None else None
        config["environ"] = dict(self.environ) if self.environ is not None else None
        return config

    def check(self, plan: Plan) -> None:
        self.check_before_trials(plan)
        name, _, environment = self._resolve(plan)
        replicas = self._replicas(name, environment, plan)
        if not self.scale_batch and plan.batch_size % replicas:
            raise RecipeConfigError(
                f"distribution: scale_batch=False splits the batch of {plan.batch_size} over {replicas} "
                f"replicas, which does not divide evenly. Use a batch that is a multiple of {replicas}, "
                "or scale_batch=True.",
                setting="scale_batch",
            )

    def check_before_trials(self, plan: Plan) -> None:
        name, _, environment = self._resolve(plan)
        if name == "horovod" and importlib.util.find_spec("horovod") is None:
            from tfopt.distribute.horovod import INSTALL_HINT

            raise RecipeConfigError(
                f"distribution: strategy='horovod' but Horovod is not installed. {INSTALL_HINT}", setting="strategy"
            )
        if name == "tpu" and not plan.hardware.tpu_cores:
            raise RecipeConfigError(
                "distribution: strategy='tpu' but no TPU is visible on this machine "
                f"({plan.hardware.describe()}). Use strategy='auto', or run on a TPU VM.",
                setting="strategy",
            )
        placed = plan.replace(strategy=name, strategy_options=self._strategy_options(name, environment, plan))
        refused = several_steps_refused(placed) if plan.steps_per_call > 1 else None
        if refused and plan.steps_per_call == (plan.compile_objects.get("steps_per_execution") or 1):
            raise RecipeConfigError(
                f"distribution: your compile runs {plan.steps_per_call} steps per call (steps_per_execution="
                f"{plan.steps_per_call}), and {refused}. Compile with steps_per_execution=1 beside this strategy, "
                "or train on one device with it (strategy: one_device).",
                setting="strategy",
            )
        if refused:
            raise RecipeClashError(
                f"distribution and steps_per_execution cannot be combined: {refused}. Leave steps_per_execution out "
                "beside this strategy (one step per call), or train on one device with it (strategy: one_device).",
                recipes=("distribution", "steps_per_execution"),
            )
        if name == "mirrored" and self.devices:
            _check_devices_exist(self.devices)
        if name in ("mirrored", "multi_worker") and self._replicas(name, environment, plan) > 1:
            _check_no_strings(plan, name)

    def __call__(self, plan: Plan) -> Plan:
        import tensorflow as tf

        name, reason, environment = self._resolve(plan)
        options = self._strategy_options(name, environment, plan)
        replicas = self._replicas(name, environment, plan)
        if replicas == 1 and name in ("default", "one_device") and self.strategy == "auto":
            return plan.replace(strategy=name, strategy_options=options).record(
                self.name, f"{name}: {reason}; 1 replica, batch {plan.batch_size} unchanged", skipped=True
            )
        notes = [f"{name} with {replicas} replica(s): {reason}"]
        dataset, batch_size, compile_config = plan.dataset, plan.batch_size, dict(plan.compile_config)
        if self.scale_batch and replicas > 1:
            batch_size = plan.batch_size * replicas
            # drop_remainder keeps every global batch divisible by the replicas (static per-replica shapes). The
            # length Dataset.rebatch loses is kept: Keras under the strategy counts a pipeline of unknown length
            # wrongly in its logs, and one-iterator training reads `cardinality()` for its steps per epoch. Where
            # tf.data does not know the length, Keras under the strategy counts one step too many after a dropped
            # remainder (TF 2.21, Keras 3.15: 288 examples of 256): the last batch stays, split unevenly.
            unknown = int(dataset.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
            dataset, dropped = rebatch_counted(dataset, batch_size, drop_remainder=not unknown)
            notes.append(
                f"global batch {plan.batch_size} x {replicas} = {batch_size}"
                + (
                    ": a pass of unknown length keeps its last, partial batch, split unevenly over the replicas"
                    if unknown
                    else _dropped(dropped, batch_size)
                )
            )
        else:
            notes.append(f"global batch {batch_size} split {batch_size // replicas} per replica")
        if (self.scale_learning_rate != "none" and batch_size != plan.batch_size) or self.warmup_steps:
            compile_config, lr_detail = scale_learning_rate(
                compile_config,
                old_batch_size=plan.batch_size,
                new_batch_size=batch_size,
                rule=self.scale_learning_rate,
                warmup_steps=self.warmup_steps,
            )
            notes.append(lr_detail)
        if name == "horovod":
            notes.append("each rank reads its share of every global batch (by data)")
        elif name == "multi_worker":
            dataset = shard_dataset(dataset, self.shard_by)
            notes.append(f"input sharded across workers by {self.shard_by}")
        return plan.replace(
            strategy=name,
            strategy_options=options,
            dataset=dataset,
            batch_size=batch_size,
            compile_config=compile_config,
        ).record(self.name, "; ".join(notes))

    def _resolve(self, plan: Plan) -> tuple[str, str, ClusterEnvironment]:
        environment = detect_environment(self.environ)
        if self.strategy == "auto":
            if self.devices:
                return "mirrored", f"devices {list(self.devices)} given", environment
            name, reason = choose_strategy(plan.hardware, environment)
            return name, reason, environment
        return self.strategy, f"requested ({environment.reason})", environment

    def _replicas(self, name: str, environment: ClusterEnvironment, plan: Plan) -> int:
        """The replicas the strategy trains on: over the devices given, or those of the user's own strategy."""
        devices = self._strategy_options(name, environment, plan).get("devices")
        return count_replicas(name, plan.hardware, environment, tuple(devices) if devices else None)

    def _strategy_options(self, name: str, environment: ClusterEnvironment, plan: Plan) -> dict[str, Any]:
        if name == "mirrored" and self.devices:
            return {"devices": list(self.devices)}
        if name == plan.strategy == "mirrored":  # the user's own MirroredStrategy, which their model's variables need
            return dict(plan.strategy_options)
        if name == "multi_worker":
            return {
                "communication_timeout_seconds": float(self.communication_timeout_seconds),
                "start_timeout_seconds": float(self.start_timeout_seconds),
                "cluster_resolver": "slurm" if environment.launcher == "slurm" else "tf_config",
            }
        return {}


def _check_no_strings(plan: Plan, name: str) -> None:
    """Refuses data carrying strings under several replicas: Keras 3.15 reduces the first distributed batch with
    MEAN before training (`TensorFlowTrainer._maybe_symbolic_build`), which fails on strings in plain fit too."""
    import tensorflow as tf

    specs = [spec for spec in tf.nest.flatten(plan.dataset.element_spec) if isinstance(spec, tf.TypeSpec)]
    if any(getattr(spec, "dtype", None) == tf.string for spec in specs):
        raise RecipeConfigError(
            f"distribution: your data carries strings (raw text for a StringLookup or TextVectorization in the "
            f"model), and Keras 3.15 under {name} over several replicas reduces the first batch with MEAN before "
            "training, which strings cannot take: plain fit fails there too. Look the strings up in a dataset map "
            "(the model then takes ids), or leave distribution out.",
            setting="strategy",
        )


def _check_devices_exist(devices: tuple[str, ...]) -> None:
    """Refuses devices this process does not have, or one named twice: MirroredStrategy waits for a missing
    device's replica forever, and fails on a repeated one with a bare AssertionError."""
    import tensorflow as tf

    present = {device_key(device.name) for device in tf.config.list_logical_devices()}
    keys = [device_key(device) for device in devices]
    missing = [device for device, one in zip(devices, keys) if one not in present]
    repeated = sorted({device for device, one in zip(devices, keys) if keys.count(one) > 1})
    if missing or repeated:
        what = (
            f"names {', '.join(missing)}, which this process does not have"
            if missing
            else f"names {', '.join(repeated)} more than once"
        )
        have = ", ".join(device.name for device in tf.config.list_logical_devices())
        raise RecipeConfigError(
            f"distribution: devices={list(devices)} {what} (it has {have}): MirroredStrategy would wait for a "
            "missing device forever. Name each device once, from tf.config.list_logical_devices(), or leave "
            "devices out to use every GPU.",
            setting="devices",
        )


def _dropped(dropped: int | None, batch_size: int) -> str:
    """What keeping every global batch whole drops of each pass over the data, for the plan's record."""
    if dropped == 0:
        return ""
    count = f"up to {batch_size - 1}" if dropped is None else str(dropped)
    return (
        f" (the last {count} examples of each pass, short of a whole global batch, are dropped, so that every "
        "replica gets a batch of the same size; shuffle the data each epoch so that other examples are dropped "
        "each time)"
    )
