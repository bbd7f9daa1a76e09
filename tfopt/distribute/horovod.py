"""Horovod on its core TensorFlow ops only, because its Keras layer is silently broken on Keras 3.

Measured with Horovod 0.28.1 (the last release) and Keras 3: `horovod.tensorflow.keras`'s
DistributedOptimizer trains without error but never averages gradients, so ranks drift apart; its
BroadcastGlobalVariablesCallback and DistributedGradientTape reject Keras 3 variables. What works is the
core: `hvd.allreduce` of each gradient in tfopt's own train step, and `hvd.broadcast` of each
variable's `.value` from rank 0 before training. `HorovodStrategy` wraps exactly that.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from tfopt.errors import DistributionError

if TYPE_CHECKING:
    import tensorflow as tf

INSTALL_HINT = (
    "Install Horovod built for your TensorFlow with the script in the tfopt repository: "
    "`PYTHON=$(which python) bash scripts/install_horovod.sh` (needs cmake and g++, builds for several "
    "minutes; CPU/Gloo by default, set HOROVOD_GPU_OPERATIONS=NCCL for GPUs). A plain `pip install "
    "horovod` fails: 0.28.1 is sdist-only, needs --no-build-isolation, and on TensorFlow >= 2.19 a "
    "one-line patch that the script applies."
)


def import_horovod() -> Any:
    """Imports `horovod.tensorflow`, or explains how to install it.

    Raises:
        DistributionError: Horovod is not installed, or was built for another TensorFlow.
    """
    try:
        import horovod.tensorflow as hvd
    except ImportError as error:
        raise DistributionError(
            f"strategy='horovod' needs Horovod, which could not be imported ({error}). {INSTALL_HINT}"
        ) from error
    except Exception as error:  # a stale build raises NotFoundError/OSError on a missing symbol
        raise DistributionError(
            f"Horovod is installed but failed to load ({type(error).__name__}: {error}); "
            "it was probably built against another TensorFlow. Rebuild it: "
            f"{INSTALL_HINT}"
        ) from error
    return hvd


class HorovodStrategy:
    """One process per device, gradients averaged with `hvd.allreduce`, rank 0's weights broadcast.

    Quacks like the parts of a tf.distribute strategy that `build()` and `tfopt.distribute.fit` use:
    `scope()` and `num_replicas_in_sync`. Creating it initialises Horovod and pins this process to
    the GPU of its local rank, if there are GPUs.

    Raises:
        DistributionError: Horovod cannot be imported.
    """

    def __init__(self) -> None:
        import tensorflow as tf

        self._hvd = import_horovod()
        self._hvd.init()
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            gpu = gpus[self._hvd.local_rank() % len(gpus)]
            tf.config.experimental.set_memory_growth(gpu, True)
            tf.config.set_visible_devices(gpu, "GPU")

    @property
    def num_replicas_in_sync(self) -> int:
        return int(self._hvd.size())

    @property
    def worker_index(self) -> int:
        return int(self._hvd.rank())

    @property
    def is_chief(self) -> bool:
        return self.worker_index == 0

    def scope(self) -> contextlib.AbstractContextManager:
        """The default strategy's scope: every Horovod process holds a plain copy of the variables."""
        import tensorflow as tf

        return tf.distribute.get_strategy().scope()

    def average_gradients(self, gradients: list[Any]) -> list[Any]:
        """Averages each gradient over all ranks (None gradients stay None)."""
        return [
            None if gradient is None else self._hvd.allreduce(gradient, op=self._hvd.Average) for gradient in gradients
        ]

    def mean(self, value: Any) -> Any:
        """Averages a tensor over all ranks (for the reported loss)."""
        return self._hvd.allreduce(value, op=self._hvd.Average)

    def broadcast_variables(self, variables: list[Any], root_rank: int = 0) -> None:
        """Copies `root_rank`'s values into every rank's variables.

        `hvd.broadcast_variables` rejects Keras 3 variables, so each one's plain tensor (`.value`) is
        broadcast and assigned back.
        """
        for variable in variables:
            variable.assign(self._hvd.broadcast(getattr(variable, "value", variable), root_rank=root_rank))

    def shard(self, dataset: tf.data.Dataset, global_batch_size: int, steps_per_epoch: int | None) -> tf.data.Dataset:
        """Gives this rank its disjoint 1/size of every global batch.

        The global batches are split into per-rank batches and dealt out round-robin, so step k of every
        rank together covers exactly global batch k. Every rank must run the same number of steps (an
        allreduce waits for all), so the dataset is cut to a whole number of global batches.

        Raises:
            DistributionError: The global batch does not split evenly, or the number of steps is unknown.
        """
        import tensorflow as tf

        size, rank = self.num_replicas_in_sync, self.worker_index
        if global_batch_size % size:
            raise DistributionError(
                f"The global batch of {global_batch_size} does not split evenly over {size} Horovod ranks; "
                f"use a multiple of {size} (the distribution recipe scales it for you)."
            )
        cardinality = int(dataset.cardinality())
        if steps_per_epoch is None and cardinality < 0:
            raise DistributionError(
                "Under Horovod every rank must run the same number of steps, but the dataset's length is "
                "unknown (or infinite). Pass steps_per_epoch=..., or build the dataset so that "
                "dataset.cardinality() is known (e.g. batch(..., drop_remainder=True) on finite data)."
            )
        per_rank = dataset.rebatch(global_batch_size // size, drop_remainder=True)
        if cardinality >= 0:
            per_rank = per_rank.take(cardinality * size)
        return per_rank.shard(size, rank).prefetch(tf.data.AUTOTUNE)

    def lost_worker_errors(self) -> tuple[type, ...]:
        """The exceptions Horovod raises when a rank disappears."""
        from horovod.common.exceptions import HorovodInternalError

        return (HorovodInternalError,)
