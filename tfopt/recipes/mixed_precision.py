"""Mixed precision: compute in 16 bits where the hardware does it natively, keep variables in float32.

bfloat16 keeps float32's exponent range, so it needs no loss scaling and is the choice wherever the
hardware has it (GPUs of compute capability 8.0+, TPUs, CPUs with AVX512-BF16 or AMX). float16 needs
loss scaling and only pays off on GPU tensor cores (compute capability 7.x). On a CPU without bf16
instructions 16-bit compute is emulated and slower, so "auto" keeps float32 there
(docs/recipes/mixed_precision.md has the measurements).

Keras reads the dtype policy when a layer is created, so this recipe only records the policy in the
plan; `build()` creates the model under it, with the output layers in float32.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import ClassVar

from tfopt.errors import RecipeConfigError
from tfopt.hardware import Hardware
from tfopt.plan import Plan
from tfopt.policies import dtype_policy_scope
from tfopt.recipes.base import Recipe, Stage

POLICIES = ("auto", "mixed_float16", "mixed_bfloat16", "float32")


def choose_policy(hardware: Hardware) -> tuple[str, str]:
    """The fastest safe dtype policy for `hardware`, and the reason for it.

    Example:
        >>> from tfopt.hardware import Gpu, Hardware
        >>> choose_policy(Hardware(gpus=(Gpu("NVIDIA A100", (8, 0)),)))[0]
        'mixed_bfloat16'
        >>> choose_policy(Hardware(gpus=(Gpu("Tesla V100", (7, 0)),)))[0]
        'mixed_float16'
    """
    if hardware.accelerator == "tpu":
        return "mixed_bfloat16", "TPUs compute natively in bfloat16"
    if hardware.accelerator == "gpu":
        major, minor = hardware.min_compute_capability
        if major >= 8:
            return "mixed_bfloat16", (
                f"GPU compute capability {major}.{minor} >= 8.0 has bfloat16 tensor cores; "
                "bfloat16 needs no loss scaling"
            )
        if major == 7:
            return "mixed_float16", (
                f"GPU compute capability {major}.{minor} has float16 tensor cores but no "
                "bfloat16; float16 with loss scaling"
            )
        return "float32", f"GPU compute capability {major}.{minor} < 7.0 has no 16-bit tensor cores"
    if hardware.cpu_supports_bf16:
        flags = ", ".join(sorted(hardware.cpu_flags & {"avx512_bf16", "amx_bf16"}))
        return "mixed_bfloat16", f"the CPU has native bfloat16 instructions ({flags})"
    return "float32", (
        "no GPU or TPU, and the CPU lacks bfloat16 instructions (AVX512-BF16/AMX): "
        "16-bit compute would be emulated and slower"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixedPrecision(Recipe):
    """Builds the model under a mixed dtype policy (bf16 or fp16 chosen by the hardware), float32 outputs.

    Args:
        policy: "auto" (chosen by the hardware), "mixed_float16", "mixed_bfloat16" or "float32".
        tf32: What float32 math (the float32 policy, and the float32 layers of a mixed one) means on GPUs
            of compute capability 8.0+: True runs matmuls and convolutions in TF32 (10-bit mantissa,
            TensorFlow's default there), False in IEEE float32 (exact to float32 rounding, slower), None
            keeps the process' setting. No effect on other hardware, which has no TF32.

    Example:
        >>> MixedPrecision(policy="mixed_bfloat16").get_config()
        {'policy': 'mixed_bfloat16', 'tf32': None}
    """

    name: ClassVar[str] = "mixed_precision"
    stage: ClassVar[Stage] = Stage.NUMERICS

    policy: str = "auto"
    tf32: bool | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise RecipeConfigError(
                f"mixed_precision: policy={self.policy!r} is not a policy. Expected one of "
                f"{', '.join(repr(policy) for policy in POLICIES)}.",
                setting="policy",
            )
        if self.tf32 is not None and not isinstance(self.tf32, bool):
            raise RecipeConfigError(
                f"mixed_precision: tf32={self.tf32!r}. Expected true (TF32 float32 math on "
                "GPUs of compute capability 8.0+), false (IEEE float32) or null (keep "
                "TensorFlow's setting).",
                setting="tf32",
            )

    def check(self, plan: Plan) -> None:
        if self.policy == "mixed_float16" and plan.hardware.accelerator == "tpu":
            raise RecipeConfigError(
                "mixed_precision: policy='mixed_float16' does not run on TPUs, which "
                "compute in bfloat16. Use policy='mixed_bfloat16' or 'auto'.",
                setting="policy",
            )

    def __call__(self, plan: Plan) -> Plan:
        if self.policy == "auto":
            policy, reason = choose_policy(plan.hardware)
        else:
            policy, reason = self.policy, "requested"
            recommended, _ = choose_policy(plan.hardware)
            if policy != recommended:
                reason += f" (on this hardware 'auto' would choose {recommended!r})"
        tf32 = plan.tf32 if self.tf32 is None else self.tf32
        float32 = _float32_math(plan.hardware, tf32)
        if policy == "float32":
            return plan.replace(dtype_policy="float32", tf32=tf32).record(
                self.name, f"kept float32: {reason}{float32}", skipped=True
            )
        scaling = (
            "; the optimizer is wrapped in LossScaleOptimizer where Keras' own train_step scales the loss"
            if policy == "mixed_float16"
            else ""
        )
        return plan.replace(dtype_policy=policy, tf32=tf32).record(
            self.name, f"{policy}: {reason}; output layers compute in float32{scaling}{float32}"
        )


def _float32_math(hardware: Hardware, tf32: bool) -> str:
    if not hardware.has_tf32:
        return ""
    if tf32:
        return "; float32 math runs in TF32 on this GPU (tf32: false for IEEE float32)"
    return "; float32 math in IEEE float32 (TF32 turned off: exact, slower matmuls)"


@contextlib.contextmanager
def float32_matmul_scope(*, tf32: bool) -> Iterator[None]:
    """Functional form: float32 matmuls and convolutions in TF32 (True) or IEEE float32 (False) in the block.

    TensorFlow's TF32 switch is process-wide and read when kernels run; the previous setting is restored
    after the block. Tests that compare two float32 computations to 1e-5 need tf32=False on Ampere+ GPUs.

    Example:
        >>> import tensorflow as tf
        >>> with float32_matmul_scope(tf32=False):
        ...     tf.config.experimental.tensor_float_32_execution_enabled()
        False
        >>> tf.config.experimental.tensor_float_32_execution_enabled()
        True
    """
    import tensorflow as tf

    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(tf32)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(previous)


@contextlib.contextmanager
def policy_scope(policy: str = "auto", hardware: Hardware | None = None) -> Iterator[str]:
    """Functional form: layers created in the block use the chosen policy; the old one is restored after.

    For people who build their model themselves and want only this piece. Remember to give the last
    layer dtype="float32".

    Args:
        policy: As for `MixedPrecision`.
        hardware: The hardware "auto" decides for; detected when None.

    Yields:
        The policy name in force.

    Example:
        >>> import keras
        >>> with policy_scope("mixed_bfloat16") as chosen:
        ...     keras.layers.Dense(4).compute_dtype
        'bfloat16'
    """

    MixedPrecision(policy=policy)  # validates the name
    if policy == "auto":
        from tfopt.hardware import detect

        policy, _ = choose_policy(hardware or detect())
    with dtype_policy_scope(policy):
        yield policy
