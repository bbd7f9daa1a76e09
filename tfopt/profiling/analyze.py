"""From a TF Profiler capture to a step-time breakdown: where the time of one training step went.

Two readings of the same `.xplane.pb`:

- xprof's converters (`input_pipeline_analyzer`, `overview_page`), the numbers TensorBoard's Profile
  tab shows: per step, the time waiting for input, host compute, device compute, kernel launch,
  compilation, collectives and the rest, plus where input time went (preprocessing, file reads) and the
  16-bit share of device compute on GPUs. They need the `xprof` package and step markers they
  recognise (`capture.py` writes those).
- tfopt's own reading of the trace (`trace.py`): the step markers' durations and the
  `IteratorGetNext` waits inside them (plus device-plane busy time where there is a GPU). It needs
  only TensorFlow, and it is what is used when xprof is not installed or cannot find the steps.

Where both exist they agree step by step (xprof's "Input" is the sum of the `IteratorGetNext` waits in
the step); the tests hold them to that.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from tfopt.errors import MeasurementError

_log = logging.getLogger("tfopt")

STEP_MARKER = "train"
"""The name of the step markers `capture.py` writes (a TraceMe with `step_num` and `_r=1`)."""

# xprof's step-table columns (by id) and the StepBreakdown field each one adds to.
_XPROF_COLUMNS = {
    "infeedTimeMs": "input_seconds",
    "hostComputeTimeMs": "host_compute_seconds",
    "deviceComputeTimeMs": "device_compute_seconds",
    "kernelLaunchTimeMs": "kernel_launch_seconds",
    "compileTimeMs": "compile_seconds",
    "deviceCollectivesTimeMs": "collectives_seconds",
    "deviceToDeviceTimeMs": "collectives_seconds",
    "outfeedTimeMs": "output_seconds",
    "otherTimeMs": "other_seconds",
}

CATEGORY_LABELS = {
    "input_seconds": "waiting for input",
    "host_compute_seconds": "host compute",
    "device_compute_seconds": "device compute",
    "kernel_launch_seconds": "kernel launch",
    "compile_seconds": "compilation",
    "collectives_seconds": "collectives / device-to-device",
    "output_seconds": "output",
    "other_seconds": "other (idle, Python)",
}
"""Every part of a step, in the order reports show them, with its label."""


@dataclasses.dataclass(frozen=True)
class StepBreakdown:
    """Where the time of an average training step went.

    The parts (`*_seconds`, means per step) add up to `step_seconds_mean`.

    Attributes:
        source: "xprof" (the profiler's own analysis) or "trace" (tfopt's reading of the markers).
        hardware_type: As xprof names it: "CPU_ONLY", "GPU", "TPU".
        step_seconds: Each analysed step's duration, in step order.
        input_seconds: Waiting for the input pipeline to hand over a batch.
        host_compute_seconds: Host-side ops (on a CPU-only machine: all of the model's compute).
        device_compute_seconds: Accelerator kernels.
        kernel_launch_seconds: Host time spent launching device kernels.
        compile_seconds: XLA or graph compilation inside the steps.
        collectives_seconds: All-reduce and other cross-device communication, device-to-device copies.
        output_seconds: Device-to-host output transfer.
        other_seconds: What no category explains: Python overhead between ops, idle waits.
        input_split: Where input time went on the host, as fractions ("preprocessing", "file_read",
            "enqueue", "other"), or None where unknown.
        compute_16bit_percent: The share of device compute done in 16-bit types, where the profiler
            reports it (GPUs), else None.
        memory_bandwidth_percent: Memory bandwidth used relative to the hardware's limit, where known.
        flop_rate_percent: FLOP rate relative to the roofline, where known.
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
    input_split: Mapping[str, float] | None = None
    compute_16bit_percent: float | None = None
    memory_bandwidth_percent: float | None = None
    flop_rate_percent: float | None = None

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
        """The share of step time spent waiting for input: the profiler's "input-bound" number."""
        return self.percent("input_seconds")

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "hardware_type": self.hardware_type, "steps": len(self.step_seconds),
            "step_seconds": list(self.step_seconds), "step_seconds_mean": self.step_seconds_mean,
            "step_seconds_spread": self.step_seconds_spread, "input_percent": self.input_percent,
            "categories_seconds": self.categories,
            "input_split": dict(self.input_split) if self.input_split is not None else None,
            "compute_16bit_percent": self.compute_16bit_percent,
            "memory_bandwidth_percent": self.memory_bandwidth_percent,
            "flop_rate_percent": self.flop_rate_percent,
        }


def analyze(path: str | Path, *, step_numbers: Collection[int] | None = None) -> StepBreakdown:
    """Reads a capture into a `StepBreakdown`, with xprof's analysis where it works, else the trace's.

    Args:
        path: A `.xplane.pb` file, or a logdir holding exactly one capture run
            (`plugins/profile/<run>/*.xplane.pb`).
        step_numbers: The marked steps to analyse (e.g. the measured steps, not the warm-up); all
            marked steps by default.

    Returns:
        The breakdown of the selected steps.

    Raises:
        MeasurementError: There is no capture at `path`, or it holds none of the requested steps.

    Example:
        >>> breakdown = analyze("logs/profile")  # doctest: +SKIP
        >>> f"{breakdown.input_percent:.0f}% of each step waits for input"  # doctest: +SKIP
    """
    from tfopt.profiling.trace import trace_breakdown

    xplane = find_xplane(path)
    try:
        return xprof_breakdown(xplane, step_numbers=step_numbers)
    except MeasurementError as error:
        _log.info("Using tfopt's own reading of the trace: %s", error)
    return trace_breakdown(xplane, step_numbers=step_numbers)


def find_xplane(path: str | Path) -> Path:
    """The one `.xplane.pb` at `path` (a file, or a logdir with one capture run)."""
    path = Path(path)
    if path.is_file():
        return path
    found = sorted(path.glob("plugins/profile/*/*.xplane.pb")) + sorted(path.glob("*.xplane.pb"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise MeasurementError(f"No profiler capture (*.xplane.pb) under {path}: expected a logdir written "
                               "by tfopt.profile or tf.profiler.experimental (plugins/profile/<run>/).")
    raise MeasurementError(f"{len(found)} captures under {path} ({', '.join(str(p) for p in found[:3])}...): "
                           "pass the .xplane.pb file to analyse.")


def xprof_breakdown(xplane: str | Path, *, step_numbers: Collection[int] | None = None) -> StepBreakdown:
    """The breakdown from xprof's `input_pipeline_analyzer` and `overview_page` converters.

    Raises:
        MeasurementError: xprof is not installed, failed, or found none of the requested steps.
    """
    pipeline = _xprof_tool(xplane, "input_pipeline_analyzer")
    overview = _xprof_tool(xplane, "overview_page")
    table = _section_with_column(pipeline, "stepnum")
    if table is None:
        raise MeasurementError("xprof's input_pipeline_analyzer returned no step table.")
    column_ids = [column["id"] for column in table["cols"]]
    rows = {}
    for row in table.get("rows", []):
        values = dict(zip(column_ids, (cell.get("v") for cell in row["c"])))
        number = _step_number(values.get("stepnum"))
        if number is not None and (step_numbers is None or number in step_numbers):
            rows[number] = values
    if not rows:
        raise MeasurementError(
            f"xprof found no steps{'' if step_numbers is None else f' among {sorted(step_numbers)}'} "
            f"(its conclusion: {table.get('p', {}).get('input_conclusion', 'none')!r}).")
    ordered = [rows[number] for number in sorted(rows)]
    parts = dict.fromkeys(CATEGORY_LABELS, 0.0)
    for column, field in _XPROF_COLUMNS.items():
        if column in column_ids:
            parts[field] += statistics.fmean(float(row[column] or 0.0) for row in ordered) / 1000.0
    analysis = overview[0].get("p", {}) if overview else {}
    return StepBreakdown(
        source="xprof",
        hardware_type=table.get("p", {}).get("hardware_type", "UNKNOWN"),
        step_seconds=tuple(float(row["stepTimeMs"]) / 1000.0 for row in ordered),
        input_split=_input_split(pipeline),
        compute_16bit_percent=_percent(analysis.get("device_compute_16bit_percent")),
        memory_bandwidth_percent=_nonzero(_percent(analysis.get("memory_bw_utilization_relative_to_hw_limit"))),
        flop_rate_percent=_nonzero(_percent(analysis.get("flop_rate_utilization_relative_to_roofline"))),
        **parts,
    )


def _xprof_tool(xplane: str | Path, tool: str) -> list[dict[str, Any]]:
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError as error:
        raise MeasurementError(f"xprof is not installed ({error}); pip install tfopt[profile].") from error
    try:
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(xplane)], tool, {})
    except Exception as error:  # noqa: BLE001 - the converter raises whatever its C++ layer reports
        raise MeasurementError(f"xprof's {tool} failed on {xplane}: {error}") from error
    if not data:
        raise MeasurementError(f"xprof's {tool} returned nothing for {xplane}.")
    return json.loads(data)


def _section_with_column(sections: Iterable[dict[str, Any]], column_id: str) -> dict[str, Any] | None:
    for section in sections:
        if any(column.get("id") == column_id for column in section.get("cols", [])):
            return section
    return None


def _input_split(sections: Iterable[dict[str, Any]]) -> dict[str, float] | None:
    """Fractions of host input time: preprocessing, file_read (demanded + in advance), enqueue, other."""
    for section in sections:
        properties = section.get("p", {})
        if "preprocessing_us" in properties:
            parts = {
                "preprocessing": float(properties.get("preprocessing_us", 0)),
                "file_read": float(properties.get("demanded_file_read_us", 0))
                + float(properties.get("advanced_file_read_us", 0)),
                "enqueue": float(properties.get("enqueue_us", 0)),
                "other": float(properties.get("unclassified_nonequeue_us", 0)),
            }
            total = sum(parts.values())
            return {name: value / total for name, value in parts.items()} if total > 0 else None
    return None


def _step_number(label: Any) -> int | None:
    """xprof labels steps "<marker name> <step_num>"; the number is what tfopt marked."""
    try:
        return int(str(label).rsplit(" ", 1)[-1])
    except ValueError:
        return None


def _percent(text: Any) -> float | None:
    if text is None or text == "":
        return None
    try:
        value = float(str(text).rstrip("%"))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _nonzero(value: float | None) -> float | None:
    return value if value else None
