"""trace: tfopt's own reading of a trace, on hand-built XSpaces with exact numbers."""

from __future__ import annotations

import pytest

from tfopt.errors import MeasurementError
from tfopt.profiling.analyze import STEP_MARKER
from tfopt.profiling.trace import trace_breakdown, trace_steps

MS = 10**9  # picoseconds per millisecond


def _write_xspace(path, *, steps, waits, device_busy=()):
    """Writes an XSpace: `steps` are (number, start_ms, end_ms) markers; `waits` and `device_busy` are
    (start_ms, end_ms) IteratorGetNext waits and GPU stream kernels."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    host = space.planes.add(id=1, name="/host:CPU")
    host.event_metadata[1].CopyFrom(xplane_pb2.XEventMetadata(id=1, name=STEP_MARKER))
    host.event_metadata[2].CopyFrom(xplane_pb2.XEventMetadata(id=2, name="IteratorGetNextOp::DoCompute"))
    host.event_metadata[3].CopyFrom(xplane_pb2.XEventMetadata(id=3, name="SomethingElse"))
    host.stat_metadata[7].CopyFrom(xplane_pb2.XStatMetadata(id=7, name="step_num"))
    python = host.lines.add(id=1, name="python", timestamp_ns=1000)
    for number, start, end in steps:
        event = python.events.add(metadata_id=1, offset_ps=start * MS, duration_ps=(end - start) * MS)
        event.stats.add(metadata_id=7, int64_value=number)
        python.events.add(metadata_id=3, offset_ps=start * MS, duration_ps=(end - start) * MS)
    getnext = host.lines.add(id=2, name="tf_data_iterator_get_next", timestamp_ns=1000)
    for start, end in waits:
        getnext.events.add(metadata_id=2, offset_ps=start * MS, duration_ps=(end - start) * MS)
    if device_busy:
        gpu = space.planes.add(id=2, name="/device:GPU:0")
        gpu.event_metadata[1].CopyFrom(xplane_pb2.XEventMetadata(id=1, name="volta_sgemm"))
        stream = gpu.lines.add(id=1, name="Stream #7(Compute)", timestamp_ns=1000)
        for start, end in device_busy:
            stream.events.add(metadata_id=1, offset_ps=start * MS, duration_ps=(end - start) * MS)
    path.write_bytes(space.SerializeToString())
    return path


def test_trace_steps_counts_waits_inside_each_step(tmp_path):
    xplane = _write_xspace(tmp_path / "host.xplane.pb", steps=[(3, 0, 10), (4, 10, 30), (5, 30, 40)],
                           waits=[(1, 4), (2, 3), (12, 20), (28, 33), (50, 60)])
    steps = trace_steps(xplane)
    assert [step["step"] for step in steps] == [3, 4, 5]
    assert [step["step_seconds"] for step in steps] == pytest.approx([0.010, 0.020, 0.010])
    # Overlapping waits count once; a wait crossing a step boundary is split; waits outside steps do not count.
    assert [step["input_seconds"] for step in steps] == pytest.approx([0.003, 0.010, 0.003])
    assert not any(step["has_device"] for step in steps)


def test_trace_breakdown_selects_steps_and_adds_up(tmp_path):
    xplane = _write_xspace(tmp_path / "host.xplane.pb", steps=[(3, 0, 10), (4, 10, 30), (5, 30, 40)],
                           waits=[(1, 4), (12, 20), (28, 33)])
    breakdown = trace_breakdown(xplane, step_numbers={4, 5})
    assert breakdown.source == "trace" and breakdown.hardware_type == "CPU_ONLY"
    assert breakdown.step_seconds == pytest.approx((0.020, 0.010))
    assert breakdown.input_seconds == pytest.approx((0.010 + 0.003) / 2)
    assert breakdown.host_compute_seconds == pytest.approx(0.015 - 0.0065)
    assert sum(breakdown.categories.values()) == pytest.approx(breakdown.step_seconds_mean)
    assert breakdown.input_percent == pytest.approx(100 * 0.0065 / 0.015)


def test_trace_breakdown_reads_device_stream_time(tmp_path):
    xplane = _write_xspace(tmp_path / "gpu.xplane.pb", steps=[(0, 0, 10), (1, 10, 20)], waits=[(0, 2)],
                           device_busy=[(2, 6), (5, 8), (12, 19)])
    breakdown = trace_breakdown(xplane)
    assert breakdown.hardware_type == "GPU"
    assert breakdown.device_compute_seconds == pytest.approx((0.006 + 0.007) / 2)
    assert breakdown.input_seconds == pytest.approx(0.001)
    assert breakdown.host_compute_seconds == pytest.approx(0.010 - 0.0065 - 0.001)


def test_missing_markers_are_a_clear_error(tmp_path):
    xplane = _write_xspace(tmp_path / "x.xplane.pb", steps=[(0, 0, 10)], waits=[])
    with pytest.raises(MeasurementError, match=r"no 'train' step markers numbered \[7\].*Trace\('train'"):
        trace_steps(xplane, step_numbers={7})
