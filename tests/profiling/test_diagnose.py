"""diagnose: every bottleneck class from constructed breakdowns (thresholds at their edges), then real
captures of a starved and a tuned pipeline."""

from __future__ import annotations

import dataclasses

import pytest

from tfopt.hardware import Gpu, Hardware
from tfopt.profiling import diagnose as d
from tfopt.profiling.breakdown import StepBreakdown
from tfopt.profiling.diagnose import Diagnosis, diagnose, diagnose_breakdown
from tfopt.profiling.measurement import Measurement
from tfopt.profiling.timing import StepTimes

CPU = Hardware(cpu_count=2)
CPU_BF16 = Hardware(cpu_count=2, cpu_flags=frozenset({"avx512_bf16"}))
V100 = Hardware(gpus=(Gpu("Tesla V100", (7, 0), 16 * 2**30),), cpu_count=8)
P100 = Hardware(gpus=(Gpu("Tesla P100", (6, 0), 16 * 2**30),), cpu_count=8)
TPU = Hardware(tpu_cores=8)


def breakdown(
    *,
    step=100.0,
    input_=0.0,
    host=None,
    device=0.0,
    launch=0.0,
    compile_=0.0,
    collectives=0.0,
    other=0.0,
    split=None,
    bits16=None,
    bandwidth=None,
    flops=None,
    hardware_type="GPU",
    xla=None,
):
    """A breakdown of one 100 ms wall step (by default): the arguments are milliseconds; host compute takes the
    rest; on a GPU the device is busy while it computes."""
    if host is None:
        host = step - input_ - device - launch - compile_ - collectives - other
    return StepBreakdown(
        source="xprof",
        hardware_type=hardware_type,
        step_seconds=(step / 1000,),
        input_seconds=input_ / 1000,
        host_compute_seconds=host / 1000,
        device_compute_seconds=device / 1000,
        kernel_launch_seconds=launch / 1000,
        compile_seconds=compile_ / 1000,
        collectives_seconds=collectives / 1000,
        other_seconds=other / 1000,
        input_split=split,
        compute_16bit_percent=bits16,
        memory_bandwidth_percent=bandwidth,
        flop_rate_percent=flops,
        device_busy_seconds=None if hardware_type == "CPU_ONLY" else device / 1000,
        xla_kernel_percent=xla,
    )


def only(diagnosis: Diagnosis):
    assert len(diagnosis.findings) == 1, diagnosis.summary
    return diagnosis.findings[0]


@pytest.mark.parametrize(
    ("input_ms", "severity"), [(4.99, None), (5.0, "moderate"), (19.99, "moderate"), (20.0, "high"), (80.0, "high")]
)
def test_input_bound_thresholds_are_the_profilers(input_ms, severity):
    diagnosis = diagnose_breakdown(breakdown(input_=input_ms, device=90.0 - input_ms), V100)
    if severity is None:
        assert not diagnosis.input_bound and diagnosis.findings == ()
    else:
        finding = only(diagnosis)
        assert (finding.bottleneck, finding.severity, finding.recipe) == (d.INPUT_BOUND, severity, "data_pipeline")
        assert finding.percent == pytest.approx(input_ms) and diagnosis.input_bound


@pytest.mark.parametrize(
    ("split", "bottleneck", "recipe", "words"),
    [
        (
            {"preprocessing": 0.2, "file_read": 0.7, "enqueue": 0.1, "other": 0.0},
            d.STORAGE_BANDWIDTH,
            "tfrecord",
            "70% of input time reads files",
        ),
        (
            {"preprocessing": 0.8, "file_read": 0.2, "enqueue": 0.0, "other": 0.0},
            d.CPU_PREPROCESSING,
            "data_pipeline",
            "80% of input time is preprocessing on 2 CPU core(s)",
        ),
        (
            {"preprocessing": 0.4, "file_read": 0.4, "enqueue": 0.2, "other": 0.0},
            d.INPUT_BOUND,
            "data_pipeline",
            "prefetching keep batches ready",
        ),
    ],
)
def test_input_cause_picks_the_recipe(split, bottleneck, recipe, words):
    finding = only(diagnose_breakdown(breakdown(input_=40.0, split=split, hardware_type="CPU_ONLY"), CPU))
    assert (finding.bottleneck, finding.recipe, finding.severity) == (bottleneck, recipe, "high")
    assert words in finding.reason and "40.0% of each wall step waits for input" in finding.reason


@pytest.mark.parametrize(("launch_ms", "severity"), [(2.9, None), (3.0, "moderate"), (15.0, "high")])
def test_launch_bound_goes_to_xla(launch_ms, severity):
    diagnosis = diagnose_breakdown(breakdown(launch=launch_ms, device=90.0 - launch_ms, host=10.0), V100)
    if severity is None:
        assert diagnosis.findings == ()
    else:
        finding = only(diagnosis)
        assert (finding.bottleneck, finding.severity, finding.recipe) == (d.LAUNCH_BOUND, severity, "xla")


@pytest.mark.parametrize(("collectives_ms", "severity"), [(2.9, None), (3.0, "moderate"), (15.0, "high")])
def test_multi_device_sync_goes_to_distribution(collectives_ms, severity):
    diagnosis = diagnose_breakdown(breakdown(collectives=collectives_ms, device=90.0 - collectives_ms, host=10.0), V100)
    if severity is None:
        assert diagnosis.findings == ()
    else:
        finding = only(diagnosis)
        assert (finding.bottleneck, finding.severity, finding.recipe) == (d.MULTI_DEVICE_SYNC, severity, "distribution")


def test_compilation_inside_measured_steps():
    finding = only(diagnose_breakdown(breakdown(compile_=30.0, device=60.0, host=10.0), V100))
    assert (finding.bottleneck, finding.severity, finding.recipe) == (d.COMPILATION, "high", "data_pipeline")
    assert "drop_remainder=True" in finding.reason


def test_memory_bound_compute_goes_to_xla():
    finding = only(diagnose_breakdown(breakdown(device=80.0, bandwidth=85.0, flops=20.0, bits16=60.0), V100))
    assert (finding.bottleneck, finding.severity, finding.recipe) == (d.MEMORY_BOUND, "high", "xla")
    # Compute-bound (FLOPs above bandwidth) is not memory-bound.
    assert diagnose_breakdown(breakdown(device=80.0, bandwidth=30.0, flops=70.0, bits16=60.0), V100).findings == ()


@pytest.mark.parametrize(
    ("hardware", "expected"), [(V100, True), (TPU, True), (CPU_BF16, True), (P100, False), (CPU, False)]
)
def test_fp32_compute_needs_hardware_with_16bit_units(hardware, expected):
    diagnosis = diagnose_breakdown(breakdown(device=90.0, bits16=2.0), hardware)
    assert (d.FP32_COMPUTE in diagnosis.bottlenecks) is expected
    if expected:
        assert only(diagnosis).recipe == "mixed_precision" and only(diagnosis).percent == 2.0


def test_fp32_share_at_the_threshold_is_fine():
    assert diagnose_breakdown(breakdown(device=90.0, bits16=10.0), V100).findings == ()


@pytest.mark.parametrize(
    ("busy_ms", "severity"), [(10.0, "high"), (19.9, "high"), (30.0, "moderate"), (49.9, "moderate"), (50.0, None)]
)
def test_an_idle_accelerator_fed_in_time_is_dispatch_bound(busy_ms, severity):
    idle_gpu = breakdown(device=busy_ms, other=20.0)
    diagnosis = diagnose_breakdown(idle_gpu, V100)
    if severity is None:
        assert diagnosis.findings == ()
        return
    finding = only(diagnosis)
    assert (finding.bottleneck, finding.severity, finding.recipe) == (d.DISPATCH_BOUND, severity, "xla")
    assert finding.percent == pytest.approx(100.0 - busy_ms)


def test_dispatch_bound_under_xla_goes_to_steps_per_execution_then_a_larger_batch_or_grad_accum():
    """With XLA on, what is left of an idle step is the cost of each call from Python: several steps per call
    pay it once and learn the same. Where the model runs several per call already, a larger batch (or, with
    the memory full, gradient accumulation) is what is left, and it changes the learning."""
    idle_under_xla = breakdown(device=30.0, xla=100.0)
    beyond = {
        None: "a larger batch (batch_size; device memory in use was not read",
        0.5: "a larger batch (batch_size; the allocator peaked at 50% of device memory)",
        0.9: "peaked at 90% of device memory, so a larger batch would not fit: accumulating gradients",
    }
    for memory, then in beyond.items():
        finding = only(diagnose_breakdown(idle_under_xla, V100, peak_memory_fraction=memory))
        assert (finding.bottleneck, finding.recipe) == (d.DISPATCH_BOUND, "steps_per_execution")
        assert "steps_per_execution pays once per several steps with the same learning" in finding.reason
        assert then in finding.reason
    called = only(diagnose_breakdown(idle_under_xla, V100, peak_memory_fraction=0.5, steps_per_call=8))
    assert called.recipe == "batch_size" and "runs 8 steps per call already" in called.reason
    full = only(diagnose_breakdown(idle_under_xla, V100, peak_memory_fraction=0.9, steps_per_call=8))
    assert (full.bottleneck, full.recipe) == (d.DISPATCH_BOUND, "grad_accum") and "peaked at 90%" in full.reason
    # tfopt.profile captures one step per call to mark each: a model at 8 per call does not pay what it shows.
    profiled = diagnose_breakdown(idle_under_xla, V100, steps_per_call=8, captured_steps_per_call=1)
    assert profiled.findings == () and "the capture ran 1 step(s) per call" in " ".join(profiled.notes).lower()
    # A starved accelerator is idle too, but that is the input's doing: no dispatch claim.
    assert d.DISPATCH_BOUND not in diagnose_breakdown(breakdown(input_=60.0, device=5.0), V100).bottlenecks
    # On a CPU-only machine there is no accelerator to be idle: no claim.
    assert diagnose_breakdown(breakdown(host=100.0, hardware_type="CPU_ONLY"), CPU).findings == ()


def test_findings_are_ordered_high_first_then_by_share():
    diagnosis = diagnose_breakdown(breakdown(input_=25.0, launch=4.0, collectives=16.0, device=50.0, host=5.0), V100)
    assert diagnosis.bottlenecks == (d.INPUT_BOUND, d.MULTI_DEVICE_SYNC, d.LAUNCH_BOUND)
    assert diagnosis.recipes == ("data_pipeline", "distribution", "xla")
    assert diagnosis.summary.startswith("input_bound (high, 25.0%) -> data_pipeline")


def test_healthy_run_has_no_findings_and_says_so():
    diagnosis = diagnose_breakdown(breakdown(input_=1.0, device=95.0, bits16=80.0), V100)
    assert diagnosis.findings == () and diagnosis.recipes == ()
    assert diagnosis.summary == (
        "No bottleneck above the profiler's thresholds (1.0% of each wall step waits for input)."
    )
    assert diagnosis.to_dict()["input_percent"] == pytest.approx(1.0)


def test_diagnose_takes_a_profile_or_a_breakdown(make_fake_profile):
    fake = make_fake_profile(gpus=1, input_ms=2.0)
    from_profile = diagnose(fake)  # the profile's hardware and memory samples are used
    assert from_profile == fake.diagnosis
    assert diagnose(fake.breakdown, fake.hardware) == diagnose_breakdown(fake.breakdown, fake.hardware)
    with pytest.raises(TypeError, match=r"takes a Profile .*, a StepBreakdown or a capture's path; received dict"):
        diagnose({"input_percent": 50})


def test_starved_pipeline_is_input_bound(starved_profile):
    diagnosis = starved_profile.diagnosis
    assert starved_profile.breakdown.input_percent > 20.0
    assert diagnosis.input_bound
    first = diagnosis.findings[0]
    assert (first.bottleneck, first.severity, first.recipe) == (d.CPU_PREPROCESSING, "high", "data_pipeline")
    # The compute-only ceiling agrees: fed from device memory, the same model runs much faster.
    assert starved_profile.measurement.input_efficiency < 0.8


def test_tuned_pipeline_is_not_input_bound(tuned_profile):
    assert tuned_profile.breakdown.input_percent < d.INPUT_BOUND_MODERATE_PERCENT
    assert not tuned_profile.diagnosis.input_bound
    # Its 32 Python threads may still compete with training for the host's cores (~80% of the ceiling
    # measured on CPU: AMD EPYC, 2 cores with bf16 instructions (no GPU or TPU)): a cpu_contention finding,
    # never an input-bound one.
    allowed = {d.CPU_CONTENTION}
    if tuned_profile.hardware.accelerator == "gpu":
        # A GPU computes this small model's step in a small share of the wall step: per-step costs (dispatch,
        # launches) dominate, as in the H100 captures of small models (test_gpu_fixtures.py). Never grad_accum.
        allowed |= {d.DISPATCH_BOUND, d.LAUNCH_BOUND}
    assert {finding.bottleneck for finding in tuned_profile.diagnosis.findings} <= allowed
    assert "grad_accum" not in tuned_profile.diagnosis.recipes


def _measured(efficiency: float, spread: float = 0.0) -> Measurement:
    real = tuple(0.1 * (1 + spread * k) for k in (-1, 0, 0, 1))
    return Measurement(real=StepTimes(real, 8), ceiling=StepTimes((0.1 * efficiency,) * 4, 8))


def test_a_ceiling_gap_without_visible_waits_is_cpu_contention():
    # The pipeline competes with training (or, on a GPU host, with dispatch) for the cores: little
    # waiting, but slower steps than the same step fed from device memory.
    breakdown = StepBreakdown(
        source="trace", hardware_type="CPU_ONLY", step_seconds=(0.1,), input_seconds=0.002, host_compute_seconds=0.098
    )
    assert diagnose_breakdown(breakdown, CPU).findings == ()
    diagnosis = diagnose_breakdown(breakdown, CPU, measurement=_measured(0.6))
    finding = only(diagnosis)
    assert (finding.bottleneck, finding.severity, finding.recipe) == ("cpu_contention", "high", "data_pipeline")
    assert not diagnosis.input_bound  # nothing waits for input
    assert finding.percent == pytest.approx(40.0) and "60% of the compute-only ceiling" in finding.reason
    assert only(diagnose_breakdown(breakdown, CPU, measurement=_measured(0.75))).severity == "moderate"
    assert diagnose_breakdown(breakdown, CPU, measurement=_measured(0.85)).findings == ()  # below 20%
    # A gap no larger than twice the measurement's own spread is noise, whatever its size: said, not dropped.
    noisy = diagnose_breakdown(breakdown, CPU, measurement=_measured(0.6, spread=0.3))
    assert noisy.findings == () and any(
        note.startswith("Training ran at 60% of the compute-only ceiling, but the steps' own spread")
        for note in noisy.notes
    )
    assert not diagnose_breakdown(breakdown, CPU, measurement=_measured(0.85, spread=0.3)).notes  # below 20%
    on_gpu = diagnose_breakdown(
        dataclasses.replace(breakdown, hardware_type="GPU", device_busy_seconds=0.09), V100, measurement=_measured(0.6)
    )
    assert only(on_gpu).bottleneck == "cpu_contention" and "dispatch" in only(on_gpu).reason


def test_a_short_cpu_step_a_calls_cost_from_its_ceiling_is_sent_to_steps_per_execution():
    """An MLP at batch 2 on a cached, prefetched pipeline: 1 ms a step against a 0.5 ms ceiling is Keras' cost of a
    call, which data_pipeline cannot cut (measured 0.94x) and steps_per_execution does (3.16x, on CPU: AMD EPYC,
    2 cores with bf16 instructions (no GPU or TPU))."""
    breakdown = StepBreakdown(
        source="trace",
        hardware_type="CPU_ONLY",
        step_seconds=(0.001,),
        input_seconds=0.00002,
        host_compute_seconds=0.00098,
    )
    short = Measurement(real=StepTimes((0.001,) * 4, 2), ceiling=StepTimes((0.0005,) * 4, 2))
    finding = only(diagnose_breakdown(breakdown, CPU, measurement=short))
    assert (finding.bottleneck, finding.severity, finding.recipe) == ("dispatch_bound", "high", "steps_per_execution")
    assert "0.50 ms a step slower" in finding.reason and "Keras' cost of a call" in finding.reason
    several = only(diagnose_breakdown(breakdown, CPU, measurement=short, steps_per_call=4))
    assert several.bottleneck == "cpu_contention"  # calls already run several steps: not the call's cost


def test_launches_waiting_on_the_host_name_the_gpus_own_threads_where_they_were_not_in_force():
    """On a GPU, TensorFlow launches kernels from the inter-op pool the pipeline shares (TF_GPU_THREAD_MODE
    global): a dispatch-bound or contended step names gpu_private, unless the GPUs had threads of their own; CPUs
    never."""
    contended = StepBreakdown(
        source="trace", hardware_type="GPU", step_seconds=(0.1,), input_seconds=0.002, device_busy_seconds=0.09
    )
    cases = {
        "dispatch": (breakdown(device=10.0), {}),
        "dispatch under XLA": (breakdown(device=30.0, xla=100.0), {}),
        "contention": (contended, {"measurement": _measured(0.6)}),
    }
    for name, (step, settings) in cases.items():
        for mode, named in (("global", "TF_GPU_THREAD_MODE=global"), (None, "TF_GPU_THREAD_MODE is not known")):
            finding = only(diagnose_breakdown(step, V100, gpu_thread_mode=mode, **settings))
            assert named in finding.reason and "`runtime: {gpu_thread_mode: gpu_private}`" in finding.reason, name
            assert "tfopt.runtime.configure_gpu_threads()" in finding.reason
        for own in ("gpu_private", "gpu_shared"):  # the GPUs had threads of their own
            in_force = only(diagnose_breakdown(step, V100, gpu_thread_mode=own, **settings))
            assert "TF_GPU_THREAD_MODE" not in in_force.reason and in_force.recipe == finding.recipe, name
    cpu = dataclasses.replace(contended, hardware_type="CPU_ONLY", device_busy_seconds=None)
    on_cpu = only(diagnose_breakdown(cpu, CPU, measurement=_measured(0.6), gpu_thread_mode="global"))
    assert on_cpu.bottleneck == "cpu_contention" and "TF_GPU_THREAD_MODE" not in on_cpu.reason


def test_a_dispatch_bound_step_is_not_blamed_on_the_pipeline():
    # fit's own per-step costs make a dispatch-bound step slower than the ceiling's direct calls too.
    idle = breakdown(device=10.0)
    diagnosis = diagnose_breakdown(idle, V100, measurement=_measured(0.5))
    assert diagnosis.bottlenecks == (d.DISPATCH_BOUND,) and "data_pipeline" not in diagnosis.recipes


def test_a_measurement_problem_is_a_note_not_a_finding():
    breakdown = StepBreakdown(source="trace", hardware_type="CPU_ONLY", step_seconds=(0.1,), host_compute_seconds=0.1)
    diagnosis = diagnose_breakdown(breakdown, CPU, measurement=_measured(1.5))
    assert diagnosis.findings == ()
    assert any("as fast as the compute-only ceiling" in note for note in diagnosis.notes)
