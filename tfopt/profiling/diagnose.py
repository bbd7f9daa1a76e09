"""Why training underuses the hardware: bottleneck classes found in a wall-step breakdown, and the recipe
that fixes each.

Pure functions of a `StepBreakdown`, a `Hardware` and (where measured) the input efficiency, so every
class is tested with constructed breakdowns, real CPU captures and the real H100 captures in
tests/fixtures/gpu-h100. The thresholds are the TF Profiler's own (the ones behind its "HIGHLY
input-bound" and kernel-launch/collectives statements), so tfopt and TensorBoard agree:

| share of the wall step        | moderate | high  |
|-------------------------------|----------|-------|
| waiting for input             | >= 5%    | >= 20%|
| kernel launch                 | >= 3%    | >= 15%|
| collectives, device-to-device | >= 3%    | >= 15%|
| compilation (tfopt's choice)  | >= 3%    | >= 15%|

Device compute in 16-bit types below 10% means mixed precision is left on the table (where device
compute dominates the step). An accelerator busy less than half the wall step while the input keeps up
is `dispatch_bound`: per-step costs (op dispatch, kernel launches, Python) dominate. Without XLA, XLA is the
fix (fewer, fused kernels); with it, what is left is the cost of each call from Python, which
`steps_per_execution` pays once per several steps with the same learning. A larger batch amortises it too,
but changes the learning, so it is named second; gradient accumulation does not amortise it (it keeps the
per-example dispatch cost) and is named instead only when the allocator's peak is near the device's memory.

Input work can also cost without visible waits: on a CPU-only machine the pipeline competes with
training for the same cores, and on a GPU host its threads compete with dispatch. The measured input
efficiency (ceiling step time / real step time) catches that: a gap of 20% (moderate) or 35% (high)
without waits above 5% is `cpu_contention` (not "input-bound": nothing waits), if it is also more than
twice the measurement's own spread.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from tfopt.hardware import Hardware
from tfopt.profiling.breakdown import StepBreakdown
from tfopt.profiling.layers import TOP_LAYER_SHARE
from tfopt.runtime import gpu_thread_mode_in_force

if TYPE_CHECKING:
    from tfopt.profiling.hotspots import Hotspots
    from tfopt.profiling.measurement import Measurement

INPUT_BOUND_MODERATE_PERCENT = 5.0
INPUT_BOUND_HIGH_PERCENT = 20.0
KERNEL_LAUNCH_MODERATE_PERCENT = 3.0
KERNEL_LAUNCH_HIGH_PERCENT = 15.0
COLLECTIVES_MODERATE_PERCENT = 3.0
COLLECTIVES_HIGH_PERCENT = 15.0
COMPILE_MODERATE_PERCENT = 3.0
COMPILE_HIGH_PERCENT = 15.0
CEILING_GAP_MODERATE_PERCENT = 20.0
CEILING_GAP_HIGH_PERCENT = 35.0
LOW_16BIT_PERCENT = 10.0
# An accelerator busy less than this share of the wall step, with the input keeping up, is dominated by
# per-step costs; below the second figure, severely so.
DISPATCH_BOUND_BUSY_PERCENT = 50.0
DISPATCH_BOUND_HIGH_BUSY_PERCENT = 20.0
# A CPU step slower than its compute-only ceiling by less than this, with nothing waiting for input, pays Keras'
# cost of a call (the call from Python, the iterator's handover) once per step: not the pipeline's threads. The
# ceiling calls the step directly, without that cost.
PER_CALL_GAP_SECONDS = 0.001
# Device compute below this share of the step makes 16-bit compute matter little.
DEVICE_DOMINANT_PERCENT = 50.0
# Kernel time from XLA-compiled modules above this share means XLA is already on.
XLA_IN_USE_PERCENT = 50.0
# Above this share of device memory at the allocator's peak, a larger batch would not fit.
MEMORY_FULL_FRACTION = 0.8
# The input cause that takes at least this share of host input time names the input bottleneck.
INPUT_CAUSE_FRACTION = 0.5

INPUT_BOUND = "input_bound"
CPU_PREPROCESSING = "cpu_preprocessing"
STORAGE_BANDWIDTH = "storage_bandwidth"
LAUNCH_BOUND = "launch_bound"
DISPATCH_BOUND = "dispatch_bound"
MEMORY_BOUND = "memory_bound"
FP32_COMPUTE = "fp32_compute"
MULTI_DEVICE_SYNC = "multi_device_sync"
COMPILATION = "compilation"
CPU_CONTENTION = "cpu_contention"

INPUT_BOTTLENECKS = frozenset({INPUT_BOUND, CPU_PREPROCESSING, STORAGE_BANDWIDTH})
"""The classes in which the accelerator waits for data; a run has at most one of them. `cpu_contention`
is not one: the steps do not wait, they run slower because input work shares the CPU cores."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One bottleneck and the recipe that addresses it.

    Attributes:
        bottleneck: The class, one of the module's constants (e.g. "cpu_preprocessing").
        severity: "high" or "moderate", by the profiler's thresholds.
        percent: The measured share of step time behind the finding (or the 16-bit share for
            "fp32_compute").
        recipe: The tfopt recipe that fixes it.
        reason: One sentence with the measured numbers: why this recipe.
    """

    bottleneck: str
    severity: str
    percent: float
    recipe: str
    reason: str

    def __str__(self) -> str:
        return f"{self.bottleneck} ({self.severity}, {self.percent:.1f}%): {self.recipe}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The bottlenecks of one run, most severe first.

    Attributes:
        findings: What was found; empty when no share reached a threshold.
        input_percent: The share of the wall step spent waiting for input.
        notes: What could not be concluded, and why.
        hotspots: Where the time goes inside the step: the input pipeline stage by stage and the model
            layer by layer, where read from a capture.
    """

    findings: tuple[Finding, ...]
    input_percent: float
    notes: tuple[str, ...] = ()
    hotspots: Hotspots | None = None

    @property
    def bottlenecks(self) -> tuple[str, ...]:
        return tuple(finding.bottleneck for finding in self.findings)

    @property
    def recipes(self) -> tuple[str, ...]:
        """The recipes to apply, most urgent first, each once."""
        return tuple(dict.fromkeys(finding.recipe for finding in self.findings))

    @property
    def input_bound(self) -> bool:
        """Whether the accelerator waits for data at least the profiler's "moderately" 5% of a step."""
        return any(finding.bottleneck in INPUT_BOTTLENECKS for finding in self.findings)

    @property
    def summary(self) -> str:
        if not self.findings:
            return (
                f"No bottleneck above the profiler's thresholds ({self.input_percent:.1f}% of each wall "
                "step waits for input)."
            )
        return "; ".join(f"{f.bottleneck} ({f.severity}, {f.percent:.1f}%) -> {f.recipe}" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_percent": self.input_percent,
            "summary": self.summary,
            "recipes": list(self.recipes),
            "findings": [dataclasses.asdict(finding) for finding in self.findings],
            "notes": list(self.notes),
            "hotspots": self.hotspots.to_dict() if self.hotspots is not None else None,
        }


def diagnose(profile_or_breakdown: Any, hardware: Hardware | None = None) -> Diagnosis:
    """Classifies a run's bottlenecks and names the recipe for each.

    Args:
        profile_or_breakdown: A `Profile` (from `tfopt.profile`), a `StepBreakdown`, or the path of an
            existing capture (a TensorBoard logdir or `.xplane.pb` from `tfopt.profile`, Keras'
            `TensorBoard(profile_batch=...)`, `tf.profiler`, possibly from another machine).
        hardware: The machine the run was on; by default the profile's, the capture's GPUs (read from
            the trace), or this machine's.

    Returns:
        The findings, most severe first; `notes` says what could not be concluded.

    Raises:
        TypeError: The argument is none of those.
        MeasurementError: The path holds no readable capture, or one without training steps.

    Example:
        >>> from tfopt.profiling.breakdown import StepBreakdown
        >>> starved = StepBreakdown(source="trace", hardware_type="CPU_ONLY", step_seconds=(0.04,),
        ...                         input_seconds=0.03, host_compute_seconds=0.01)
        >>> diagnose(starved, Hardware()).recipes
        ('data_pipeline',)
    """
    if isinstance(profile_or_breakdown, (str, os.PathLike)):
        return diagnose_capture(profile_or_breakdown, hardware)[2]
    if isinstance(profile_or_breakdown, StepBreakdown):
        if hardware is None:
            from tfopt.hardware import detect

            hardware = detect()
        return diagnose_breakdown(profile_or_breakdown, hardware)
    if isinstance(getattr(profile_or_breakdown, "breakdown", None), StepBreakdown):
        profile = profile_or_breakdown
        return diagnose_breakdown(
            profile.breakdown,
            hardware or profile.hardware,
            peak_memory_fraction=profile.peak_memory_fraction,
            measurement=profile.measurement,
            steps_per_call=profile.capture.steps_per_call,
            captured_steps_per_call=1,
            gpu_thread_mode=gpu_thread_mode_in_force(),  # a Profile is this process' own
        )
    raise TypeError(
        f"diagnose() takes a Profile (from tfopt.profile), a StepBreakdown or a capture's path; "
        f"received {type(profile_or_breakdown).__name__}."
    )


def diagnose_capture(
    path: str | os.PathLike, hardware: Hardware | None = None
) -> tuple[StepBreakdown, Hardware, Diagnosis]:
    """Analyses and diagnoses an existing capture: its breakdown, the hardware it ran on, the diagnosis
    (with its `hotspots`: the input pipeline stage by stage, the model layer by layer).

    Wall steps come from tfopt's step markers, or from Keras' train-function calls where there are none.
    Without a timed measurement next to the trace, the input efficiency and MFU stay unknown (the
    diagnosis' notes say so); without the model and the dataset, layers' FLOPs and maps' function names.
    """
    from tfopt.profiling.analyze import analyze, find_xplane
    from tfopt.profiling.hotspots import find_hotspots
    from tfopt.profiling.trace import trace_gpus

    xplane = find_xplane(path)
    if hardware is None:
        from tfopt.hardware import detect

        # The capture's own GPUs (none: it ran on a CPU); the host's details are this machine's.
        hardware = dataclasses.replace(detect(), gpus=trace_gpus(xplane), tpu_cores=0)
    breakdown = analyze(xplane)
    hotspots = find_hotspots(xplane, hardware, step_seconds=breakdown.step_seconds_mean)
    diagnosis = refine_diagnosis(diagnose_breakdown(breakdown, hardware), hotspots)
    note = (
        f"The capture does not record its host: CPU core counts in the findings are this machine's "
        f"({hardware.cpu_count})."
    )
    return breakdown, hardware, dataclasses.replace(diagnosis, notes=(*diagnosis.notes, note))


def diagnose_breakdown(
    breakdown: StepBreakdown,
    hardware: Hardware,
    *,
    peak_memory_fraction: float | None = None,
    measurement: Measurement | None = None,
    steps_per_call: int = 1,
    captured_steps_per_call: int | None = None,
    gpu_thread_mode: str | None = None,
) -> Diagnosis:
    """The pure classification behind `diagnose`.

    Args:
        breakdown: Where the wall step's time went.
        hardware: The machine it ran on (decides whether 16-bit compute and bigger batches apply).
        peak_memory_fraction: TensorFlow's allocator peak over the device's memory (0..1), where read.
        measurement: The run's `measurement.Measurement` (input efficiency and its noise), where measured.
        steps_per_call: The training steps the model runs per call of its train function (Keras'
            `steps_per_execution`): past 1, a dispatch-bound step is sent to a larger batch.
        captured_steps_per_call: The steps per call the capture ran, where not the model's (`tfopt.profile`
            marks each step: one per call). Its per-call cost is then not the model's: no dispatch finding.
        gpu_thread_mode: TF_GPU_THREAD_MODE of the process that ran (`tfopt.runtime.gpu_thread_mode_in_force`),
            None where not known (a capture read later). On a GPU, findings of launches waiting for the host's
            threads name the GPUs' own threads where they were not in force.

    Returns:
        The findings, high severity first, then by share of step time.
    """
    threads = _gpu_threads(hardware, gpu_thread_mode)
    dispatch = _dispatch(breakdown, hardware, peak_memory_fraction, steps_per_call, threads)
    notes = list(breakdown.notes)
    if dispatch is not None and captured_steps_per_call not in (None, steps_per_call):
        notes.append(
            f"The capture ran {captured_steps_per_call} step(s) per call to mark each step, and the model runs "
            f"{steps_per_call}: the cost of each call from Python it shows is not the model's, so whether the "
            "accelerator idles for per-step costs is not concluded (tfopt.Monitor measures the model as it runs)."
        )
        dispatch = None
    findings = [
        finding
        for finding in (
            # A dispatch-bound step is slower than the ceiling's direct calls by fit's own per-step costs too:
            # that gap is not the pipeline's, so it is not read as contention there.
            _input(breakdown, hardware, None if dispatch else measurement, threads, steps_per_call),
            *_share_findings(breakdown),
            _memory_bound(breakdown),
            _precision(breakdown, hardware),
            dispatch,
        )
        if finding is not None
    ]
    findings.sort(key=lambda finding: (finding.severity != "high", -finding.percent))
    if measurement is None:
        notes.append(
            "No timed measurement next to the trace: the input efficiency (real steps against the "
            "compute-only ceiling) and MFU are unknown, so input cost without visible waits cannot "
            "be seen."
        )
    elif measurement.measurement_problem:
        notes.append(measurement.measurement_problem)
    elif not dispatch and (noisy := _gap_within_noise(measurement)):
        notes.append(noisy)
    if hardware.accelerator != "cpu" and peak_memory_fraction is None:
        notes.append(
            "Device memory in use is unknown (TensorFlow's allocator peak was not read): whether a "
            "larger batch fits is not judged."
        )
    return Diagnosis(findings=tuple(findings), input_percent=breakdown.input_percent, notes=tuple(notes))


def _ceiling_gap(measurement: Measurement | None) -> tuple[float, bool] | None:
    """The real steps' gap to the compute-only ceiling, in percent, and whether the measurement's own spread
    leaves it unproven (no larger than twice the spread); None where the input efficiency cannot be read."""
    efficiency = measurement.input_efficiency if measurement is not None else None
    if efficiency is None:
        return None
    gap_percent = 100.0 * (1.0 - efficiency)
    return gap_percent, gap_percent <= 200.0 * measurement.noise


def _gap_within_noise(measurement: Measurement) -> str | None:
    """The note for a gap to the compute-only ceiling large enough for a finding that the measurement's own spread
    leaves unproven (`_contention` reads it as noise), or None: said, so that a gap is never dropped unseen."""
    gap = _ceiling_gap(measurement)
    if gap is None or not gap[1] or gap[0] < CEILING_GAP_MODERATE_PERCENT:
        return None
    gap_percent = gap[0]
    return (
        f"Training ran at {100 - gap_percent:.0f}% of the compute-only ceiling, but the steps' own spread "
        f"({measurement.noise:.0%}) is too wide to tell that gap from noise: measure more steps (steps=) on a "
        "quieter machine to know."
    )


def _severity(percent: float, moderate: float, high: float) -> str | None:
    percent = round(percent, 9)  # 100 * 0.003 / 0.1 is 2.9999999999999996: not below a 3% threshold
    if percent >= high:
        return "high"
    if percent >= moderate:
        return "moderate"
    return None


def _input(
    breakdown: StepBreakdown, hardware: Hardware, measurement: Measurement, threads: str, steps_per_call: int
) -> Finding | None:
    percent = breakdown.input_percent
    severity = _severity(percent, INPUT_BOUND_MODERATE_PERCENT, INPUT_BOUND_HIGH_PERCENT)
    if severity is None:
        return _contention(percent, hardware, measurement, threads, steps_per_call)
    split = breakdown.input_split or {}
    waiting = f"{percent:.1f}% of each wall step waits for input"
    if split.get("file_read", 0.0) >= INPUT_CAUSE_FRACTION:
        return Finding(
            STORAGE_BANDWIDTH,
            severity,
            percent,
            "tfrecord",
            f"{waiting} and {split['file_read']:.0%} of input time reads files: large sequential "
            "TFRecord shards read in parallel replace many small reads.",
        )
    if split.get("preprocessing", 0.0) >= INPUT_CAUSE_FRACTION:
        return Finding(
            CPU_PREPROCESSING,
            severity,
            percent,
            "data_pipeline",
            f"{waiting} and {split['preprocessing']:.0%} of input time is preprocessing on "
            f"{hardware.cpu_count} CPU core(s): parallel map calls, caching and prefetch let it "
            "run ahead of training.",
        )
    return Finding(
        INPUT_BOUND,
        severity,
        percent,
        "data_pipeline",
        f"{waiting}: parallel map calls and prefetching keep batches ready before the step asks.",
    )


def _contention(
    input_percent: float, hardware: Hardware, measurement: Measurement, threads: str, steps_per_call: int
) -> Finding | None:
    """Input cost without visible waits: the pipeline's threads slow the step by sharing the cores; or, for a CPU
    step a call's cost away from its ceiling, that cost (`PER_CALL_GAP_SECONDS`)."""
    gap = _ceiling_gap(measurement)
    if gap is None or gap[1]:
        return None
    gap_percent = gap[0]
    severity = _severity(gap_percent, CEILING_GAP_MODERATE_PERCENT, CEILING_GAP_HIGH_PERCENT)
    if severity is None:
        return None
    gap_seconds = measurement.real.median_seconds - measurement.ceiling.median_seconds
    if hardware.accelerator == "cpu" and steps_per_call == 1 and gap_seconds < PER_CALL_GAP_SECONDS:
        return Finding(
            DISPATCH_BOUND,
            severity,
            gap_percent,
            "steps_per_execution",
            f"training runs at {100 - gap_percent:.0f}% of the compute-only ceiling, {gap_seconds * 1000:.2f} ms "
            f"a step slower, and only {input_percent:.1f}% of each step visibly waits for input: a step this "
            "short pays Keras' cost of a call (the call from Python, the iterator's handover) once per step, "
            "which steps_per_execution spreads over several steps.",
        )
    competitor = "training" if hardware.accelerator == "cpu" else "the host's op dispatch"
    return Finding(
        CPU_CONTENTION,
        severity,
        gap_percent,
        "data_pipeline",
        f"training runs at {100 - gap_percent:.0f}% of the compute-only ceiling although only "
        f"{input_percent:.1f}% of each step visibly waits for input: the input pipeline competes with "
        f"{competitor} for {hardware.cpu_count} CPU core(s); caching decoded data and parallel, "
        f"prefetched stages cut its cost.{threads}",
    )


def _gpu_threads(hardware: Hardware, gpu_thread_mode: str | None) -> str:
    """The sentence naming the GPUs' own launch threads (`tfopt.runtime.configure_gpu_threads`) for a finding
    of launches waiting on the host, or "" where they had threads of their own (gpu_private, gpu_shared) or
    there is no GPU."""
    if hardware.accelerator != "gpu" or gpu_thread_mode in ("gpu_private", "gpu_shared"):
        return ""
    now = f"TF_GPU_THREAD_MODE={gpu_thread_mode}" if gpu_thread_mode else "the run's TF_GPU_THREAD_MODE is not known"
    return (
        f" Kernel launches share TensorFlow's inter-op threads with the pipeline and the CPU ops ({now}): "
        "`runtime: {gpu_thread_mode: gpu_private}` in a recipe file, or tfopt.runtime.configure_gpu_threads() at "
        "the top of a script, gives the GPUs threads of their own (benchmarks/gpu_threads.py measures it)."
    )


# Findings read off one share of the step: (bottleneck, the breakdown's seconds, thresholds, recipe, why).
_SHARE_FINDINGS = (
    (
        COMPILATION,
        "compile_seconds",
        COMPILE_MODERATE_PERCENT,
        COMPILE_HIGH_PERCENT,
        "data_pipeline",
        "{percent:.1f}% of step time is compilation after warm-up, so batch shapes change between steps: fixed "
        "shapes (drop_remainder=True, padded batches) compile once.",
    ),
    (
        MULTI_DEVICE_SYNC,
        "collectives_seconds",
        COLLECTIVES_MODERATE_PERCENT,
        COLLECTIVES_HIGH_PERCENT,
        "distribution",
        "{percent:.1f}% of step time is cross-device communication: a strategy with packed NCCL "
        "all-reduce and a larger per-replica batch sync less often per example.",
    ),
    (
        LAUNCH_BOUND,
        "kernel_launch_seconds",
        KERNEL_LAUNCH_MODERATE_PERCENT,
        KERNEL_LAUNCH_HIGH_PERCENT,
        "xla",
        "{percent:.1f}% of step time launches kernels: XLA fuses small ops into fewer, larger kernels.",
    ),
)


def _share_findings(breakdown: StepBreakdown) -> list[Finding | None]:
    """Compilation, cross-device sync and kernel launches: each a finding where its share of the step
    passes the thresholds."""
    findings = []
    for bottleneck, seconds, moderate, high, recipe, reason in _SHARE_FINDINGS:
        percent = breakdown.percent(seconds)
        severity = _severity(percent, moderate, high)
        findings.append(
            None if severity is None else Finding(bottleneck, severity, percent, recipe, reason.format(percent=percent))
        )
    return findings


def _memory_bound(breakdown: StepBreakdown) -> Finding | None:
    bandwidth, flops = breakdown.memory_bandwidth_percent, breakdown.flop_rate_percent
    device_percent = breakdown.percent("device_compute_seconds")
    if bandwidth is None or flops is None or bandwidth <= flops or device_percent < DEVICE_DOMINANT_PERCENT:
        return None
    return Finding(
        MEMORY_BOUND,
        "high" if bandwidth >= 2 * flops else "moderate",
        device_percent,
        "xla",
        f"Device compute ({device_percent:.1f}% of step time) uses {bandwidth:.0f}% of memory "
        f"bandwidth but {flops:.0f}% of peak FLOPs: XLA fusion keeps intermediates on chip.",
    )


def _precision(breakdown: StepBreakdown, hardware: Hardware) -> Finding | None:
    share = breakdown.compute_16bit_percent
    if share is None or share >= LOW_16BIT_PERCENT or not hardware.has_fast_16bit:
        return None
    if breakdown.percent("device_compute_seconds") < DEVICE_DOMINANT_PERCENT:
        return None  # halving compute time matters little while something else dominates the step
    return Finding(
        FP32_COMPUTE,
        "moderate",
        share,
        "mixed_precision",
        f"Only {share:.1f}% of device compute runs in 16-bit types on hardware with 16-bit "
        "units: mixed precision halves memory traffic and uses tensor cores.",
    )


def _dispatch(
    breakdown: StepBreakdown,
    hardware: Hardware,
    peak_memory_fraction: float | None,
    steps_per_call: int,
    threads: str,
) -> Finding | None:
    busy = breakdown.busy_percent
    if (
        hardware.accelerator == "cpu"
        or busy is None
        or busy >= DISPATCH_BOUND_BUSY_PERCENT
        or breakdown.input_percent >= INPUT_BOUND_HIGH_PERCENT
    ):
        return None
    severity = "high" if busy < DISPATCH_BOUND_HIGH_BUSY_PERCENT else "moderate"
    idle = f"The accelerator is busy {busy:.1f}% of each wall step while the input keeps up"
    xla_share = breakdown.xla_kernel_percent
    if xla_share is None or xla_share < XLA_IN_USE_PERCENT:
        return Finding(
            DISPATCH_BOUND,
            severity,
            100.0 - busy,
            "xla",
            f"{idle}: per-step costs (op dispatch, one launch per op, Python) dominate. XLA compiles "
            f"the step into a few fused kernels.{threads}",
        )
    full = peak_memory_fraction is not None and peak_memory_fraction >= MEMORY_FULL_FRACTION
    if full:
        larger = (
            f"TensorFlow's allocator peaked at {peak_memory_fraction:.0%} of device memory, so a larger batch "
            "would not fit: accumulating gradients over micro-batches (grad_accum) gives the effect of one"
        )
    else:
        headroom = (
            "device memory in use was not read: check that it fits"
            if peak_memory_fraction is None
            else f"the allocator peaked at {peak_memory_fraction:.0%} of device memory"
        )
        larger = f"a larger batch (batch_size; {headroom}) spreads it over more examples"
    if steps_per_call > 1:
        return Finding(
            DISPATCH_BOUND,
            severity,
            100.0 - busy,
            "grad_accum" if full else "batch_size",
            f"{idle}, XLA is on and the model runs {steps_per_call} steps per call already: the rest is fixed "
            f"per-step cost; {larger}, which changes the learning.{threads}",
        )
    return Finding(
        DISPATCH_BOUND,
        severity,
        100.0 - busy,
        "steps_per_execution",
        f"{idle} and XLA is on: the rest is the fixed cost of each call from Python (the call, the iterator's "
        "handover, the read of the step's logs), which steps_per_execution pays once per several steps with the "
        f"same learning. Beyond that, {larger}, which changes the learning.{threads}",
    )


def refine_diagnosis(diagnosis: Diagnosis, hotspots: Hotspots) -> Diagnosis:
    """The diagnosis with its `hotspots`, its input finding naming the bounding stage (and taking that
    stage's recipe), and a finding for a layer that takes `TOP_LAYER_SHARE` of the wall step on an
    accelerator where no finding names its recipe yet (on a CPU-only capture a layer's share of the step is
    not known)."""
    findings = list(diagnosis.findings)
    stages = hotspots.stages
    if stages is not None and stages.bottleneck is not None:
        # Offloading (data_service) is named by the stage line beside the finding, not instead of its recipe:
        # the local levers (the rewrite's cache and prefetch) cost no other machine and come first.
        recipe = stages.recipe if stages.recipe != "data_service" else None
        for index, finding in enumerate(findings):
            if finding.bottleneck in INPUT_BOTTLENECKS:
                findings[index] = dataclasses.replace(
                    finding, recipe=recipe or finding.recipe, reason=f"{finding.reason} Stage by stage: {stages.fix}"
                )
    layers = hotspots.layers
    top = layers.top if layers is not None else None
    share_of_step = layers.share_of_step(top) if top is not None else None
    if (
        top is not None
        and top.recipe is not None
        and share_of_step is not None
        and share_of_step >= TOP_LAYER_SHARE
        and top.recipe not in {f.recipe for f in findings}
    ):
        findings.append(
            Finding(
                MEMORY_BOUND if top.recipe == "xla" else FP32_COMPUTE,
                "moderate",
                100.0 * share_of_step,
                top.recipe,
                f"Layer {top.layer} takes {share_of_step:.0%} of each wall step on the device: {top.fix}",
            )
        )
    return dataclasses.replace(diagnosis, findings=tuple(findings), hotspots=hotspots)
