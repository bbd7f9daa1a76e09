"""analyze: xprof's breakdown of real captures, its agreement with tfopt's own trace reading, fallbacks."""

from __future__ import annotations

import statistics
import tarfile
from pathlib import Path

import pytest

from tfopt.errors import MeasurementError
from tfopt.profiling import analyze as analyze_module
from tfopt.profiling.analyze import CATEGORY_LABELS, StepBreakdown, analyze, find_xplane, xprof_breakdown
from tfopt.profiling.trace import trace_breakdown, trace_steps

H100_CAPTURES = Path(__file__).parents[1] / "fixtures" / "gpu-h100"


def test_find_xplane_errors_name_the_directory(tmp_path):
    with pytest.raises(MeasurementError, match="No profiler capture"):
        find_xplane(tmp_path)
    for run in ("a", "b"):
        (tmp_path / "plugins/profile" / run).mkdir(parents=True)
        (tmp_path / "plugins/profile" / run / "host.xplane.pb").write_bytes(b"")
    with pytest.raises(MeasurementError, match="2 captures under") as raised:
        find_xplane(tmp_path)
    assert str(raised.value).endswith("pass the .xplane.pb file to analyse.")  # both in one directory
    with pytest.raises(MeasurementError) as raised:
        find_xplane(tmp_path / "plugins")
    assert str(raised.value).endswith("pass the .xplane.pb file to analyse.")
    for side in ("before", "after"):  # a run directory's tensorboard/
        (tmp_path / "run" / side / "plugins/profile/a").mkdir(parents=True)
        (tmp_path / "run" / side / "plugins/profile/a/host.xplane.pb").write_bytes(b"")
    with pytest.raises(MeasurementError) as raised:
        find_xplane(tmp_path / "run")
    assert str(raised.value).endswith(f"or a directory holding one: {tmp_path}/run/after, {tmp_path}/run/before.")


def test_breakdown_rejects_no_steps():
    with pytest.raises(MeasurementError, match="at least one step"):
        StepBreakdown(source="trace", hardware_type="CPU_ONLY", step_seconds=())


def _assert_xprof_and_trace_agree_on_a_cpu(xprof, trace, steps, *, input_rel):
    """On a CPU both read the same steps: xprof's "Input" is the IteratorGetNext waits, and a marked step lies
    within its wall step, which adds only the callbacks between steps (about 30 us here; a shared machine that
    stalls the thread between two steps lengthens one of them by milliseconds, as CI did once, hence the median;
    the input waits agree to 50 us)."""
    assert xprof.hardware_type == trace.hardware_type == "CPU_ONLY"
    assert len(xprof.step_seconds) == len(trace.step_seconds) == steps
    between_steps = [wall - marked for marked, wall in zip(xprof.step_seconds, trace.step_seconds, strict=True)]
    assert min(between_steps) >= -1e-6 and statistics.median(between_steps) < 5e-4
    assert xprof.input_seconds == pytest.approx(trace.input_seconds, rel=input_rel, abs=5e-5)


def _assert_xprof_reads_only_device_steps_on_a_gpu(xprof, trace, steps):
    """On a GPU xprof's step is the device work of the traced step alone, and it holds fewer steps (6 of 8 in
    an H100 run): the wall steps of the trace are the ones to read. Checked against a real H100 capture in
    test_the_gpu_reading_holds_on_an_h100_capture."""
    assert xprof.hardware_type == trace.hardware_type == "GPU"
    assert 1 <= len(xprof.step_seconds) <= len(trace.step_seconds) == steps
    assert xprof.step_seconds_mean < trace.step_seconds_mean
    assert xprof.input_seconds <= trace.input_seconds  # the wait falls between xprof's steps


def test_xprof_and_trace_read_a_real_capture(starved_profile):
    """Both readings of the same capture, as the machine that ran it allows."""
    capture = starved_profile.capture
    xprof = xprof_breakdown(capture.xplane_path, step_numbers=capture.step_numbers)
    trace = trace_breakdown(capture.xplane_path, step_numbers=capture.step_numbers)
    assert xprof.source == "xprof" and trace.source == "trace"
    assert sum(xprof.categories.values()) == pytest.approx(xprof.step_seconds_mean, rel=1e-3)
    if starved_profile.hardware.accelerator == "cpu":
        _assert_xprof_and_trace_agree_on_a_cpu(xprof, trace, len(capture.step_numbers), input_rel=1e-3)
        assert xprof.input_percent == pytest.approx(trace.input_percent, abs=0.5)
    else:
        _assert_xprof_reads_only_device_steps_on_a_gpu(xprof, trace, len(capture.step_numbers))
        # Starved: the wall steps wait for input most of the time. (xprof's steps on a GPU can span most of the
        # wall step, as on the H100 running this test, or the device work alone, as in the fixture below.)
        assert trace.input_percent > 50.0


def test_the_gpu_reading_holds_on_an_h100_capture(tmp_path):
    """The GPU side of the test above, on a real H100 capture of a starved pipeline (tests/fixtures/gpu-h100),
    so that it is checked on every machine."""
    with tarfile.open(H100_CAPTURES / "starved_pyfunc.tar.xz", "r:xz") as archive:
        archive.extractall(tmp_path, filter="data")
    xplane = find_xplane(tmp_path / "starved_pyfunc")
    trace = trace_breakdown(xplane)
    xprof = xprof_breakdown(xplane)
    _assert_xprof_reads_only_device_steps_on_a_gpu(xprof, trace, len(trace.step_seconds))
    assert trace.input_percent > 50.0 and max(xprof.step_seconds) < min(trace.step_seconds)
    assert xprof.input_percent == 0.0  # what xprof alone would have said of a GPU waiting 99% of each step


def test_xprof_reads_a_gpu_captures_measured_steps_by_their_place_in_the_trace(tmp_path):
    """On a GPU xprof numbers the device steps 1, 2, ... whatever tfopt's markers say (2 to 9 in this H100
    capture, of which 3 to 8 were measured): each marked step is found by its place in the trace, as the
    device time xprof gives it shows."""
    with tarfile.open(H100_CAPTURES / "resnet_bf16_xla.tar.xz", "r:xz") as archive:
        archive.extractall(tmp_path, filter="data")
    xplane = find_xplane(tmp_path / "resnet_bf16_xla")
    every = xprof_breakdown(xplane)
    assert len(every.step_seconds) == 6
    assert xprof_breakdown(xplane, step_numbers=range(3, 9)).step_seconds == every.step_seconds
    for marked in trace_steps(xplane, step_numbers=range(3, 9)):
        one = xprof_breakdown(xplane, step_numbers=[marked["step"]])
        assert one.device_compute_seconds == pytest.approx(marked["device_busy_seconds"], rel=1e-3)
    assert analyze(xplane, step_numbers=range(3, 9)).source == "trace+xprof"
    with pytest.raises(MeasurementError, match=r"xprof found no steps among \[1000\]"):
        xprof_breakdown(xplane, step_numbers={1000})


def test_real_capture_analysis_adds_xprofs_details_to_the_trace(starved_profile):
    breakdown = starved_profile.breakdown
    assert breakdown.source == "trace+xprof"
    assert breakdown.input_split is not None and sum(breakdown.input_split.values()) == pytest.approx(1.0)
    # The pipeline's work is a map (a Python sleep): preprocessing, no file reads (on an H100 too).
    assert breakdown.input_split["preprocessing"] > 0.9 and breakdown.input_split["file_read"] == 0.0
    if starved_profile.hardware.accelerator == "cpu":
        assert breakdown.hardware_type == "CPU_ONLY"
        assert breakdown.compute_16bit_percent is None and breakdown.busy_percent is None  # no device
    else:
        # The device works a small share of each starved wall step; a float32 model computes in 32 bits.
        assert breakdown.hardware_type == "GPU" and 0.0 <= breakdown.busy_percent < 50.0
        assert breakdown.compute_16bit_percent in (None, pytest.approx(0.0))
    assert set(breakdown.categories) == set(CATEGORY_LABELS)
    assert sum(breakdown.categories.values()) == pytest.approx(breakdown.step_seconds_mean)


def test_analyze_falls_back_to_the_trace_when_xprof_fails(starved_profile, monkeypatch):
    def unavailable(xplane, tool):
        raise MeasurementError("xprof is not installed")

    monkeypatch.setattr(analyze_module, "_xprof_tool", unavailable)
    capture = starved_profile.capture
    breakdown = analyze(capture.logdir, step_numbers=capture.step_numbers)
    assert breakdown.source == "trace" and breakdown.input_split is None
    assert any("xprof's details are missing" in note for note in breakdown.notes)
    assert breakdown.input_percent == pytest.approx(starved_profile.breakdown.input_percent, abs=0.5)


def test_xprof_without_the_requested_steps_is_an_error(starved_profile):
    with pytest.raises(MeasurementError, match=r"xprof found no steps among \[1000\]"):
        xprof_breakdown(starved_profile.capture.xplane_path, step_numbers={1000})


def _step_table(rows):
    columns = [
        "stepnum",
        "deviceComputeTimeMs",
        "deviceToDeviceTimeMs",
        "deviceCollectivesTimeMs",
        "hostComputeTimeMs",
        "kernelLaunchTimeMs",
        "infeedTimeMs",
        "outfeedTimeMs",
        "compileTimeMs",
        "otherTimeMs",
        "tooltip",
        "stepTimeMs",
    ]
    return {
        "cols": [{"id": column} for column in columns],
        "p": {"hardware_type": "GPU"},
        "rows": [{"c": [{"v": value} for value in row]} for row in rows],
    }


def test_xprof_gpu_tables_map_to_the_breakdown(monkeypatch, tmp_path):
    """The GPU columns and properties, from tables shaped like xprof's, without a GPU."""
    pipeline = [
        {"cols": [], "rows": []},
        _step_table(
            [
                # step, device, d2d, collectives, host, launch, input, output, compile, other, tooltip, total
                ["train 2", 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, "", 81.0],  # not a measured step
                ["train 3", 50.0, 1.0, 4.0, 5.0, 10.0, 20.0, 0.0, 0.0, 10.0, "", 100.0],
                ["train 4", 70.0, 1.0, 4.0, 5.0, 10.0, 0.0, 0.0, 0.0, 10.0, "", 100.0],
            ]
        ),
        {
            "cols": [],
            "rows": [],
            "p": {
                "preprocessing_us": "300.0",
                "demanded_file_read_us": "500.0",
                "advanced_file_read_us": "100.0",
                "enqueue_us": "100.0",
                "unclassified_nonequeue_us": "0.000",
            },
        },
    ]
    overview = [
        {
            "cols": [],
            "rows": [],
            "p": {
                "device_compute_16bit_percent": "7.5%",
                "memory_bw_utilization_relative_to_hw_limit": "0.0%",
                "flop_rate_utilization_relative_to_roofline": "41.0%",
            },
        }
    ]
    monkeypatch.setattr(
        analyze_module, "_xprof_tool", lambda xplane, tool: pipeline if tool == "input_pipeline_analyzer" else overview
    )
    breakdown = xprof_breakdown(tmp_path / "x.xplane.pb", step_numbers={3, 4})
    assert breakdown.hardware_type == "GPU" and breakdown.step_seconds == (0.1, 0.1)
    assert breakdown.device_compute_seconds == pytest.approx(0.060)
    assert breakdown.collectives_seconds == pytest.approx(0.005)  # collectives + device-to-device
    assert breakdown.input_seconds == pytest.approx(0.010) and breakdown.kernel_launch_seconds == pytest.approx(0.010)
    assert sum(breakdown.categories.values()) == pytest.approx(0.1)
    assert breakdown.input_split == pytest.approx(
        {"preprocessing": 0.3, "file_read": 0.6, "enqueue": 0.1, "other": 0.0}
    )
    assert breakdown.compute_16bit_percent == 7.5
    assert breakdown.memory_bandwidth_percent is None  # xprof's 0.0% means "not measured"
    assert breakdown.flop_rate_percent == 41.0


def test_xprof_and_trace_read_a_tuned_capture(tuned_profile):
    capture = tuned_profile.capture
    xprof = xprof_breakdown(capture.xplane_path, step_numbers=capture.step_numbers)
    trace = trace_breakdown(capture.xplane_path, step_numbers=capture.step_numbers)
    if tuned_profile.hardware.accelerator == "cpu":
        _assert_xprof_and_trace_agree_on_a_cpu(xprof, trace, len(capture.step_numbers), input_rel=1e-2)
    else:
        _assert_xprof_reads_only_device_steps_on_a_gpu(xprof, trace, len(capture.step_numbers))
