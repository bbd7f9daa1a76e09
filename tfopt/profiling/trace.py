"""tfopt's own reading of a TF Profiler trace: step markers, the input waits inside them, device time.

It needs only TensorFlow (the XSpace protocol buffer ships with it), so it works where xprof is not
installed or cannot find the steps. xprof's "Input" time is the sum of the `IteratorGetNext` waits
inside a step, which is exactly what is summed here; `analyze.py` prefers xprof's fuller breakdown and
the tests hold the two readings to agree.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection
from pathlib import Path
from typing import Any

from tfopt.errors import MeasurementError
from tfopt.profiling.analyze import STEP_MARKER, StepBreakdown

# The host events that block a training step until the input pipeline hands over a batch.
_INPUT_WAIT_EVENTS = frozenset({"IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute"})


def trace_breakdown(xplane: str | Path, *, step_numbers: Collection[int] | None = None) -> StepBreakdown:
    """tfopt's own breakdown from the trace: step markers, input waits, device busy time.

    Input is the `IteratorGetNext` wait inside each step; device compute is the time any device
    stream was busy inside the step; host compute is the rest. Compilation, launch and collectives are
    not separated (they count as host or device compute).

    Raises:
        MeasurementError: The trace has none of the requested step markers.
    """
    steps = trace_steps(xplane, step_numbers=step_numbers)
    count = len(steps)
    step_seconds = tuple(step["step_seconds"] for step in steps)
    input_seconds = sum(step["input_seconds"] for step in steps) / count
    device_seconds = sum(step["device_seconds"] for step in steps) / count
    has_device = any(step["has_device"] for step in steps)
    return StepBreakdown(
        source="trace",
        hardware_type="GPU" if has_device else "CPU_ONLY",
        step_seconds=step_seconds,
        input_seconds=input_seconds,
        device_compute_seconds=device_seconds,
        host_compute_seconds=max(0.0, statistics.fmean(step_seconds) - input_seconds - device_seconds),
    )


def trace_steps(xplane: str | Path, *, step_numbers: Collection[int] | None = None) -> list[dict[str, Any]]:
    """Per marked step: its number, duration, input wait and device busy time, read from the trace.

    Returns:
        One dict per step in step order: step, step_seconds, input_seconds, device_seconds, has_device.

    Raises:
        MeasurementError: The trace has none of the requested step markers.
    """
    space = load_xspace(xplane)
    markers: dict[int, tuple[int, int]] = {}
    waits: list[tuple[int, int]] = []
    device_busy: list[tuple[int, int]] = []
    for plane in space.planes:
        on_device = plane.name.startswith(("/device:GPU", "/device:TPU"))
        step_stat = _stat_id(plane, "step_num")
        for line in plane.lines:
            device_stream = on_device and line.name.startswith("Stream")
            for event in line.events:
                start_ps = line.timestamp_ns * 1000 + event.offset_ps
                interval = (start_ps, start_ps + event.duration_ps)
                if device_stream:
                    device_busy.append(interval)
                    continue
                name = plane.event_metadata[event.metadata_id].name
                if name in _INPUT_WAIT_EVENTS:
                    waits.append(interval)
                elif name == STEP_MARKER and step_stat is not None:
                    number = next((stat.int64_value for stat in event.stats if stat.metadata_id == step_stat), None)
                    if number is not None and (step_numbers is None or number in step_numbers):
                        markers[number] = interval
    if not markers:
        raise MeasurementError(
            f"The trace {xplane} has no {STEP_MARKER!r} step markers"
            f"{'' if step_numbers is None else f' numbered {sorted(step_numbers)}'}: capture it with "
            "tfopt.profile, or mark steps with tf.profiler.experimental.Trace('train', step_num=i, _r=1).")
    merged_waits, merged_busy = _merge(waits), _merge(device_busy)
    steps = []
    for number in sorted(markers):
        start, end = markers[number]
        steps.append({
            "step": number,
            "step_seconds": (end - start) / 1e12,
            "input_seconds": _overlap(merged_waits, start, end) / 1e12,
            "device_seconds": _overlap(merged_busy, start, end) / 1e12,
            "has_device": bool(device_busy),
        })
    return steps


def load_xspace(xplane: str | Path) -> Any:
    """Parses a `.xplane.pb` file into TensorFlow's XSpace protocol buffer."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    try:
        space.ParseFromString(Path(xplane).read_bytes())
    except Exception as error:
        raise MeasurementError(f"Could not read the profiler capture {xplane}: {error}") from error
    return space


def _stat_id(plane: Any, name: str) -> int | None:
    return next((key for key, metadata in plane.stat_metadata.items() if metadata.name == name), None)


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(merged: list[tuple[int, int]], start: int, end: int) -> int:
    return sum(max(0, min(end, high) - max(start, low)) for low, high in merged)
