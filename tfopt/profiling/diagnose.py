"""Why training underuses the hardware: bottleneck classes found in a step breakdown, and the recipe
that fixes each.

Pure functions of a `StepBreakdown` and a `Hardware`, so every class is tested with constructed
breakdowns as well as real captures. The thresholds are the TF Profiler's own (the ones behind its
"HIGHLY input-bound" and kernel-launch/collectives statements), so tfopt and TensorBoard agree:

| share of step time            | moderate | high  |
|-------------------------------|----------|-------|
| waiting for input             | >= 5%    | >= 20%|
| kernel launch                 | >= 3%    | >= 15%|
| collectives, device-to-device | >= 3%    | >= 15%|
| compilation (tfopt's choice)  | >= 3%    | >= 15%|

and device compute in 16-bit types below 10% means mixed precision is left on the table.

The trace alone misses input cost on a CPU-only machine: there the input pipeline does not make the step
wait so much as compete with training for the same cores, so the cost shows up as slower host compute.
The measured utilization (real step time against the compute-only ceiling) catches it: on a CPU-only
machine whose trace shows waits below the 5% threshold, a gap of 20% (moderate) or 35% (high) is a
`cpu_contention` finding (not "input-bound": nothing waits), if it is also more than twice the
measurement's own spread: tfopt's thresholds, higher than
the trace's because two timed runs on a shared machine differ by 10-20% by noise alone. On accelerators the trace sees the wait
and says more (which input stage), so it decides there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfopt.hardware import Hardware
from tfopt.profiling.analyze import StepBreakdown

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
# A step where the accelerator computes less than half the time, with the input pipeline keeping up,
# is dominated by fixed per-step costs (dispatch, Python, launches): a larger batch amortises them.
SMALL_BATCH_DEVICE_PERCENT = 50.0
# Above this share of device memory in use, a larger batch would not fit: accumulate gradients instead.
MEMORY_FULL_FRACTION = 0.8
# The input cause that takes at least this share of host input time names the input bottleneck.
INPUT_CAUSE_FRACTION = 0.5

INPUT_BOUND = "input_bound"
CPU_PREPROCESSING = "cpu_preprocessing"
STORAGE_BANDWIDTH = "storage_bandwidth"
LAUNCH_BOUND = "launch_bound"
MEMORY_BOUND = "memory_bound"
FP32_COMPUTE = "fp32_compute"
SMALL_BATCH = "small_batch"
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
        input_percent: The share of step time spent waiting for input.
    """

    findings: tuple[Finding, ...]
    input_percent: float

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
            return (f"No bottleneck above the profiler's thresholds ({self.input_percent:.1f}% of step "
                    "time waits for input).")
        return "; ".join(f"{f.bottleneck} ({f.severity}, {f.percent:.1f}%) -> {f.recipe}" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"input_percent": self.input_percent, "summary": self.summary, "recipes": list(self.recipes),
                "findings": [dataclasses.asdict(finding) for finding in self.findings]}


def diagnose(profile_or_breakdown: Any, hardware: Hardware | None = None) -> Diagnosis:
    """Classifies a run's bottlenecks and names the recipe for each.

    Args:
        profile_or_breakdown: A `Profile` (from `tfopt.profile`) or a `StepBreakdown`.
        hardware: The machine the run was on; by default the profile's, or this machine's.

    Returns:
        The findings, most severe first.

    Raises:
        TypeError: The argument is neither a Profile nor a StepBreakdown.

    Example:
        >>> from tfopt.profiling.analyze import StepBreakdown
        >>> starved = StepBreakdown(source="trace", hardware_type="CPU_ONLY", step_seconds=(0.04,),
        ...                         input_seconds=0.03, host_compute_seconds=0.01)
        >>> diagnose(starved, Hardware()).recipes
        ('data_pipeline',)
    """
    peak_memory_fraction = utilization = None
    utilization_noise = 0.0
    if isinstance(profile_or_breakdown, StepBreakdown):
        breakdown = profile_or_breakdown
    elif isinstance(getattr(profile_or_breakdown, "breakdown", None), StepBreakdown):
        breakdown = profile_or_breakdown.breakdown
        hardware = hardware or profile_or_breakdown.hardware
        peak_memory_fraction = profile_or_breakdown.samples.peak_memory_fraction
        utilization = profile_or_breakdown.measurement.utilization
        utilization_noise = relative_spread(profile_or_breakdown.measurement)
    else:
        raise TypeError(f"diagnose() takes a Profile (from tfopt.profile) or a StepBreakdown; received "
                        f"{type(profile_or_breakdown).__name__}.")
    if hardware is None:
        from tfopt.hardware import detect

        hardware = detect()
    return diagnose_breakdown(breakdown, hardware, peak_memory_fraction=peak_memory_fraction,
                              utilization=utilization, utilization_noise=utilization_noise)


def diagnose_breakdown(breakdown: StepBreakdown, hardware: Hardware, *,
                       peak_memory_fraction: float | None = None, utilization: float | None = None,
                       utilization_noise: float = 0.0) -> Diagnosis:
    """The pure classification behind `diagnose`.

    Args:
        breakdown: Where the step time went.
        hardware: The machine it ran on (decides whether 16-bit compute and bigger batches apply).
        peak_memory_fraction: The fullest accelerator's peak memory use (0..1), where it was sampled.
        utilization: Real step time against the compute-only ceiling (1.0 = the input costs nothing),
            where it was measured.
        utilization_noise: The measurement's relative spread (`relative_spread`); a ceiling gap within
            twice of it is not a finding.

    Returns:
        The findings, high severity first, then by share of step time.
    """
    findings = [finding for finding in (
        _input(breakdown, hardware, utilization, utilization_noise),
        _compilation(breakdown),
        _collectives(breakdown),
        _launch(breakdown),
        _memory_bound(breakdown),
        _precision(breakdown, hardware),
        _small_batch(breakdown, hardware, peak_memory_fraction),
    ) if finding is not None]
    findings.sort(key=lambda finding: (finding.severity != "high", -finding.percent))
    return Diagnosis(findings=tuple(findings), input_percent=breakdown.input_percent)


def _severity(percent: float, moderate: float, high: float) -> str | None:
    percent = round(percent, 9)  # 100 * 0.003 / 0.1 is 2.9999999999999996: not below a 3% threshold
    if percent >= high:
        return "high"
    if percent >= moderate:
        return "moderate"
    return None


def relative_spread(measurement: Any) -> float:
    """The larger relative interquartile range of a measurement's real and ceiling step times."""
    return max(times.spread_seconds / times.median_seconds for times in (measurement.real, measurement.ceiling))


def _input(breakdown: StepBreakdown, hardware: Hardware, utilization: float | None,
           utilization_noise: float) -> Finding | None:
    percent = breakdown.input_percent
    severity = _severity(percent, INPUT_BOUND_MODERATE_PERCENT, INPUT_BOUND_HIGH_PERCENT)
    gap_percent = 100.0 * (1.0 - utilization) if utilization is not None else 0.0
    gap_severity = (_severity(gap_percent, CEILING_GAP_MODERATE_PERCENT, CEILING_GAP_HIGH_PERCENT)
                    if gap_percent > 200.0 * utilization_noise else None)
    if severity is None and gap_severity is not None and hardware.accelerator == "cpu":
        # The trace shows little waiting, yet training is well below its ceiling: on a CPU-only machine
        # the input pipeline slows the step by competing with it for the cores.
        return Finding(CPU_CONTENTION, gap_severity, gap_percent, "data_pipeline",
                       f"training runs at {100 - gap_percent:.0f}% of the compute-only ceiling although only "
                       f"{percent:.1f}% of each step visibly waits for input: the input pipeline competes with "
                       f"training for {hardware.cpu_count} CPU core(s); caching decoded data and parallel, "
                       "prefetched stages cut its cost.")
    if severity is None:
        return None
    split = breakdown.input_split or {}
    waiting = f"{percent:.1f}% of each step waits for input"
    if split.get("file_read", 0.0) >= INPUT_CAUSE_FRACTION:
        return Finding(STORAGE_BANDWIDTH, severity, percent, "tfrecord",
                       f"{waiting} and {split['file_read']:.0%} of input time reads files: large sequential "
                       "TFRecord shards read in parallel replace many small reads.")
    if split.get("preprocessing", 0.0) >= INPUT_CAUSE_FRACTION:
        return Finding(CPU_PREPROCESSING, severity, percent, "data_pipeline",
                       f"{waiting} and {split['preprocessing']:.0%} of input time is preprocessing on "
                       f"{hardware.cpu_count} CPU core(s): parallel map calls, caching and prefetch let it "
                       "run ahead of training.")
    return Finding(INPUT_BOUND, severity, percent, "data_pipeline",
                   f"{waiting}: prefetching and parallel reads keep batches ready before the step asks.")


def _compilation(breakdown: StepBreakdown) -> Finding | None:
    percent = breakdown.percent("compile_seconds")
    severity = _severity(percent, COMPILE_MODERATE_PERCENT, COMPILE_HIGH_PERCENT)
    if severity is None:
        return None
    return Finding(COMPILATION, severity, percent, "data_pipeline",
                   f"{percent:.1f}% of step time is compilation after warm-up, so batch shapes change "
                   "between steps: fixed shapes (drop_remainder=True, padded batches) compile once.")


def _collectives(breakdown: StepBreakdown) -> Finding | None:
    percent = breakdown.percent("collectives_seconds")
    severity = _severity(percent, COLLECTIVES_MODERATE_PERCENT, COLLECTIVES_HIGH_PERCENT)
    if severity is None:
        return None
    return Finding(MULTI_DEVICE_SYNC, severity, percent, "distribution",
                   f"{percent:.1f}% of step time is cross-device communication: a strategy with packed "
                   "NCCL all-reduce and a larger per-replica batch sync less often per example.")


def _launch(breakdown: StepBreakdown) -> Finding | None:
    percent = breakdown.percent("kernel_launch_seconds")
    severity = _severity(percent, KERNEL_LAUNCH_MODERATE_PERCENT, KERNEL_LAUNCH_HIGH_PERCENT)
    if severity is None:
        return None
    return Finding(LAUNCH_BOUND, severity, percent, "xla",
                   f"{percent:.1f}% of step time launches kernels: XLA fuses small ops into fewer, "
                   "larger kernels.")


def _memory_bound(breakdown: StepBreakdown) -> Finding | None:
    bandwidth, flops = breakdown.memory_bandwidth_percent, breakdown.flop_rate_percent
    device_percent = breakdown.percent("device_compute_seconds")
    if bandwidth is None or flops is None or bandwidth <= flops or device_percent < SMALL_BATCH_DEVICE_PERCENT:
        return None
    return Finding(MEMORY_BOUND, "high" if bandwidth >= 2 * flops else "moderate", device_percent, "xla",
                   f"Device compute ({device_percent:.1f}% of step time) uses {bandwidth:.0f}% of memory "
                   f"bandwidth but {flops:.0f}% of peak FLOPs: XLA fusion keeps intermediates on chip.")


def _precision(breakdown: StepBreakdown, hardware: Hardware) -> Finding | None:
    share = breakdown.compute_16bit_percent
    if share is None or share >= LOW_16BIT_PERCENT or not _has_fast_16bit(hardware):
        return None
    if breakdown.percent("device_compute_seconds") < SMALL_BATCH_DEVICE_PERCENT:
        return None  # halving compute time matters little while something else dominates the step
    return Finding(FP32_COMPUTE, "moderate", share, "mixed_precision",
                   f"Only {share:.1f}% of device compute runs in 16-bit types on hardware with 16-bit "
                   "units: mixed precision halves memory traffic and uses tensor cores.")


def _small_batch(breakdown: StepBreakdown, hardware: Hardware,
                 peak_memory_fraction: float | None) -> Finding | None:
    if hardware.accelerator == "cpu" or breakdown.input_percent >= INPUT_BOUND_HIGH_PERCENT:
        return None  # on a CPU-only machine the trace cannot tell fixed per-step cost from compute
    device_percent = breakdown.percent("device_compute_seconds")
    if device_percent >= SMALL_BATCH_DEVICE_PERCENT:
        return None
    overhead = 100.0 - device_percent
    if peak_memory_fraction is not None and peak_memory_fraction >= MEMORY_FULL_FRACTION:
        return Finding(SMALL_BATCH, "high", overhead, "grad_accum",
                       f"The accelerator computes only {device_percent:.1f}% of each step and memory is "
                       f"{peak_memory_fraction:.0%} full: accumulating gradients over micro-batches gives "
                       "the effect of a larger batch without more memory.")
    return Finding(SMALL_BATCH, "high", overhead, "batch_size",
                   f"The accelerator computes only {device_percent:.1f}% of each step; the rest is fixed "
                   "per-step cost that a larger batch spreads over more examples.")


def _has_fast_16bit(hardware: Hardware) -> bool:
    if hardware.accelerator == "tpu":
        return True
    if hardware.accelerator == "gpu":
        return (hardware.min_compute_capability or (0, 0)) >= (7, 0)
    return hardware.cpu_supports_bf16
