"""What the machine can do, as a plain value.

Every decision that depends on the hardware (which dtype policy, whether XLA pays off, how much memory a
batch may take) takes a `Hardware` value instead of asking TensorFlow itself. That keeps the decisions
testable with a faked V100, A100, H100, T4 or TPU on a machine that has none, and keeps detection (which
initialises TensorFlow's devices) in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import platform
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_log = logging.getLogger("tfopt")

# CPU flags that make bfloat16 matmuls and convolutions run natively (oneDNN uses them on x86).
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as TensorFlow sees it.

    Attributes:
        name: The device name, e.g. "NVIDIA A100-SXM4-40GB".
        compute_capability: (major, minor), e.g. (8, 0) for an A100.
        memory_bytes: Total device memory, or None where it could not be read.
    """

    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Hardware:
    """A description of the accelerators and host CPU that training runs on.

    Attributes:
        gpus: The GPUs visible to TensorFlow.
        tpu_cores: The number of TPU cores, 0 where there is no TPU.
        cpu_model: The CPU model name.
        cpu_flags: The CPU feature flags (as in /proc/cpuinfo), used to spot bf16 support.
        cpu_count: Logical CPU cores available to this process.
        host_memory_bytes: Total host RAM.
    """

    gpus: tuple[Gpu, ...] = ()
    tpu_cores: int = 0
    cpu_model: str = ""
    cpu_flags: frozenset[str] = frozenset()
    cpu_count: int = 1
    host_memory_bytes: int | None = None

    @property
    def accelerator(self) -> str:
        """The device kind that training runs on: "tpu", "gpu" or "cpu"."""
        if self.tpu_cores:
            return "tpu"
        if self.gpus:
            return "gpu"
        return "cpu"

    @property
    def min_compute_capability(self) -> tuple[int, int] | None:
        """The lowest compute capability among the GPUs: mixed GPUs must all support a policy."""
        if not self.gpus:
            return None
        return min(gpu.compute_capability for gpu in self.gpus)

    @property
    def has_tf32(self) -> bool:
        """Whether float32 matmuls and convolutions may run in TF32 (10-bit mantissa): GPUs of compute
        capability 8.0+ (Ampere, Hopper), where TensorFlow turns it on by default."""
        return self.accelerator == "gpu" and self.min_compute_capability >= (8, 0)

    @property
    def cpu_supports_bf16(self) -> bool:
        """Whether the host CPU has native bfloat16 instructions (AVX512-BF16 or AMX)."""
        return bool(self.cpu_flags & BF16_CPU_FLAGS)

    @property
    def has_fast_16bit(self) -> bool:
        """Whether it has units that run 16-bit matmuls faster than 32-bit ones: TPUs, GPUs of compute
        capability 7.0+ (tensor cores), CPUs with bfloat16 instructions."""
        if self.accelerator == "tpu":
            return True
        if self.accelerator == "gpu":
            return (self.min_compute_capability or (0, 0)) >= (7, 0)
        return self.cpu_supports_bf16

    def describe(self) -> str:
        """One line for reports, e.g. "2x NVIDIA A100 (cc 8.0, 40.0 GiB)" or "CPU: AMD EPYC, 2 cores"."""
        cpu = f"CPU: {self.cpu_model or 'unknown'}, {self.cpu_count} cores"
        if self.accelerator == "tpu":
            return f"TPU: {self.tpu_cores} cores; {cpu}"
        if self.accelerator == "gpu":
            first = self.gpus[0]
            memory = f", {first.memory_bytes / 2**30:.1f} GiB" if first.memory_bytes else ""
            major, minor = first.compute_capability
            return f"{len(self.gpus)}x {first.name} (cc {major}.{minor}{memory}); {cpu}"
        bf16 = " with bf16 instructions" if self.cpu_supports_bf16 else ""
        return f"{cpu}{bf16} (no GPU or TPU)"


@functools.cache
def detect() -> Hardware:
    """Describes this machine's accelerators and CPU.

    Initialises TensorFlow's device list (so it is not free); the result is cached for the process.

    Returns:
        The `Hardware` of this machine.

    Example:
        >>> hardware = detect()
        >>> hardware.accelerator in {"cpu", "gpu", "tpu"}
        True
    """
    import psutil
    import tensorflow as tf

    gpus = tuple(_describe_gpu(index, device) for index, device in enumerate(tf.config.list_physical_devices("GPU")))
    return Hardware(
        gpus=gpus,
        tpu_cores=_count_tpu_cores(tf),
        cpu_model=_cpu_model(),
        cpu_flags=_cpu_flags(),
        cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        host_memory_bytes=psutil.virtual_memory().total,
    )


def _describe_gpu(position: int, device) -> Gpu:
    import tensorflow as tf

    details = tf.config.experimental.get_device_details(device)
    return Gpu(
        name=details.get("device_name", device.name),
        compute_capability=tuple(details.get("compute_capability", (0, 0))),
        memory_bytes=_nvml_memory_bytes(position),
    )


def visible_gpu_nvml_indices(count: int, uuids: Sequence[str] | None = None) -> list[int]:
    """NVML indices of the GPUs TensorFlow sees, in TensorFlow's order (its GPU:0 first).

    NVML numbers every GPU in the machine; CUDA_VISIBLE_DEVICES renumbers the ones a process sees
    (TensorFlow's GPU:0 is the first one listed). Without this mapping a job pinned to GPU 3 would read
    GPU 0's memory and utilization. The variable is read as CUDA reads it (and PyTorch's
    `torch.cuda._parse_visible_devices` after it): a list of indices, or of GPU UUIDs (`GPU-8932f937-...`
    or a unique prefix of one), as its first entry says; the list ends at the first entry that names no
    GPU (out of range, negative, unknown or ambiguous, of the other kind), so "0,5,1" on a 2-GPU machine
    is GPU 0 alone; a GPU listed twice hides them all.

    MIG instances (`MIG-...`) are slices of a GPU that NVML's whole-GPU index does not describe (the
    memory is a share, and NVML reports no utilization for them): none is mapped, so they get no NVML
    figures rather than the whole GPU's.

    Args:
        count: The number of GPUs NVML sees (`nvmlDeviceGetCount()`).
        uuids: Each NVML GPU's UUID, by NVML index. Read from NVML (which the caller has initialised) when
            the variable lists UUIDs and this is None.

    Returns:
        NVML indices, position i for TensorFlow's GPU:i.

    Example:
        >>> # CUDA_VISIBLE_DEVICES=GPU-c3,GPU-a on a machine whose NVML GPUs 0, 1, 2 are GPU-a1, GPU-b2, GPU-c3
        >>> visible_gpu_nvml_indices(3, uuids=["GPU-a1", "GPU-b2", "GPU-c3"])  # doctest: +SKIP
        [2, 0]
    """
    from tfopt.environment_variables import text

    visible = text("CUDA_VISIBLE_DEVICES", empty_is_unset=False)  # empty: CUDA shows no GPU
    if visible is None:
        return list(range(count))
    entries = [entry.strip() for entry in visible.split(",")]
    if entries[0].startswith("MIG-"):
        _log.debug("CUDA_VISIBLE_DEVICES lists MIG instances (%s): NVML's whole-GPU figures do not apply", visible)
        return []
    if entries[0].startswith("GPU-"):
        listed = _listed(entries, lambda entry: entry if entry.startswith("GPU-") else None)
        if uuids is None:
            uuids = _nvml_uuids(count)
        # A prefix names the one GPU whose UUID starts with it; an unknown or ambiguous one ends the list.
        matches = [[index for index, uuid in enumerate(uuids) if uuid.startswith(entry)] for entry in listed]
        resolved = [found[0] if len(found) == 1 else -1 for found in matches]
    else:
        resolved = _listed(entries, _leading_number)
    indices: list[int] = []
    for index in resolved:
        if index < 0 or index >= count:
            break
        if index in indices:
            return []
        indices.append(index)
    return indices


def _listed(entries: list[str], parse: Callable[[str], Any]) -> list[Any]:
    """The entries as CUDA takes them: up to the first that does not parse (None); [] if one repeats."""
    listed: list[Any] = []
    for entry in entries:
        value = parse(entry)
        if value is None:
            break
        if value in listed:
            return []
        listed.append(value)
    return listed


def _leading_number(entry: str) -> int | None:
    """An index as CUDA reads it, like strtoul: "1gpu" is 1; a negative one or none ends the list."""
    digits = re.match(r"\+?\d+", entry)
    return int(digits.group()) if digits else None


def _nvml_uuids(count: int) -> list[str]:
    """The UUID of each NVML GPU, by index; NVML must be initialised."""
    import pynvml

    uuids = []
    for index in range(count):
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
        uuids.append(uuid.decode() if isinstance(uuid, bytes) else uuid)  # bytes in older bindings
    return uuids


def _nvml_memory_bytes(position: int) -> int | None:
    """Total memory of TensorFlow's GPU:`position` from NVML (TensorFlow reports none before allocating)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            indices = visible_gpu_nvml_indices(pynvml.nvmlDeviceGetCount())
            if position >= len(indices):
                return None
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(indices[position])).total)
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as error:
        _log.debug("NVML could not read the memory of TensorFlow's GPU:%d: %s", position, error)
        return None


def _count_tpu_cores(tf) -> int:
    """TPU cores visible without connecting to a TPU cluster (TPU VMs list them as physical devices)."""
    return len(tf.config.list_physical_devices("TPU"))


def _cpu_model() -> str:
    for line in _read_cpuinfo():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _cpu_flags() -> frozenset[str]:
    for line in _read_cpuinfo():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _read_cpuinfo() -> list[str]:
    path = Path("/proc/cpuinfo")
    return path.read_text().splitlines() if path.exists() else []
