"""Where the time of an average *wall* training step went: the value every analysis produces.

A wall step runs from the end of one training step to the end of the next, so the wait for the next
batch is inside it whatever the framework fetches outside its own step markers (on GPUs, xprof's step
spans only the device work of a step: a starved pipeline read 0% input there while every wall step
waited 99% for data).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any

from tfopt.errors import MeasurementError

STEP_MARKER = "train"
"""The name of the step markers `capture.py` writes (a TraceMe with `step_num` and `_r=1`)."""

CATEGORY_LABELS = {
    "input_seconds": "waiting for input",
    "host_compute_seconds": "host: compute, dispatch, Python",
    "device_compute_seconds": "device compute",
    "kernel_launch_seconds": "kernel launch",
    "compile_seconds": "compilation",
    "collectives_seconds": "collectives / device-to-device",
    "output_seconds": "output",
    "other_seconds": "other (idle)",
}
"""Every part of a step, in the order reports show them, with its label."""


@dataclasses.dataclass(frozen=True)
class StepBreakdown:
    """Where the time of an average wall training step went.

    The parts (`*_seconds`, means per step) add up to `step_seconds_mean`.

    Attributes:
        source: "trace" (tfopt's reading of the capture) or "trace+xprof" (with xprof's details:
            input split, kernel launch, compilation, collectives, memory bandwidth).
        hardware_type: "CPU_ONLY", "GPU" or "TPU".
        step_seconds: Each analysed wall step's duration, in step order.
        input_seconds: Waiting for the input pipeline to hand over a batch.
        host_compute_seconds: Host time outside input waits and the device's busy time: ops on the CPU
            (on a CPU-only machine all of the model's compute), op dispatch, Python.
        device_compute_seconds: Accelerator kernels running (outside input waits).
        kernel_launch_seconds: Host time launching device kernels (xprof).
        compile_seconds: XLA or graph compilation inside the steps (xprof).
        collectives_seconds: All-reduce and other cross-device communication (xprof).
        output_seconds: Device-to-host output transfer.
        other_seconds: What no category explains.
        device_busy_seconds: Time any device stream was active (kernels and copies, the union of their
            intervals) per step; None on a CPU-only machine.
        input_split: Where input time went on the host, as fractions ("preprocessing", "file_read",
            "enqueue", "other"), or None where unknown.
        compute_16bit_percent: The share of device compute (kernels whose names tell their type) in
            16-bit types, bf16 included; None where no kernel tells.
        xla_kernel_percent: The share of device kernel time from XLA-compiled modules; None without
            device kernels.
        memory_bandwidth_percent: Memory bandwidth used relative to the hardware's limit, where known.
        flop_rate_percent: FLOP rate relative to the roofline, where known.
        notes: What the analysis could not conclude, and why.
    """

    source: str
    hardware_type: str
    step_seconds: tuple[float, ...]
    input_seconds: float = 0.0
    host_compute_seconds: float = 0.0
    device_compute_seconds: float = 0.0
    kernel_launch_seconds: float = 0.0
    compile_seconds: float = 0.0
    collectives_seconds: float = 0.0
    output_seconds: float = 0.0
    other_seconds: float = 0.0
    device_busy_seconds: float | None = None
    input_split: Mapping[str, float] | None = None
    compute_16bit_percent: float | None = None
    xla_kernel_percent: float | None = None
    memory_bandwidth_percent: float | None = None
    flop_rate_percent: float | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.step_seconds:
            raise MeasurementError("A StepBreakdown needs at least one step; received none.")

    @property
    def step_seconds_mean(self) -> float:
        return statistics.fmean(self.step_seconds)

    @property
    def step_seconds_spread(self) -> float:
        """The standard deviation of step times (0 for a single step)."""
        return statistics.pstdev(self.step_seconds)

    @property
    def categories(self) -> dict[str, float]:
        """Every part of a step (field name -> mean seconds), in `CATEGORY_LABELS` order."""
        return {name: getattr(self, name) for name in CATEGORY_LABELS}

    def percent(self, category: str) -> float:
        """The share of the mean step time one part takes, in percent."""
        return 100.0 * getattr(self, category) / self.step_seconds_mean

    @property
    def input_percent(self) -> float:
        """Input wait %: the share of the wall step spent waiting for the next batch."""
        return self.percent("input_seconds")

    @property
    def busy_percent(self) -> float | None:
        """Accelerator busy %: device-active time over the wall step; None without an accelerator."""
        if self.device_busy_seconds is None:
            return None
        return 100.0 * self.device_busy_seconds / self.step_seconds_mean

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "hardware_type": self.hardware_type,
            "steps": len(self.step_seconds),
            "step_seconds": list(self.step_seconds),
            "step_seconds_mean": self.step_seconds_mean,
            "step_seconds_spread": self.step_seconds_spread,
            "input_percent": self.input_percent,
            "busy_percent": self.busy_percent,
            "categories_seconds": self.categories,
            "input_split": dict(self.input_split) if self.input_split is not None else None,
            "compute_16bit_percent": self.compute_16bit_percent,
            "xla_kernel_percent": self.xla_kernel_percent,
            "memory_bandwidth_percent": self.memory_bandwidth_percent,
            "flop_rate_percent": self.flop_rate_percent,
            "notes": list(self.notes),
        }
