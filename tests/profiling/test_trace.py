"""trace: tfopt's own reading of a trace (wall steps, input waits, device activity, 16-bit and XLA
shares), on hand-built XSpaces with exact numbers."""

from __future__ import annotations

import pytest

from tfopt.errors import MeasurementError
from tfopt.profiling.breakdown import STEP_MARKER
from tfopt.profiling.trace import trace_breakdown, trace_gpus, trace_steps

MS = 10**9  # picoseconds per millisecond


def _write_xspace(path, *, steps=(), waits=(), device=(), keras_calls=(), second_gpu=None):
    """Writes an XSpace. `steps`: (number, start_ms, end_ms) step markers; `waits`: (start_ms, end_ms)
    IteratorGetNext waits; `device`: (kernel name, start_ms, end_ms, from_xla) events on a GPU stream;
    `keras_calls`: (start_ms, end_ms) Keras train-function calls; `second_gpu`: `device`'s events on a
    second GPU (an empty list: a second GPU that ran nothing)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    host = space.planes.add(id=1, name="/host:CPU")
    names = {STEP_MARKER: 1, "IteratorGetNextOp::DoCompute": 2, "SomethingElse": 3, "multi_step_on_iterator": 4}
    for name, metadata_id in names.items():
        host.event_metadata[metadata_id].CopyFrom(xplane_pb2.XEventMetadata(id=metadata_id, name=name))
    host.stat_metadata[7].CopyFrom(xplane_pb2.XStatMetadata(id=7, name="step_num"))
    python = host.lines.add(id=1, name="python", timestamp_ns=1000)
    for number, start, end in steps:
        event = python.events.add(metadata_id=1, offset_ps=start * MS, duration_ps=(end - start) * MS)
        event.stats.add(metadata_id=7, int64_value=number)
        python.events.add(metadata_id=3, offset_ps=start * MS, duration_ps=(end - start) * MS)
    for start, end in keras_calls:
        python.events.add(metadata_id=4, offset_ps=start * MS, duration_ps=(end - start) * MS)
    getnext = host.lines.add(id=2, name="tf_data_iterator_get_next", timestamp_ns=1000)
    for start, end in waits:
        getnext.events.add(metadata_id=2, offset_ps=start * MS, duration_ps=(end - start) * MS)
    for plane_id, kernels in enumerate((device, second_gpu), start=2):
        if not kernels and (plane_id == 2 or kernels is None):
            continue
        gpu = space.planes.add(id=plane_id, name=f"/device:GPU:{plane_id - 2}")
        for stat_id, name in (
            (1, "gpu_device_name"),
            (2, "compute_cap_major"),
            (3, "compute_cap_minor"),
            (4, "memory_size"),
            (5, "hlo_module"),
        ):
            gpu.stat_metadata[stat_id].CopyFrom(xplane_pb2.XStatMetadata(id=stat_id, name=name))
        gpu.stats.add(metadata_id=1, str_value="NVIDIA A100-SXM4-40GB")
        gpu.stats.add(metadata_id=2, int64_value=8)
        gpu.stats.add(metadata_id=3, int64_value=0)
        gpu.stats.add(metadata_id=4, uint64_value=40 * 2**30)
        stream = gpu.lines.add(id=1, name="Stream #7(Compute)", timestamp_ns=1000)
        for index, (name, start, end, from_xla) in enumerate(kernels, start=1):
            gpu.event_metadata[index].CopyFrom(xplane_pb2.XEventMetadata(id=index, name=name))
            event = stream.events.add(metadata_id=index, offset_ps=start * MS, duration_ps=(end - start) * MS)
            if from_xla:
                event.stats.add(metadata_id=5, str_value="a_inference_one_step_on_data")
    path.write_bytes(space.SerializeToString())
    return path


def test_a_wall_step_runs_from_one_steps_end_to_the_next(tmp_path):
    # Markers cover 3-8 and 12-18 ms; the wait at 9-11 ms falls between them (as Keras' fetch does on a GPU).
    xplane = _write_xspace(
        tmp_path / "x.xplane.pb", steps=[(1, 0, 2), (2, 3, 8), (3, 12, 18)], waits=[(1, 2), (9, 11), (13, 14), (30, 40)]
    )
    steps = trace_steps(xplane)
    assert [step["step"] for step in steps] == [2, 3]  # step 1 has no step before it: it starts the first
    assert [step["step_seconds"] for step in steps] == pytest.approx([0.006, 0.010])
    # Overlapping and split waits count once, inside their step; waits outside every step do not count.
    assert [step["input_seconds"] for step in steps] == pytest.approx([0.0, 0.003])


def test_trace_breakdown_selects_steps_and_adds_up(tmp_path):
    xplane = _write_xspace(
        tmp_path / "x.xplane.pb", steps=[(3, 0, 10), (4, 10, 30), (5, 30, 40)], waits=[(1, 4), (12, 20), (28, 33)]
    )
    breakdown = trace_breakdown(xplane, step_numbers={4, 5})
    assert breakdown.source == "trace" and breakdown.hardware_type == "CPU_ONLY"
    assert breakdown.step_seconds == pytest.approx((0.020, 0.010))
    assert breakdown.input_seconds == pytest.approx((0.010 + 0.003) / 2)
    assert breakdown.host_compute_seconds == pytest.approx(0.015 - 0.0065)
    assert sum(breakdown.categories.values()) == pytest.approx(breakdown.step_seconds_mean)
    assert breakdown.input_percent == pytest.approx(100 * 0.0065 / 0.015)
    assert breakdown.busy_percent is None and breakdown.compute_16bit_percent is None
    assert any("accelerator busy % and MFU do not apply" in note for note in breakdown.notes)


def test_busy_counts_kernels_and_copies_compute_only_kernels_outside_waits(tmp_path):
    xplane = _write_xspace(
        tmp_path / "gpu.xplane.pb",
        steps=[(0, 0, 1), (1, 1, 11), (2, 11, 21)],
        waits=[(1, 3)],
        device=[
            ("MemcpyH2D", 1, 4, False),
            ("sm90_xmma_gemm_bf16bf16_bf16f32", 2, 6, True),
            ("loop_add_fusion", 5, 8, True),
            ("ampere_sgemm_128x64_nn", 12, 19, False),
        ],
    )
    breakdown = trace_breakdown(xplane)
    assert breakdown.hardware_type == "GPU"
    assert breakdown.device_busy_seconds == pytest.approx((0.007 + 0.007) / 2)  # 1-8 ms (copy included), 12-19
    assert breakdown.busy_percent == pytest.approx(70.0)
    assert breakdown.device_compute_seconds == pytest.approx((0.005 + 0.007) / 2)  # kernels 3-8 ms outside the wait
    assert breakdown.input_seconds == pytest.approx(0.001)
    assert sum(breakdown.categories.values()) == pytest.approx(breakdown.step_seconds_mean)
    # Typed kernels: 4 ms bf16 against 7 ms fp32 (the XLA fusion names no type and is left out).
    assert breakdown.compute_16bit_percent == pytest.approx(100 * 4 / 11)
    assert breakdown.xla_kernel_percent == pytest.approx(100 * 7 / 14)


@pytest.mark.parametrize(
    "name, is_16bit",
    [
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", True),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_bf16_64x128_64x4_nt_align8>", True),
        ("volta_h884gemm_64x64_ldg8_nn", True),
        ("Mul_GPU_DT_HALF_DT_HALF_kernel", True),
        ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc", False),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nt_align4>", False),
        ("Mul_GPU_DT_FLOAT_DT_FLOAT_kernel", False),
    ],
)
def test_kernel_names_tell_16_and_32_bit(tmp_path, name, is_16bit):
    xplane = _write_xspace(tmp_path / "gpu.xplane.pb", steps=[(0, 0, 1), (1, 1, 11)], device=[(name, 2, 6, False)])
    assert trace_breakdown(xplane).compute_16bit_percent == (100.0 if is_16bit else 0.0)


def test_without_markers_wall_steps_come_from_keras_train_calls(tmp_path):
    xplane = _write_xspace(tmp_path / "keras.xplane.pb", keras_calls=[(0, 4), (5, 9), (12, 16)], waits=[(10, 11)])
    breakdown = trace_breakdown(xplane)
    assert breakdown.step_seconds == pytest.approx((0.005, 0.007))
    assert breakdown.input_seconds == pytest.approx(0.0005)
    # The note counts what the header counts: 3 calls end 2 wall steps.
    assert breakdown.notes[0] == (
        "No tfopt step markers: 2 wall steps reconstructed from 3 Keras train-function calls on the host "
        "(a wall step runs from one call's end to the next's)."
    )


def test_a_single_keras_train_call_is_one_wall_step_in_the_note(tmp_path):
    xplane = _write_xspace(tmp_path / "keras.xplane.pb", keras_calls=[(5, 9)])
    breakdown = trace_breakdown(xplane)
    assert breakdown.step_seconds == pytest.approx((0.004,))
    assert breakdown.notes[0].startswith(
        "No tfopt step markers: 1 wall step reconstructed from 1 Keras train-function call on the host"
    )


def test_the_gpus_come_from_the_captures_device_planes(tmp_path):
    xplane = _write_xspace(tmp_path / "gpu.xplane.pb", steps=[(0, 0, 1)], device=[("k", 0, 1, False)])
    (gpu,) = trace_gpus(xplane)
    assert (gpu.name, gpu.compute_capability, gpu.memory_bytes) == ("NVIDIA A100-SXM4-40GB", (8, 0), 40 * 2**30)


def test_a_single_step_without_its_predecessor_spans_its_marker_and_says_so(tmp_path):
    xplane = _write_xspace(tmp_path / "x.xplane.pb", steps=[(4, 2, 7)])
    breakdown = trace_breakdown(xplane)
    assert breakdown.step_seconds == pytest.approx((0.005,))
    assert any("wait before it is not seen" in note for note in breakdown.notes)


def test_a_tpu_capture_says_its_activity_is_not_read(tmp_path):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    xplane = _write_xspace(tmp_path / "x.xplane.pb", steps=[(0, 0, 1), (1, 1, 5)])
    space = xplane_pb2.XSpace()
    space.ParseFromString(xplane.read_bytes())
    space.planes.add(id=9, name="/device:TPU:0")
    xplane.write_bytes(space.SerializeToString())
    breakdown = trace_breakdown(xplane)
    assert breakdown.hardware_type == "TPU" and breakdown.busy_percent is None
    assert any("tfopt does not read TPU device activity" in note for note in breakdown.notes)


def test_missing_markers_are_a_clear_error(tmp_path):
    xplane = _write_xspace(tmp_path / "x.xplane.pb", steps=[(0, 0, 10)])
    with pytest.raises(MeasurementError, match=r"no 'train' step markers numbered \[7\].*Trace\('train'"):
        trace_steps(xplane, step_numbers={7})


def test_busy_time_is_each_gpus_own_averaged_over_the_gpus(tmp_path):
    # GPU 0 computes 0-10 ms and GPU 1 10-20 ms of a 20 ms step: each is busy half the step. A union over
    # both read 100% busy.
    xplane = _write_xspace(
        tmp_path / "x.xplane.pb",
        steps=[(1, 0, 20), (2, 20, 40)],
        device=[("volta_sgemm", 20, 30, False)],
        second_gpu=[("volta_sgemm", 30, 40, False)],
    )
    (step,) = trace_steps(xplane)
    assert step["device_busy_seconds"] == pytest.approx(0.010)
    breakdown = trace_breakdown(xplane)
    assert breakdown.busy_percent == pytest.approx(50.0)
    assert [gpu.name for gpu in trace_gpus(xplane)] == ["NVIDIA A100-SXM4-40GB"] * 2
    idle_second = _write_xspace(
        tmp_path / "idle.xplane.pb",
        steps=[(1, 0, 20), (2, 20, 40)],
        device=[("volta_sgemm", 20, 40, False)],
        second_gpu=[],
    )
    assert trace_breakdown(idle_second).busy_percent == pytest.approx(50.0)  # one GPU busy, one idle
