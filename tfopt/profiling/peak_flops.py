"""Peak dense FLOP/s of accelerators by precision: the denominator of MFU (model FLOPs utilization).

Figures are the vendors' dense (no structured sparsity) tensor-core peaks per device, in TFLOP/s:

| device | fp32 | tf32 | bf16 | fp16 | source |
|---|---|---|---|---|---|
| H100 SXM5 | 67 | 494.7 | 989.4 | 989.4 | NVIDIA H100 Tensor Core GPU datasheet (sparse figures halved) |
| H100 PCIe | 51 | 378 | 756 | 756 | same datasheet |
| H200 SXM | 67 | 494.7 | 989.4 | 989.4 | NVIDIA H200 Tensor Core GPU datasheet |
| A100 (SXM and PCIe) | 19.5 | 156 | 312 | 312 | NVIDIA A100 Tensor Core GPU datasheet |
| L4 | 30.3 | 60 | 121 | 121 | NVIDIA L4 Tensor Core GPU datasheet |
| T4 | 8.1 | - | - | 65 | NVIDIA T4 Tensor Core GPU datasheet |
| V100 SXM2 | 15.7 | - | - | 125 | NVIDIA Tesla V100 datasheet |
| V100 PCIe | 14 | - | - | 112 | same datasheet |
| TPU v4 (per chip) | - | - | 275 | - | Google Cloud TPU v4 documentation |
| TPU v5e (per chip) | - | - | 197 | - | Google Cloud TPU v5e documentation |

A device or precision not in the table has no MFU: tfopt says so rather than guess.

Memory bandwidth per device, in TB/s, for the roofline's ridge point (peak FLOP/s over bandwidth: the
arithmetic intensity below which a kernel waits for memory), from the same datasheets: H100 SXM5 3.35,
H100 PCIe 2.0, H200 SXM 4.8, A100 80GB SXM 2.039, A100 40GB 1.555, L4 0.3, T4 0.32, V100 0.9, TPU v4
1.2 (Google Cloud TPU v4 documentation), TPU v5e 0.819 (its documentation).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tfopt.hardware import Hardware

if TYPE_CHECKING:
    import keras

_TERA = 1e12

# (pattern over the lower-cased device name, {precision: TFLOP/s}); the first match wins, so more
# specific names come first (H100 PCIe before any H100).
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"h100.*pcie", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (r"h100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"h200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"a100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"\bl4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (r"\bt4\b", {"fp32": 8.1, "fp16": 65.0}),
    (r"v100.*pcie", {"fp32": 14.0, "fp16": 112.0}),
    (r"v100", {"fp32": 15.7, "fp16": 125.0}),
    (r"tpu v4|^v4", {"bf16": 275.0}),
    (r"tpu v5e|^v5e|^v5litepod", {"bf16": 197.0}),
)

MEMORY_TERABYTES_PER_SECOND: tuple[tuple[str, float], ...] = (
    (r"h100.*pcie", 2.0),
    (r"h100", 3.35),
    (r"h200", 4.8),
    (r"a100.*80", 2.039),
    (r"a100", 1.555),
    (r"\bl4\b", 0.3),
    (r"\bt4\b", 0.32),
    (r"v100", 0.9),
    (r"tpu v4|^v4", 1.2),
    (r"tpu v5e|^v5e|^v5litepod", 0.819),
)

_PRECISION_OF_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}


def peak_flops_per_second(hardware: Hardware, precision: str | None, *, devices: int = 1) -> float | None:
    """The peak dense FLOP/s of `devices` of the hardware's accelerator at `precision`, or None if unknown.

    Example:
        >>> from tfopt.hardware import Gpu
        >>> h100 = Hardware(gpus=(Gpu("NVIDIA H100 80GB HBM3", (9, 0)),))
        >>> peak_flops_per_second(h100, "bf16") / 1e12
        989.4
        >>> peak_flops_per_second(Hardware(), "fp32") is None  # a CPU has no entry
        True
    """
    name = accelerator_name(hardware)
    if name is None or precision is None:
        return None
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, name):
            peak = peaks.get(precision)
            return peak * _TERA * devices if peak is not None else None
    return None


def memory_bandwidth_bytes_per_second(hardware: Hardware) -> float | None:
    """The accelerator's memory bandwidth in bytes/s, or None where it is not in the table (CPUs too).

    Example:
        >>> from tfopt.hardware import Gpu
        >>> memory_bandwidth_bytes_per_second(Hardware(gpus=(Gpu("NVIDIA H200", (9, 0)),))) / 1e12
        4.8
    """
    name = accelerator_name(hardware)
    if name is None:
        return None
    return next(
        (terabytes * _TERA for pattern, terabytes in MEMORY_TERABYTES_PER_SECOND if re.search(pattern, name)), None
    )


def accelerator_name(hardware: Hardware) -> str | None:
    """The lower-cased accelerator name the table is matched against: the first GPU's name, or a TPU's
    type from `TPU_ACCELERATOR_TYPE` (set on Cloud TPU VMs, e.g. "v4-8"); None on a CPU-only machine."""
    if hardware.accelerator == "gpu":
        return hardware.gpus[0].name.lower()
    if hardware.accelerator == "tpu":
        from tfopt.environment_variables import text

        return (text("TPU_ACCELERATOR_TYPE") or "").lower() or None
    return None


def precision_in_use(model: keras.Model, hardware: Hardware) -> str:
    """The precision the model's matmuls and convolutions run in on this hardware.

    bfloat16 and float16 policies compute in 16 bits. float32 runs as TF32 on GPUs of compute capability
    8.0 and newer while TensorFlow's TF32 execution is on (its default), else as IEEE float32.
    """
    import tensorflow as tf

    compute_dtype = model.dtype_policy.compute_dtype
    if compute_dtype in _PRECISION_OF_DTYPE:
        return _PRECISION_OF_DTYPE[compute_dtype]
    if (
        hardware.accelerator == "gpu"
        and (hardware.min_compute_capability or (0, 0)) >= (8, 0)
        and tf.config.experimental.tensor_float_32_execution_enabled()
    ):
        return "tf32"
    return "fp32"
