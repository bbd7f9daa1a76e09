"""Samples accelerator and host utilization in a background thread while training runs.

The TF Profiler's trace says where the time of a step went; it does not say how busy the GPU was or
how much memory it held. NVML (the library behind `nvidia-smi`) does, so on NVIDIA GPUs a thread polls
it every `interval_seconds`. The host is sampled too (this process's CPU use and resident memory via
psutil), which on a CPU-only machine is the only utilization there is.

A sample is always taken when monitoring starts and when it stops, so even a run shorter than one
interval has a first and a last reading.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from tfopt.hardware import visible_gpu_nvml_indices

_log = logging.getLogger("tfopt")

HOST = "host"


@dataclasses.dataclass(frozen=True)
class Sample:
    """One reading of one device.

    Attributes:
        seconds: Time since monitoring started.
        device: "gpu:0", "gpu:1", ... for NVML readings, "host" for this process on the CPU.
        utilization_percent: GPU: the share of the interval a kernel was running (NVML). Host: this
            process's CPU time as a share of all the cores it may use (100 = every core busy).
        memory_bytes: GPU: device memory in use (all processes). Host: this process's resident memory.
    """

    seconds: float
    device: str
    utilization_percent: float
    memory_bytes: int


@dataclasses.dataclass(frozen=True)
class Samples:
    """Everything one monitoring run recorded.

    Attributes:
        samples: Every reading, in time order per device.
        source: "nvml" when GPUs were sampled through NVML, "psutil" when only the host was.
        device_memory_total_bytes: Total memory of each sampled GPU, by device name.
    """

    samples: tuple[Sample, ...] = ()
    source: str = "psutil"
    device_memory_total_bytes: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices sampled, GPUs first, in the order first seen."""
        return tuple(dict.fromkeys(sample.device for sample in self.samples))

    def of(self, device: str) -> tuple[Sample, ...]:
        """The readings of one device."""
        return tuple(sample for sample in self.samples if sample.device == device)

    @property
    def accelerator_devices(self) -> tuple[str, ...]:
        return tuple(device for device in self.devices if device != HOST)

    def peak_memory_bytes(self, device: str | None = None) -> int | None:
        """The highest memory reading of `device`; by default the busiest GPU, or the host without GPUs."""
        devices = [device] if device else (list(self.accelerator_devices) or [HOST])
        readings = [sample.memory_bytes for sample in self.samples if sample.device in devices]
        return max(readings) if readings else None

    def mean_utilization_percent(self, device: str | None = None) -> float | None:
        """The mean utilization of `device`; by default over all GPUs, or the host without GPUs."""
        devices = [device] if device else (list(self.accelerator_devices) or [HOST])
        readings = [sample.utilization_percent for sample in self.samples if sample.device in devices]
        return sum(readings) / len(readings) if readings else None

    @property
    def peak_memory_fraction(self) -> float | None:
        """The fullest GPU's peak memory as a fraction of its total, or None without GPU readings."""
        fractions = [
            self.peak_memory_bytes(device) / total for device, total in self.device_memory_total_bytes.items() if total
        ]
        return max(fractions) if fractions else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "device_memory_total_bytes": dict(self.device_memory_total_bytes),
            "samples": [dataclasses.asdict(sample) for sample in self.samples],
        }


class DeviceSampler:
    """Samples GPUs (through NVML, where present) and this process on the host in a background thread.

    Use it as a context manager around the code to watch; `samples` holds the readings afterwards and
    `start_time` the `time.perf_counter()` value their `seconds` count from.

    Example:
        >>> with DeviceSampler(interval_seconds=0.05, use_nvml=False) as sampler:
        ...     _ = sum(range(100_000))
        >>> sampler.samples.source, len(sampler.samples.of("host")) >= 1
        ('psutil', True)
    """

    def __init__(self, *, interval_seconds: float = 0.2, use_nvml: bool | None = None):
        """Creates a sampler; nothing is sampled until it starts.

        Args:
            interval_seconds: Time between readings. NVML's own utilization counter averages over
                a window of 1/6 s to 1 s depending on the GPU, so shorter intervals repeat readings.
            use_nvml: True to require NVML (an error if it cannot start), False to sample the host
                only, None to use NVML where it is installed and sees a GPU.

        Raises:
            ValueError: `interval_seconds` is not positive.
        """
        if not interval_seconds > 0:
            raise ValueError(f"DeviceSampler: interval_seconds must be > 0; received {interval_seconds!r}.")
        self.interval_seconds = interval_seconds
        self.use_nvml = use_nvml
        self.samples = Samples()
        self._readers: list[Callable[[float], list[Sample]]] = []
        self._collected: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.start_time = 0.0
        self._nvml: Any = None
        self._totals: dict[str, int] = {}

    def __enter__(self) -> DeviceSampler:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Starts sampling in a daemon thread (it never keeps the interpreter alive)."""
        self._readers = [_host_reader()]
        source = "psutil"
        if self.use_nvml is not False:
            nvml_reader = self._start_nvml()
            if nvml_reader is not None:
                self._readers.insert(0, nvml_reader)
                source = "nvml"
        self.samples = Samples(source=source)
        self._collected = []
        self._stop.clear()
        self.start_time = time.perf_counter()
        self._read()
        self._thread = threading.Thread(target=self._run, name="tfopt-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> Samples:
        """Stops sampling, takes a last reading and returns all of them."""
        if self._thread is None:
            return self.samples
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._read()
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as error:  # noqa: BLE001 - a failed shutdown must not lose the samples
                _log.debug("nvmlShutdown failed: %s", error)
            self._nvml = None
        ordered = sorted(self._collected, key=lambda sample: (sample.device == HOST, sample.device, sample.seconds))
        self.samples = Samples(
            samples=tuple(ordered), source=self.samples.source, device_memory_total_bytes=dict(self._totals)
        )
        return self.samples

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            self._read()

    def _read(self) -> None:
        now = time.perf_counter() - self.start_time
        for reader in self._readers:
            try:
                self._collected.extend(reader(now))
            except Exception as error:  # noqa: BLE001 - one failed reading must not end the training run
                _log.debug("DeviceSampler reading failed: %s", error)

    def _start_nvml(self) -> Callable[[float], list[Sample]] | None:
        try:
            import pynvml
        except ImportError:
            if self.use_nvml:
                raise ImportError(
                    "DeviceSampler(use_nvml=True) needs NVML's Python bindings: "
                    "pip install nvidia-ml-py (or install tfopt's profile extra)."
                ) from None
            return None
        try:
            pynvml.nvmlInit()
            indices = visible_gpu_nvml_indices(pynvml.nvmlDeviceGetCount())  # TF's GPU:i is gpu:i here
            handles = {
                f"gpu:{position}": pynvml.nvmlDeviceGetHandleByIndex(index) for position, index in enumerate(indices)
            }
            self._totals = {
                device: int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) for device, handle in handles.items()
            }
        except Exception as error:
            if self.use_nvml:
                raise RuntimeError(
                    f"DeviceSampler(use_nvml=True): NVML could not start: {error}. Check that "
                    "the NVIDIA driver is loaded (nvidia-smi works)."
                ) from error
            _log.debug("NVML unavailable, sampling the host only: %s", error)
            return None
        if not handles:
            pynvml.nvmlShutdown()
            return None
        self._nvml = pynvml

        def read(now: float) -> list[Sample]:
            return [
                Sample(
                    now,
                    device,
                    float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    int(pynvml.nvmlDeviceGetMemoryInfo(handle).used),
                )
                for device, handle in handles.items()
            ]

        return read


def _host_reader() -> Callable[[float], list[Sample]]:
    import psutil

    process = psutil.Process()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (psutil.cpu_count() or 1)
    started = [False]

    def read(now: float) -> list[Sample]:
        # The first call only sets psutil's reference point: a share of CPU time needs an interval, and one
        # read at once would be 0%, pulling the mean down.
        if not started[0]:
            started[0] = True
            process.cpu_percent(None)
            return []
        # psutil counts 100% per core; divided by the usable cores, 100% means the whole host is busy.
        # CPU time is counted in clock ticks (10 ms), so over a short interval the ratio can overshoot.
        busy = min(100.0, process.cpu_percent(None) / cores)
        return [Sample(now, HOST, busy, int(process.memory_info().rss))]

    return read
