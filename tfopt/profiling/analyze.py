"""From a TF Profiler capture to a wall-step breakdown: where the time of one training step went.

Two readings of the same `.xplane.pb`, combined:

- tfopt's own reading of the trace (`trace.py`) decides the headline: wall steps (one step's end to the
  next's, so the wait for the next batch is inside), input waits, accelerator busy time, the 16-bit
  share from kernel names. It needs only TensorFlow.
- xprof's converters (`input_pipeline_analyzer`, `overview_page`), the numbers TensorBoard's Profile tab
  shows, add what only they know: where input time went (preprocessing, file reads), kernel launch,
  compilation and collective time, memory bandwidth and FLOP rate. Their own step and input numbers are
  not used: on GPUs xprof's step spans only the device work of the traced step, so a pipeline that
  starved the GPU 99% of every wall step read 0% input there, and bf16 kernels read as 32-bit.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import math
import os
import statistics
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from tfopt.errors import MeasurementError
from tfopt.profiling.breakdown import CATEGORY_LABELS, StepBreakdown
from tfopt.profiling.trace import step_markers, trace_breakdown

_log = logging.getLogger("tfopt")

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


def analyze(path: str | Path, *, step_numbers: Collection[int] | None = None) -> StepBreakdown:
    """Reads a capture into a wall-step `StepBreakdown`, with xprof's details where xprof works.

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
    xplane = find_xplane(path)
    breakdown = trace_breakdown(xplane, step_numbers=step_numbers)
    try:
        details = xprof_breakdown(xplane, step_numbers=step_numbers)
    except MeasurementError as error:
        _log.info("Without xprof's details: %s", error)
        return dataclasses.replace(breakdown, notes=(*breakdown.notes, f"xprof's details are missing: {error}"))
    return with_xprof_details(breakdown, details)


def with_xprof_details(breakdown: StepBreakdown, details: StepBreakdown) -> StepBreakdown:
    """The trace's breakdown with xprof's input split, memory and FLOP rates, and its kernel-launch,
    compilation and collective times taken out of the host time they are part of (scaled down where
    xprof's steps held more of them than the wall step's host time)."""
    names = ("kernel_launch_seconds", "compile_seconds", "collectives_seconds")
    parts = {name: getattr(details, name) for name in names}
    total = sum(parts.values())
    scale = min(1.0, breakdown.host_compute_seconds / total) if total else 0.0
    parts = {name: seconds * scale for name, seconds in parts.items()}
    return dataclasses.replace(
        breakdown,
        source="trace+xprof",
        host_compute_seconds=breakdown.host_compute_seconds - sum(parts.values()),
        input_split=details.input_split,
        memory_bandwidth_percent=details.memory_bandwidth_percent,
        flop_rate_percent=details.flop_rate_percent,
        **parts,
    )


def find_xplane(path: str | Path) -> Path:
    """The one `.xplane.pb` at `path`: a file, or a directory holding one capture anywhere below it (a
    tfopt logdir, Keras' TensorBoard logdir with `plugins/profile/<run>/`, a copied run folder).

    Raises:
        MeasurementError: The path does not exist, is a broken or looping link, is an empty file, or holds
            no capture or several.
    """
    path = Path(path)
    if path.is_symlink() and not path.exists():
        try:
            path.resolve(strict=True)
        except (RuntimeError, OSError) as error:  # Python < 3.13 raises RuntimeError for a loop
            if isinstance(error, RuntimeError) or error.errno == errno.ELOOP:
                raise MeasurementError(
                    f"{path} is a symbolic link that loops back on itself; give the capture's "
                    "real directory or .xplane.pb file."
                ) from None
        raise MeasurementError(
            f"{path} is a broken symbolic link (to {os.readlink(path)}, which does not exist); "
            "give the capture's real directory or .xplane.pb file."
        )
    if not path.exists():
        raise MeasurementError(
            f"{path} does not exist; give the capture's directory (a TensorBoard logdir) or its .xplane.pb file."
        )
    found = [path] if path.is_file() else sorted(path.rglob("*.xplane.pb"))
    if len(found) == 1:
        if found[0].stat().st_size == 0:
            raise MeasurementError(
                f"{found[0]} is an empty file (0 bytes): the capture was cut short or not "
                "written. Capture the profile again."
            )
        return found[0]
    if not found:
        raise MeasurementError(
            f"No profiler capture (*.xplane.pb) under {path}: expected a logdir written "
            "by tfopt.profile, tf.profiler.experimental or Keras' TensorBoard(profile_batch=...) "
            "(plugins/profile/<run>/)."
        )
    # A run directory's tensorboard/ holds one capture per side (before/, after/): those name themselves.
    sides: dict[Path, list[Path]] = {}
    for capture in found:
        parts = capture.relative_to(path).parts
        sides.setdefault(path / parts[0] if len(parts) > 1 else path, []).append(capture)
    alone = [str(side) for side, captures in sides.items() if len(captures) == 1]
    raise MeasurementError(
        f"{len(found)} captures under {path} ({', '.join(str(p) for p in found[:3])}...): pass the .xplane.pb file "
        + (f"to analyse, or a directory holding one: {', '.join(alone)}." if alone else "to analyse.")
    )


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
    steps = [dict(zip(column_ids, (cell.get("v") for cell in row["c"]))) for row in table.get("rows", [])]
    wanted = step_numbers
    if step_numbers is not None and steps and all(str(step.get("stepnum")).isdigit() for step in steps):
        # xprof labels a GPU's steps by ordinal, not by tfopt's markers as a CPU's: 1 is the second marked
        # step, as it leaves out the first (and last) of a capture as cut off.
        wanted = {ordinal for ordinal, marker in enumerate(step_markers(xplane)) if marker in step_numbers}
    rows = {}
    for values in steps:
        number = _step_number(values.get("stepnum"))
        if number is not None and (wanted is None or number in wanted):
            rows[number] = values
    if not rows:
        raise MeasurementError(
            f"xprof found no steps{'' if step_numbers is None else f' among {sorted(step_numbers)}'} "
            f"(its conclusion: {table.get('p', {}).get('input_conclusion', 'none')!r})."
        )
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
        raise MeasurementError(
            f"xprof is not installed ({error}); install tfopt's profile extra "
            '(pip install -e ".[profile]" in a clone) or pip install xprof.'
        ) from error
    try:
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(xplane)], tool, {})
    except Exception as error:
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
    """xprof labels a CPU's steps "<marker name> <step_num>" (the number tfopt marked), a GPU's by ordinal."""
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
