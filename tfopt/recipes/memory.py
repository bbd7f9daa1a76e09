"""GPU memory: let TensorFlow grow its allocation as needed, or cap it per process.

By default TensorFlow reserves nearly all of every GPU's memory when it initialises them, so a second
process on the same GPU (a notebook next to a training run, two workers sharing a GPU) fails.
`set_memory_growth` makes it allocate as needed; a logical device with `memory_limit` caps it. Both are
exclusive (TensorFlow refuses growth on a device with a virtual-device configuration) and both only
work before TensorFlow initialises the GPUs, which happens at its first op or device query: by the time
a Plan exists it is too late. So `configure_gpu_memory()` is called at process start (`tfopt-recipe run`
does it before anything else when the recipe file has `gpu_memory`), and the recipe only checks that
the setting is in force, with an error that says how to get it there.

Peak memory before and after a change is measured with `tfopt.training.peak_memory.track_peak_memory`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

from tfopt.errors import RecipeConfigError
from tfopt.plan import Plan
from tfopt.recipes.base import Recipe, Stage

_TOO_LATE = ("GPU memory settings must be made before TensorFlow initialises the GPUs (its first op or "
             "device query), and this process already did. Call tfopt.recipes.configure_gpu_memory({args}) at the "
             "top of your script, before building models or datasets; in a notebook, restart the kernel and call it "
             "in the first cell. Or set the environment variable TF_FORCE_GPU_ALLOW_GROWTH=true before Python "
             "starts (for memory growth), or list gpu_memory in the recipe file: `tfopt-recipe run` applies it first.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuMemory(Recipe):
    """Requires GPU memory growth, or a per-process memory limit, to be in force.

    Args:
        growth: Allocate GPU memory as needed instead of reserving it all at start.
        limit_bytes: Cap this process' memory on each GPU instead (needs growth=False).

    Example:
        >>> GpuMemory(growth=False, limit_bytes=4 * 2**30).get_config()
        {'growth': False, 'limit_bytes': 4294967296}
    """

    name: ClassVar[str] = "gpu_memory"
    stage: ClassVar[Stage] = Stage.PLACEMENT

    growth: bool = True
    limit_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.growth, bool):
            raise RecipeConfigError(f"gpu_memory: growth={self.growth!r}. Expected true or false.")
        if self.limit_bytes is not None and (not isinstance(self.limit_bytes, int) or self.limit_bytes < 2**20):
            raise RecipeConfigError(f"gpu_memory: limit_bytes={self.limit_bytes!r}. Expected a number of bytes of "
                                    "at least 1 MiB (e.g. 4294967296 for 4 GiB), or null for no limit.")
        if self.growth and self.limit_bytes is not None:
            raise RecipeConfigError(
                f"gpu_memory: growth=True and limit_bytes={self.limit_bytes} exclude each other (TensorFlow refuses "
                "memory growth on a device with a memory limit). Set growth: false to cap memory, or drop "
                "limit_bytes to grow as needed.")

    def check(self, plan: Plan) -> None:
        if plan.hardware.gpus and not _in_force(self):
            raise RecipeConfigError(f"gpu_memory: {self._describe()} is not in force. " + _TOO_LATE.format(
                args=self._call_arguments()))

    def __call__(self, plan: Plan) -> Plan:
        if not plan.hardware.gpus:
            return plan.record(self.name, "no GPU: host memory is not reserved up front", skipped=True)
        return plan.record(self.name, f"{self._describe()} (set at process start)")

    def _describe(self) -> str:
        if self.limit_bytes is not None:
            return f"a memory limit of {self.limit_bytes / 2**30:.2f} GiB per GPU"
        return "memory growth" if self.growth else "TensorFlow's default (reserve all GPU memory)"

    def _call_arguments(self) -> str:
        return f"growth={self.growth}, limit_bytes={self.limit_bytes}"


def configure_gpu_memory(*, growth: bool = True, limit_bytes: int | None = None) -> list[str]:
    """Functional form: sets memory growth or a memory limit on every GPU. Call it before any TF work.

    Args:
        growth: Allocate as needed instead of reserving all memory.
        limit_bytes: Cap memory per GPU (a logical device with this limit) instead; needs growth=False.

    Returns:
        The GPUs configured (empty on a machine without GPUs).

    Raises:
        RecipeConfigError: The settings conflict, or TensorFlow already initialised the GPUs.

    Example:
        >>> configure_gpu_memory(growth=True)  # at the top of a script  # doctest: +SKIP
        ['/physical_device:GPU:0']
    """
    import tensorflow as tf

    recipe = GpuMemory(growth=growth, limit_bytes=limit_bytes)  # validates the combination
    gpus = tf.config.list_physical_devices("GPU")
    if _in_force(recipe):  # a notebook cell run twice, or TF_FORCE_GPU_ALLOW_GROWTH: nothing left to do
        return [gpu.name for gpu in gpus]
    for gpu in gpus:
        try:
            if limit_bytes is not None:
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_bytes // 2**20)])  # in MiB
            else:
                tf.config.experimental.set_memory_growth(gpu, growth)
        except RuntimeError as error:
            raise RecipeConfigError(f"gpu_memory: TensorFlow refused the setting ({error}). " + _TOO_LATE.format(
                args=f"growth={growth}, limit_bytes={limit_bytes}")) from error
    return [gpu.name for gpu in gpus]


def _in_force(recipe: GpuMemory) -> bool:
    import tensorflow as tf

    # TensorFlow's allocator reads TF_FORCE_GPU_ALLOW_GROWTH ("true"/"false") over set_memory_growth, and
    # get_memory_growth() reports only what set_memory_growth was told.
    forced = {"true": True, "false": False}.get(os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "").lower())
    for gpu in tf.config.list_physical_devices("GPU"):
        if recipe.limit_bytes is not None:
            limits = [config.memory_limit for config in tf.config.get_logical_device_configuration(gpu) or []]
            if limits != [recipe.limit_bytes // 2**20]:
                return False
        elif (bool(tf.config.experimental.get_memory_growth(gpu)) if forced is None else forced) != recipe.growth:
            return False
    return True
