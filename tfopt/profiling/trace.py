"""tfopt's own reading of a TF Profiler trace: wall steps, the input waits and device activity inside them.

It needs only TensorFlow (the XSpace protocol buffer ships with it). A *wall step* runs from the end of
one marked step to the end of the next, so whatever happens between two steps (Keras fetching the next
batch outside the traced step, callbacks, Python) belongs to a step. Inside each wall step:

- input wait: the `IteratorGetNext` waits on the host (what xprof calls "Input");
- device busy: the union of everything the GPU's streams ran (kernels and copies);
- device compute: the union of kernels alone, outside the input waits;
- the 16-bit share: kernel time in 16-bit types, read from kernel names (cuDNN, cuBLAS and CUTLASS name
  their types: `..._bf16bf16_bf16f32...`, `..._f32f32_tf32f32...`, `s16816gemm_bf16`); xprof counts only
  kernels named half/fp16, so bf16 read as 32-bit there. XLA's fused kernels (`loop_add_fusion`) name no
  type and are left out of the share;
- the XLA share: kernel time from XLA-compiled modules (kernels that carry an `hlo_module` stat).

Captures without tfopt's step markers (Keras' `TensorBoard(profile_batch=...)`, `tf.profiler` around a
`fit`) get their wall steps from Keras' train-function calls on the host instead.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfopt.errors import MeasurementError
from tfopt.hardware import Gpu
from tfopt.profiling.breakdown import STEP_MARKER, StepBreakdown

if TYPE_CHECKING:
    from tensorflow.tsl.profiler.protobuf.xplane_pb2 import XPlane, XSpace

# The host events that block a training step until the input pipeline hands over a batch.
_INPUT_WAIT_EVENTS = frozenset({"IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute"})
# Keras' train-function calls (Keras 3: multi/one_step_on_iterator; Keras 2: train_function).
KERAS_STEP_EVENTS = frozenset({"multi_step_on_iterator", "one_step_on_iterator", "train_function"})
_COPY_EVENT = re.compile(r"^Mem(cpy|set)")
KERNEL_16BIT = re.compile(r"bf16|bfloat16|f16|fp16|half|h884|h1688|h16816|hgemm", re.IGNORECASE)
KERNEL_32BIT = re.compile(r"f32|tf32|sgemm|s1688gemm|s884gemm|float", re.IGNORECASE)

Interval = tuple[int, int]  # picoseconds


@dataclasses.dataclass
class _Events:
    """The events of a capture that the analysis reads, as picosecond intervals on one clock."""

    markers: dict[int, Interval] = dataclasses.field(default_factory=dict)
    keras_steps: list[Interval] = dataclasses.field(default_factory=list)
    waits: list[Interval] = dataclasses.field(default_factory=list)
    device_activity: dict[str, list[Interval]] = dataclasses.field(default_factory=dict)  # per device plane
    tpu: bool = False  # TPU planes hold no GPU-style stream lines: their activity is not read
    # Every kernel: (interval, 16-bit or not or None where its name tells no type, from an XLA module).
    kernels: list[tuple[Interval, bool | None, bool]] = dataclasses.field(default_factory=list)


def trace_breakdown(xplane: str | Path, *, step_numbers: Collection[int] | None = None) -> StepBreakdown:
    """The wall-step breakdown of a capture: input waits, device busy and compute time, the 16-bit share.

    Raises:
        MeasurementError: The trace has none of the requested steps.
    """
    events = _read_events(xplane)
    steps, notes = _wall_steps(events, xplane, step_numbers)
    count = len(steps)
    step_seconds = tuple((end - start) / 1e12 for _, start, end in steps)
    waits, kernels = merge_intervals(events.waits), merge_intervals([interval for interval, _, _ in events.kernels])
    input_seconds = sum(_overlap(waits, start, end) for _, start, end in steps) / count / 1e12
    has_device = bool(events.device_activity)
    device_seconds = busy_seconds = compute_16bit = xla_share = None
    if has_device:
        kernels_outside_waits = _subtract(kernels, waits)
        device_seconds = sum(_overlap(kernels_outside_waits, start, end) for _, start, end in steps) / count / 1e12
        busy_seconds = sum(_busy_picoseconds(events, start, end) for _, start, end in steps) / count / 1e12
        window = [kernel for kernel in events.kernels if steps[0][1] <= kernel[0][0] < steps[-1][2]]
        compute_16bit = _share(window, lambda is_16bit, _: is_16bit, typed_only=True)
        xla_share = _share(window, lambda _, from_xla: from_xla, typed_only=False)
        if compute_16bit is None:
            notes.append(
                "No kernel in the steps names its type (XLA fusions do not), so the 16-bit share of "
                "device compute is unknown."
            )
    elif events.tpu:
        notes.append(
            "A TPU capture: tfopt does not read TPU device activity yet, so accelerator busy % is "
            "unknown; open the capture in TensorBoard's Profile tab for it."
        )
    else:
        notes.append("No accelerator activity in the trace: accelerator busy % and MFU do not apply.")
    mean_step = statistics.fmean(step_seconds)
    return StepBreakdown(
        source="trace",
        hardware_type="GPU" if has_device else "TPU" if events.tpu else "CPU_ONLY",
        step_seconds=step_seconds,
        input_seconds=input_seconds,
        device_compute_seconds=device_seconds or 0.0,
        host_compute_seconds=max(0.0, mean_step - input_seconds - (device_seconds or 0.0)),
        device_busy_seconds=busy_seconds,
        compute_16bit_percent=compute_16bit,
        xla_kernel_percent=xla_share,
        notes=tuple(notes),
    )


def trace_steps(xplane: str | Path, *, step_numbers: Collection[int] | None = None) -> list[dict[str, Any]]:
    """Per wall step: its number, duration, input wait and device busy time, read from the trace.

    Returns:
        One dict per step in step order: step, step_seconds, input_seconds, device_busy_seconds.

    Raises:
        MeasurementError: The trace has none of the requested steps.
    """
    events = _read_events(xplane)
    steps, _ = _wall_steps(events, xplane, step_numbers)
    waits = merge_intervals(events.waits)
    return [
        {
            "step": number,
            "step_seconds": (end - start) / 1e12,
            "input_seconds": _overlap(waits, start, end) / 1e12,
            "device_busy_seconds": _busy_picoseconds(events, start, end) / 1e12,
        }
        for number, start, end in steps
    ]


def step_markers(xplane: str | Path) -> list[int]:
    """The numbers of tfopt's step markers in the trace, in order."""
    return sorted(_read_events(xplane).markers)


def _busy_picoseconds(events: _Events, start: int, end: int) -> float:
    """How long the accelerators were busy between `start` and `end`: each device's union of activity,
    averaged over the devices (a union over all of them would read two GPUs busy in turn as one busy GPU)."""
    devices = [merge_intervals(intervals) for intervals in events.device_activity.values()]
    return statistics.fmean(_overlap(busy, start, end) for busy in devices) if devices else 0.0


def trace_gpus(xplane: str | Path) -> tuple[Gpu, ...]:
    """The GPUs a capture ran on, from its device planes (name, compute capability, memory): a capture
    from another machine is diagnosed for the hardware it ran on, not this one."""
    gpus = []
    for plane in load_xspace(xplane).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        stats = {plane.stat_metadata[stat.metadata_id].name: stat for stat in plane.stats}
        gpus.append(
            Gpu(
                name=stats["gpu_device_name"].str_value if "gpu_device_name" in stats else plane.name,
                compute_capability=tuple(
                    int(stats[key].int64_value or stats[key].uint64_value) if key in stats else 0
                    for key in ("compute_cap_major", "compute_cap_minor")
                ),
                memory_bytes=(
                    int(stats["memory_size"].uint64_value or stats["memory_size"].int64_value)
                    if "memory_size" in stats
                    else None
                ),
            )
        )
    return tuple(gpus)


def load_xspace(xplane: str | Path) -> XSpace:
    """Parses a `.xplane.pb` file into TensorFlow's XSpace protocol buffer."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    try:
        space.ParseFromString(Path(xplane).read_bytes())
    except Exception as error:
        raise MeasurementError(
            f"Could not read the profiler capture {xplane}: {error}. The file is damaged or cut short (a run "
            "stopped while the profiler wrote it?): capture again."
        ) from error
    return space


def _read_events(xplane: str | Path) -> _Events:
    events = _Events()
    for plane in load_xspace(xplane).planes:
        on_device = plane.name.startswith(("/device:GPU", "/device:TPU"))
        events.tpu = events.tpu or plane.name.startswith("/device:TPU")
        if plane.name.startswith("/device:GPU"):  # a GPU idle through the steps counts too, as 0% busy
            events.device_activity.setdefault(plane.name, [])
        step_stat = _stat_id(plane, "step_num")
        hlo_stat = _stat_id(plane, "hlo_module")
        for line in plane.lines:
            device_stream = on_device and line.name.startswith("Stream")
            for event in line.events:
                start_ps = line.timestamp_ns * 1000 + event.offset_ps
                interval = (start_ps, start_ps + event.duration_ps)
                name = plane.event_metadata[event.metadata_id].name
                if device_stream:
                    events.device_activity.setdefault(plane.name, []).append(interval)
                    if not _COPY_EVENT.match(name):
                        is_16bit = True if KERNEL_16BIT.search(name) else False if KERNEL_32BIT.search(name) else None
                        metadata_stats = plane.event_metadata[event.metadata_id].stats
                        from_xla = any(stat.metadata_id == hlo_stat for stat in (*event.stats, *metadata_stats))
                        events.kernels.append((interval, is_16bit, from_xla))
                elif name in _INPUT_WAIT_EVENTS:
                    events.waits.append(interval)
                elif name in KERAS_STEP_EVENTS:
                    events.keras_steps.append(interval)
                elif name == STEP_MARKER and step_stat is not None:
                    number = next((stat.int64_value for stat in event.stats if stat.metadata_id == step_stat), None)
                    if number is not None:
                        events.markers[number] = interval
    return events


def _wall_steps(
    events: _Events, xplane: str | Path, step_numbers: Collection[int] | None
) -> tuple[list[tuple[int, int, int]], list[str]]:
    """(number, start, end) of each wall step: from the end of the step before to the end of this one.

    A step whose predecessor is not in the trace has no wall start; it is left out unless it is the only
    one, which then spans its own marker.
    """
    notes: list[str] = []
    ends = {number: end for number, (_, end) in events.markers.items()}
    starts = {number: start for number, (start, _) in events.markers.items()}
    calls = sorted(events.keras_steps) if not ends and step_numbers is None else []
    if calls:
        ends = dict(enumerate(end for _, end in calls))
        starts = dict(enumerate(start for start, _ in calls))
    selected = sorted(number for number in ends if step_numbers is None or number in step_numbers)
    if not selected:
        raise MeasurementError(
            f"The trace {xplane} has no {STEP_MARKER!r} step markers"
            f"{'' if step_numbers is None else f' numbered {sorted(step_numbers)}'} and no Keras train-function "
            "calls: capture it with tfopt.profile, mark steps with tf.profiler.experimental.Trace('train', "
            "step_num=i, _r=1), or profile a Keras fit."
        )
    steps = [(number, ends[number - 1], ends[number]) for number in selected if number - 1 in ends]
    if not steps:
        number = selected[0]
        steps = [(number, starts[number], ends[number])]
        notes.append(
            "Only one step without the step before it: its wall time is its own marker's span, so "
            "the wait before it is not seen."
        )
    if calls:
        # Said with the count the header shows: n calls end n - 1 wall steps (the first only starts one).
        notes.insert(
            0,
            f"No tfopt step markers: {_count(len(steps), 'wall step')} reconstructed from "
            f"{_count(len(calls), 'Keras train-function call')} on the host (a wall step runs from one call's "
            "end to the next's).",
        )
    return steps, notes


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _share(kernels: list[tuple[Interval, bool | None, bool]], counts: Any, *, typed_only: bool) -> float | None:
    """The percentage of kernel time for which `counts(is_16bit, from_xla)` holds; with `typed_only`,
    of the kernels whose names tell their type. None where there is no such kernel time."""
    inside = [
        (high - low, is_16bit, from_xla)
        for (low, high), is_16bit, from_xla in kernels
        if not typed_only or is_16bit is not None
    ]
    total = sum(duration for duration, _, _ in inside)
    if not total:
        return None
    return 100.0 * sum(duration for duration, is_16bit, from_xla in inside if counts(is_16bit, from_xla)) / total


def _stat_id(plane: XPlane, name: str) -> int | None:
    return next((key for key, metadata in plane.stat_metadata.items() if metadata.name == name), None)


def merge_intervals(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _subtract(merged: list[Interval], holes: list[Interval]) -> list[Interval]:
    """The parts of merged intervals outside merged `holes`."""
    result: list[Interval] = []
    for start, end in merged:
        cursor = start
        for low, high in holes:
            if high <= cursor or low >= end:
                continue
            if low > cursor:
                result.append((cursor, low))
            cursor = max(cursor, high)
        if cursor < end:
            result.append((cursor, end))
    return result


def _overlap(merged: list[Interval], start: int, end: int) -> int:
    return sum(max(0, min(end, high) - max(start, low)) for low, high in merged)
