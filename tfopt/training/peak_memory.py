"""Peak memory of a block of work: device memory on GPUs, resident set size (RSS) on the host.

Used by the batch-size search (each trial must stay within a memory bound) and for the before/after
memory figures of a report. On GPUs, TensorFlow's allocator keeps its own peak per device
(`tf.config.experimental.get_memory_info(...)["peak"]`, reset by `reset_memory_stats`). On the host, Linux
keeps the peak RSS as VmHWM in /proc/self/status and lets a process reset it by writing "5" to
/proc/self/clear_refs; where that is not possible, a thread samples the RSS with psutil instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclasses.dataclass
class PeakMemory:
    """The peak of a tracked block, filled in when the block ends.

    Attributes:
        device: "host" or the TensorFlow devices read ("GPU:0", ...).
        peak_bytes: The highest memory use seen during the block (the largest over GPUs).
    """

    device: str
    peak_bytes: int | None = None


def host_rss_bytes() -> int:
    """The current resident set size of this process."""
    import psutil

    return int(psutil.Process().memory_info().rss)


@contextlib.contextmanager
def track_peak_memory(gpu_count: int = 0, *, sample_seconds: float = 0.005) -> Iterator[PeakMemory]:
    """Measures the peak memory of the block: GPU allocator peaks if `gpu_count`, else the host's peak RSS.

    Args:
        gpu_count: The number of GPUs training uses (Hardware.gpus); 0 measures host RAM.
        sample_seconds: The psutil sampling interval, used only where Linux' peak RSS cannot be reset.

    Yields:
        A `PeakMemory` whose `peak_bytes` is set when the block ends.

    Example:
        >>> import numpy as np
        >>> with track_peak_memory() as peak:
        ...     block = np.ones(50_000_000)  # 400 MB
        >>> peak.peak_bytes > 400_000_000
        True
    """
    if gpu_count:
        devices = [f"GPU:{index}" for index in range(gpu_count)]
        result = PeakMemory(device=",".join(devices))
        with _gpu_peak(devices, result):
            yield result
        return
    result = PeakMemory(device="host")
    if _reset_host_peak():
        yield result
        result.peak_bytes = _host_peak_bytes()
    else:
        with _sampled_host_peak(result, sample_seconds):
            yield result


@contextlib.contextmanager
def _gpu_peak(devices: list[str], result: PeakMemory) -> Iterator[None]:
    import tensorflow as tf

    for device in devices:
        tf.config.experimental.reset_memory_stats(device)
    try:
        yield
    finally:
        result.peak_bytes = max(int(tf.config.experimental.get_memory_info(device)["peak"]) for device in devices)


def _reset_host_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _host_peak_bytes() is not None


def _host_peak_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        return None
    return None


@contextlib.contextmanager
def _sampled_host_peak(result: PeakMemory, sample_seconds: float) -> Iterator[None]:
    stop = threading.Event()
    peak = [host_rss_bytes()]

    def sample() -> None:
        while not stop.wait(sample_seconds):
            peak[0] = max(peak[0], host_rss_bytes())

    sampler = threading.Thread(target=sample, name="tfopt-rss-sampler", daemon=True)
    sampler.start()
    try:
        yield
    finally:
        stop.set()
        sampler.join()
        result.peak_bytes = max(peak[0], host_rss_bytes())


def gpu_memory_in_use_bytes(gpu_count: int) -> int:
    """Memory TensorFlow's allocator holds now, summed over the first `gpu_count` GPUs."""
    import tensorflow as tf

    return sum(int(tf.config.experimental.get_memory_info(f"GPU:{index}")["current"]) for index in range(gpu_count))


def describe_bytes(count: Any) -> str:
    """A byte count for people, e.g. "1.5 GiB" or "300 MiB".

    Example:
        >>> describe_bytes(3 * 2**29)
        '1.5 GiB'
    """
    if count is None:
        return "unknown"
    if count >= 2**30:
        return f"{count / 2**30:.1f} GiB"
    return f"{count / 2**20:.0f} MiB"
