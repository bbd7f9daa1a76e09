"""Before vs after, side by side: speed, accelerator busy %, MFU, input wait and input efficiency, where
step time goes, memory, what each recipe did, the diagnosis of both runs, and what an epoch costs.

One `Report` renders three ways from one dictionary, so the HTML (for people), the Markdown (for
READMEs and notebooks) and the JSON (for CI) always show the same numbers. Numbers are rounded once,
in `to_dict()` (4 significant digits, whole numbers kept whole), and every format prints them as they
are there. The text is written once too: `_blocks()` turns the dictionary into headings, paragraphs,
tables and charts, which `report_format` writes as Markdown or HTML.

Files are written atomically (a temporary file in the same directory, then `os.replace`), so a
report from an earlier run survives a failed or interrupted one.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tfopt._atomic import write_atomic
from tfopt.plan import Step
from tfopt.profiling.breakdown import CATEGORY_LABELS
from tfopt.profiling.metrics import CPU_NOTE, Metrics, compared, describe_rounds, headline_speedup
from tfopt.profiling.plots import (
    breakdown_figure,
    hotspots_figure,
    metrics_figure,
    training_figure,
    with_hardware,
)
from tfopt.profiling.report_format import (
    Arrow,
    Block,
    Bullets,
    Chart,
    Code,
    Emphasis,
    Footer,
    Heading,
    Paragraph,
    Strong,
    Table,
    Text,
    to_html,
    to_markdown,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfopt.hardware import Hardware
    from tfopt.plan import Plan
    from tfopt.profiling.breakdown import StepBreakdown
    from tfopt.profiling.diagnose import Diagnosis
    from tfopt.profiling.hotspots import Hotspots
    from tfopt.profiling.measurement import Measurement
    from tfopt.profiling.sampler import Samples
    from tfopt.profiling.timing import StepTimes

REPORT_VERSION = 1

# The summary table: (label, key in a run's dict), in display order.
SUMMARY_ROWS = (
    ("steps/s", "steps_per_second"),
    ("examples/s", "examples_per_second"),
    ("step time, median (ms)", "step_time_median_ms"),
    ("step time, spread IQR (ms)", "step_time_spread_ms"),
    ("accelerator busy (% of wall step)", "busy_percent"),
    ("MFU (% of peak FLOP/s at the precision below)", "mfu_percent"),
    ("precision of the matmuls (MFU's peak)", "precision"),
    ("waiting for input (% of wall step)", "input_wait_percent"),
    ("from tf.data service workers (MiB/s)", "service_mib_per_second"),
    ("input efficiency (% of on-device ceiling)", "input_efficiency_percent"),
    ("peak memory (MiB), {memory_measured}", "peak_memory_mib"),
    ("{hardware_utilization_measured}", "mean_hardware_utilization_percent"),
    ("steps/s under the profiler", "profiled_steps_per_second"),
    ("profiling overhead (%)", "profiling_overhead_percent"),
    ("{hours_unit} per epoch", "accelerator_hours_per_epoch"),
    ("cost per epoch ({currency})", "cost_per_epoch"),
)

# Rows that only some setups have (an offloaded pipeline): left out of a report where no run measured them.
SHOWN_WHEN_MEASURED = frozenset({"service_mib_per_second"})


@runtime_checkable
class ProfiledRun(Protocol):
    """The profiled run inside a profile (`tfopt.profiling.capture.Capture`): what a report reads of it."""

    @property
    def step_times(self) -> StepTimes: ...

    @property
    def peak_memory_bytes(self) -> int | None: ...


@runtime_checkable
class ReportedProfile(Protocol):
    """What a report reads from each run: `tfopt.profiling.capture.Profile` is one.

    A protocol, not that class, because `capture` imports this module (a Profile shows itself in a
    notebook as a one-run report): naming the class here would close an import cycle.
    """

    @property
    def measurement(self) -> Measurement: ...

    @property
    def capture(self) -> ProfiledRun: ...

    @property
    def breakdown(self) -> StepBreakdown: ...

    @property
    def diagnosis(self) -> Diagnosis: ...

    @property
    def hardware(self) -> Hardware: ...

    @property
    def steps_per_epoch(self) -> int | None: ...

    @property
    def served_bytes_per_batch(self) -> int | None: ...

    @property
    def samples(self) -> Samples: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def profiling_overhead(self) -> float: ...

    @property
    def logdir(self) -> Path: ...

    @property
    def hotspots(self) -> Hotspots | None: ...


@dataclasses.dataclass(frozen=True)
class Report:
    """Profiles of one or more runs, rendered side by side.

    Attributes:
        profiles: Run name -> Profile, in display order (usually "before", "after").
        applied: What each recipe did between the runs.
        price_per_hour: Price of one accelerator-hour (one machine-hour without accelerators), or None.
        currency: The price's currency, as printed.
        steps_per_epoch: Steps in an epoch for the cost line, of the first run's batch (a run at another batch
            takes as many examples); the first run's dataset length by default.
        created: When the report was made (UTC, ISO 8601).
        training: The `tfopt.Monitor` window records of the training that followed the measurements
            (`tfopt-recipe run` adds them once it has trained), plotted and summed up in their own section.
        speedup_rounds: The speedup of each round where the runs were measured side by side (`tfopt.apply`
            alternates before and after), whose range is the speedup's noise; empty where they were not.

    Example:
        >>> before, after = tfopt.profile(model, slow), tfopt.profile(model, fast)  # doctest: +SKIP
        >>> report = tfopt.compare(before, after)  # doctest: +SKIP
        >>> report.save("report.html")  # doctest: +SKIP
    """

    profiles: Mapping[str, ReportedProfile]
    applied: tuple[Step, ...] = ()
    price_per_hour: float | None = None
    currency: str = "USD"
    steps_per_epoch: int | None = None
    created: str = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    )
    training: tuple[Mapping[str, Any], ...] = ()
    speedup_rounds: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Every number in the report, rounded to 4 significant digits (the JSON format)."""
        runs = {name: _run_dict(profile, self) for name, profile in self.profiles.items()}
        first = next(iter(self.profiles.values()))
        names = list(runs)
        # Examples per second, as the side-by-side rounds are measured: a batch_size recipe changes what a step is.
        speedup = (
            _round(
                headline_speedup(
                    runs[names[0]]["examples_per_second"], runs[names[-1]]["examples_per_second"], self.speedup_rounds
                )
            )
            if len(names) > 1
            else None
        )
        return {
            "tfopt_report_version": REPORT_VERSION,
            "created": self.created,
            "hardware": first.hardware.describe(),
            "note": CPU_NOTE if first.hardware.accelerator == "cpu" else None,
            "speedup": speedup,
            "speedup_rounds": [_round(ratio) for ratio in self.speedup_rounds],
            "speedup_noise": describe_rounds(self.speedup_rounds).lstrip(" ,") if self.speedup_rounds else None,
            "steps_per_epoch": self._steps_per_epoch(),
            "price_per_hour": self.price_per_hour,
            "currency": self.currency,
            "applied": [dataclasses.asdict(step) for step in self.applied],
            "hours_unit": self._hours_unit(),
            "runs": runs,
            "training": _training_dict(self.training),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def figures(self) -> dict[str, Figure]:
        """The report's matplotlib figures: "breakdown", "metrics", "hotspots" where a run has its stage or layer
        table (each with the hardware written under it), and "training" once there are windows."""
        figures = {"breakdown": breakdown_figure(self.profiles), "metrics": metrics_figure(self.profiles)}
        hotspots = hotspots_figure(self.profiles)
        if hotspots is not None:
            figures["hotspots"] = hotspots
        hardware = next(iter(self.profiles.values())).hardware.describe()
        figures = {name: with_hardware(figure, hardware) for name, figure in figures.items()}
        if self.training:  # as `add_training` draws it into a report saved before the training
            figures["training"] = training_figure(self.training)
        return figures

    def to_markdown(self) -> str:
        """The report as Markdown (charts left out)."""
        return to_markdown(_blocks(self.to_dict()))

    def to_html(self) -> str:
        """One self-contained HTML page: inline CSS, figures embedded as base64 PNG, no scripts."""
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>tfopt report</title>'
            f"<style>{_CSS}</style></head><body>\n{self._html_fragment()}\n</body></html>"
        )

    def _repr_html_(self) -> str:
        # Notebooks embed this in their own page: a fragment whose styles apply only inside it.
        return f"<style>{_CSS}</style>\n{self._html_fragment()}"

    def _html_fragment(self) -> str:
        return f'<div class="tfopt-report">\n{to_html(_blocks(self.to_dict()), self.figures())}\n</div>'

    def save(self, path: str | Path) -> Path:
        """Writes the report as HTML (.html), Markdown (.md) or JSON (.json), chosen by the suffix.

        The whole file is rendered first and then moved into place, so an existing report at `path` is
        either replaced whole or left as it was.

        Raises:
            ValueError: The suffix is none of those.
        """
        path = Path(path)
        write_atomic(path, self.render(path))
        return path

    def render(self, path: str | Path) -> str:
        """The text `save(path)` writes, in the format the suffix names.

        Raises:
            ValueError: The suffix is none of .html, .htm, .md, .markdown, .json.
        """
        renderers = {
            ".html": self.to_html,
            ".htm": self.to_html,
            ".md": self.to_markdown,
            ".markdown": self.to_markdown,
            ".json": self.to_json,
        }
        suffix = Path(path).suffix.lower()
        if suffix not in renderers:
            raise ValueError(
                f"Report.save: cannot tell the format of {Path(path).name!r}. Expected a name ending "
                f"in one of {', '.join(renderers)}."
            )
        return renderers[suffix]()

    def _steps_per_epoch(self) -> int | None:
        if self.steps_per_epoch is not None:
            return self.steps_per_epoch
        return next(iter(self.profiles.values())).steps_per_epoch

    def _hours_unit(self) -> str:
        """GPUs and TPUs are priced per device-hour; without them, the machine is what is paid for."""
        return (
            "accelerator-hours" if next(iter(self.profiles.values())).hardware.accelerator != "cpu" else "machine-hours"
        )


def compare(
    before: ReportedProfile,
    after: ReportedProfile | None,
    *,
    applied: Iterable[Step | str] | Plan = (),
    price_per_hour: float | None = None,
    currency: str = "USD",
    steps_per_epoch: int | None = None,
    speedup_rounds: Iterable[float] = (),
) -> Report:
    """Puts two profiles side by side.

    Args:
        before: The Profile of the original setup.
        after: The Profile after the recipes, or None for a one-run report.
        applied: What the recipes did: `Plan.applied`, a Plan, or recipe names.
        price_per_hour: Price of one accelerator-hour, for the cost line.
        currency: The price's currency.
        steps_per_epoch: Steps per epoch for the cost line; the dataset's length by default.
        speedup_rounds: The speedup of each round where before and after were measured side by side.

    Returns:
        The Report (save it with `.save("report.html")`; notebooks display it directly).

    Raises:
        TypeError: before or after is not a Profile.
        ValueError: price_per_hour or steps_per_epoch is negative or not finite.

    Example:
        >>> report = tfopt.compare(before, after, applied=result.plan.applied, price_per_hour=2.5)  # doctest: +SKIP
        >>> report.save("report.html")  # doctest: +SKIP
    """
    for name, profile in (("before", before), ("after", after)):
        if not isinstance(profile, ReportedProfile) and not (name == "after" and profile is None):
            raise TypeError(
                f"compare: {name} is a {type(profile).__name__}, not a Profile: pass what tfopt.profile() returns "
                "(or result.before_profile / result.after_profile of tfopt.apply(..., profile=True))."
            )
    if price_per_hour is not None and not (math.isfinite(price_per_hour) and price_per_hour >= 0):
        raise ValueError(f"compare: price_per_hour must be a finite number >= 0; received {price_per_hour!r}.")
    if steps_per_epoch is not None and steps_per_epoch < 1:
        raise ValueError(f"compare: steps_per_epoch must be >= 1; received {steps_per_epoch!r}.")
    applied = getattr(applied, "applied", applied)
    steps = tuple(step if isinstance(step, Step) else Step(str(step), "") for step in applied)
    profiles = {"before": before, "after": after} if after is not None else {"profile": before}
    return Report(
        profiles=profiles,
        applied=steps,
        price_per_hour=price_per_hour,
        currency=currency,
        steps_per_epoch=steps_per_epoch,
        speedup_rounds=tuple(speedup_rounds),
    )


def _blocks(data: dict[str, Any]) -> list[Block]:
    """What the report says, in order, from its numbers (`Report.to_dict()`): what both formats write."""
    runs = data["runs"]
    names = list(runs)
    blocks: list[Block] = [Heading("tfopt report", level=1), Paragraph(data["hardware"])]
    if data["note"]:
        blocks.append(Paragraph((Emphasis(f"{data['note']}."),)))
    if data["speedup"] is not None:
        speedup = f"Speedup: {_show(data['speedup'])}x"
        blocks.append(
            Paragraph((Strong(speedup), f" examples/s ({names[-1]} vs {names[0]}{_noise(data)})."), lead=True)
        )
    headline = _headline(data)
    if headline:
        blocks.append(Paragraph((Strong(headline),), lead=True))
    blocks += [Table(("", *names), _summary_rows(data), id="summary"), Chart("breakdown"), Chart("metrics")]
    # plots.hotspots_figure draws one where any run has hotspots, even with no rows to tabulate.
    if any(run["diagnosis"]["hotspots"] is not None for run in runs.values()):
        blocks.append(Chart("hotspots"))
    breakdown = tuple(
        (label, *(_show(run["breakdown_ms"][category]) for run in runs.values()))
        for category, label in CATEGORY_LABELS.items()
    )
    blocks += [
        Heading("Step-time breakdown (ms per step)"),
        Table(("", *names), breakdown, id="breakdown"),
        Heading("Recipes: applied and left out"),
        Bullets(tuple(_step_text(step) for step in data["applied"]) or ("none",)),
    ]
    for name, run in runs.items():
        blocks += [Heading(f"Diagnosis: {name}"), Bullets(_diagnosis_items(run["diagnosis"]))]
    for name, run in runs.items():
        blocks += _hotspot_blocks(name, run["diagnosis"]["hotspots"])
    blocks += _training_blocks(data["training"])
    traces = tuple((f"{name}: ", Code(f"tensorboard --logdir {run['logdir']}")) for name, run in runs.items())
    return [
        *blocks,
        Heading(COST_TITLE),
        Paragraph(_cost_text(data)),
        Heading("Profiling overhead"),
        Paragraph(_overhead_text(data)),
        Heading("Traces"),
        Bullets(traces),
        Footer(f"tfopt report v{data['tfopt_report_version']}, {data['created']}"),
    ]


def _diagnosis_items(diagnosis: Mapping[str, Any]) -> tuple[Text, ...]:
    """One run's findings (or, without any, its summary) and notes."""
    findings = tuple(
        (
            Strong(finding["bottleneck"]),
            f" ({finding['severity']}, {_show(finding['percent'])}%) ",
            Arrow(),
            " ",
            Code(finding["recipe"]),
            f": {finding['reason']}",
        )
        for finding in diagnosis["findings"]
    )
    return (findings or (diagnosis["summary"],)) + tuple(f"note: {note}" for note in diagnosis["notes"])


def _cost_text(data: dict[str, Any]) -> str:
    steps, unit, currency = data["steps_per_epoch"], data["hours_unit"], data["currency"]
    if steps is None:
        return (
            "The dataset's length is unknown (infinite or not countable by tf.data): pass "
            "steps_per_epoch= to compare() for a cost per epoch."
        )
    runs = "; ".join(
        f"{name}: {_show(run['accelerator_hours_per_epoch'])} {unit}"
        + (f" = {_show(run['cost_per_epoch'])} {currency}" if run["cost_per_epoch"] is not None else "")
        for name, run in data["runs"].items()
    )
    price = (
        f" at {_show(data['price_per_hour'])} {currency} per hour"
        if data["price_per_hour"] is not None
        else " (pass price_per_hour= to compare() for money)"
    )
    return f"Per epoch ({steps} steps of the {next(iter(data['runs']))} run's batch){price}: {runs}."


def _noise(data: Mapping[str, Any]) -> str:
    """ "; range over N rounds measured side by side: ..." where the runs were, else nothing."""
    if not data.get("speedup_rounds"):
        return ""
    noise = data["speedup_noise"]  # fewer than 3 rounds say their count themselves ("2 rounds side by side: ...")
    return f"; {noise}" if "side by side" in noise else f"; {len(data['speedup_rounds'])} rounds side by side: {noise}"


def _training_dict(windows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The training windows' series (rounded) and their medians; None before training."""
    if not windows:
        return None
    keys = [
        key
        for key in (
            "steps_per_second",
            "examples_per_second",
            "input_wait_percent",
            "mfu_percent",
            "device_memory_peak_bytes",
        )
        if all(key in window for window in windows)
    ]
    return {
        "windows": [{"step": window["step"], **{key: _round(window[key]) for key in keys}} for window in windows],
        "median": {key: _round(statistics.median(window[key] for window in windows)) for key in keys},
    }


TRAINING_TITLE = "Training (tfopt.Monitor)"
# The section the Training section goes before, in reports saved earlier too (`add_training`).
COST_TITLE = "Cost"


def _training_blocks(training: dict[str, Any] | None) -> list[Block]:
    """The Training section with its chart; none before training."""
    if not training:
        return []
    return [Heading(TRAINING_TITLE), Paragraph(_training_text(training)), Chart("training")]


def add_training(paths: Sequence[str | Path], windows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Puts the Training section into reports already saved, in place of any earlier one: what a resumed
    run does, whose measurements were saved by the attempt that was killed (this process holds no
    `Report` of them). Each file is rewritten atomically; returns the JSON report's numbers, or None where
    the report has no JSON file.

    Raises:
        ValueError: A file is not a tfopt report (no Cost section to put the Training section before).
    """
    training = _training_dict(windows)
    blocks = _training_blocks(training)
    data = None
    for path in map(Path, paths):
        text = path.read_text(encoding="utf-8")
        suffix = path.suffix.lower()
        if suffix == ".json":
            data = {**json.loads(text), "training": training}
            text = json.dumps(data, indent=2)
        elif suffix in (".md", ".markdown"):
            section = to_markdown(blocks) + "\n" if blocks else ""
            text = _with_section(
                text, to_markdown([Heading(TRAINING_TITLE)]), to_markdown([Heading(COST_TITLE)]), section
            )
        else:
            figures = {"training": training_figure(windows)} if blocks else {}
            section = to_html(blocks, figures) + "\n" if blocks else ""
            text = _with_section(text, to_html([Heading(TRAINING_TITLE)]), to_html([Heading(COST_TITLE)]), section)
        write_atomic(path, text)
    return data


def _with_section(text: str, heading: str, following: str, section: str) -> str:
    """`text` with `section` just before the heading `following`, in place of the section that starts at
    `heading` if there is one."""
    end = text.find(following)
    if end < 0:
        raise ValueError(f"not a tfopt report: no {following.strip()!r} heading")
    start = text.find(heading)
    return text[: start if 0 <= start < end else end] + section + text[end:]


def _training_text(training: dict[str, Any]) -> str:
    windows, median = training["windows"], training["median"]
    parts = [f"{len(windows)} windows to step {windows[-1]['step']}"]
    if "examples_per_second" in median:
        low = min(window["examples_per_second"] for window in windows)
        parts.append(f"median {_show(median['examples_per_second'])} examples/s (slowest window {_show(low)})")
    if "input_wait_percent" in median:
        worst = max(window["input_wait_percent"] for window in windows)
        parts.append(f"input wait median {_show(median['input_wait_percent'])}% (worst window {_show(worst)}%)")
    if "mfu_percent" in median:
        parts.append(f"MFU median {_show(median['mfu_percent'])}%")
    return "; ".join(parts) + ". Every window, with alerts: monitor.jsonl beside the TensorBoard scalars."


def _headline(data: dict[str, Any]) -> str | None:
    """On accelerators, what the accelerator did in each run (busy %, MFU, input wait, input efficiency):
    the headline there, above the table; None on a CPU, where those figures do not apply."""
    runs = [Metrics.from_dict(run) for run in data["runs"].values()]
    if runs[0].accelerator == "cpu":
        return None
    line = compared(runs[0], runs[-1]) if len(runs) > 1 else runs[0].headline()
    return line[:1].upper() + line[1:]


def _summary_rows(data: dict[str, Any]) -> tuple[tuple[str, ...], ...]:
    """The summary table's rows, labels filled in from what was measured (GPU or host, currency)."""
    first = next(iter(data["runs"].values()))
    context = {
        "memory_measured": first["memory_measured"],
        "currency": data["currency"],
        "hardware_utilization_measured": first["hardware_utilization_measured"],
        "hours_unit": data["hours_unit"],
    }
    runs = list(data["runs"].values())
    return tuple(
        (label.format(**context), *(_show(run.get(key)) for run in runs))
        for label, key in SUMMARY_ROWS
        if key not in SHOWN_WHEN_MEASURED or any(run.get(key) is not None for run in runs)
    )


def _run_dict(profile: ReportedProfile, report: Report) -> dict[str, Any]:
    real, breakdown, samples = profile.measurement.real, profile.breakdown, profile.samples
    steps = report._steps_per_epoch()
    devices = max(len(profile.hardware.gpus), profile.hardware.tpu_cores, 1)
    # An epoch is the first run's steps of its batch: a run at another batch takes other steps over its examples.
    first = next(iter(report.profiles.values())).measurement.real
    examples = steps * first.examples_per_second / first.steps_per_second if steps is not None else None
    hours = examples / real.examples_per_second / 3600.0 * devices if examples is not None else None
    peak = profile.capture.peak_memory_bytes
    utilization = samples.mean_utilization_percent()
    metrics = {
        name: _round(value) if isinstance(value, float) else value for name, value in profile.metrics.to_dict().items()
    }
    on_gpu = profile.hardware.accelerator == "gpu"
    return {
        "steps_per_second": _round(real.steps_per_second),
        "examples_per_second": _round(real.examples_per_second),
        "service_mib_per_second": (
            _round(profile.served_bytes_per_batch * real.steps_per_second / 2**20)
            if profile.served_bytes_per_batch is not None
            else None
        ),
        "step_time_median_ms": _round(real.median_seconds * 1000.0),
        "step_time_spread_ms": _round(real.spread_seconds * 1000.0),
        **metrics,
        "precision": profile.measurement.precision,
        "ceiling_steps_per_second": _round(profile.measurement.ceiling.steps_per_second),
        "peak_memory_mib": _round(peak / 2**20) if peak is not None else None,
        "memory_measured": "GPU allocator peak (TensorFlow)" if on_gpu else "peak RSS of this process",
        "mean_hardware_utilization_percent": _round(utilization) if utilization is not None else None,
        "hardware_utilization_measured": (
            "NVML utilization (%): the driver's coarse 'a kernel was running' sample"
            if samples.accelerator_devices
            else "host CPU use of this process (%)"
        ),
        "profiled_steps_per_second": _round(profile.capture.step_times.steps_per_second),
        "profiling_overhead_percent": _round(100.0 * profile.profiling_overhead),
        "accelerator_hours_per_epoch": _round(hours) if hours is not None else None,
        "cost_per_epoch": (
            _round(hours * report.price_per_hour) if hours is not None and report.price_per_hour is not None else None
        ),
        "breakdown_source": breakdown.source,
        "breakdown_ms": {name: _round(seconds * 1000.0) for name, seconds in breakdown.categories.items()},
        "step_time_mean_ms": _round(breakdown.step_seconds_mean * 1000.0),
        "compute_16bit_percent": (
            _round(breakdown.compute_16bit_percent) if breakdown.compute_16bit_percent is not None else None
        ),
        "diagnosis": _rounded_diagnosis(profile.diagnosis.to_dict()),
        "logdir": str(profile.logdir),
    }


# Rows of each table shown in the report; the JSON keeps all.
HOTSPOT_ROWS = 8


def _hotspot_blocks(name: str, hotspots: Mapping[str, Any] | None) -> list[Block]:
    """The "where the time goes" sections of run `name`: a heading, a table and the fix line for its input
    pipeline and for its model, each where measured."""
    blocks: list[Block] = []
    stages = (hotspots or {}).get("stages")
    if stages:
        rows = tuple(
            (
                stage["label"],
                _ms(stage["seconds_per_element"]),
                _ms(stage["work_per_batch_seconds"]),
                f"{100 * stage['share']:.0f}%",
                _show(stage["parallelism"]) + (" (autotuned)" if stage["autotuned"] else ""),
                _show(stage["buffer"]),
                _ms(stage["bound_seconds_per_batch"]),
            )
            for stage in stages["stages"]
            if stage["work_seconds"] > 0
        )[:HOTSPOT_ROWS]
        header = (
            "stage",
            "ms per element",
            "work ms per batch",
            "share of work",
            "parallelism",
            "buffer",
            "least ms per batch",
        )
        blocks += [
            Heading(f"Input pipeline, stage by stage: {name}"),
            Table(header, rows, id=f"input-pipeline-{name}"),
            Paragraph(f"Bottleneck: {stages['bottleneck'] or 'none'}. {stages['fix']}"),
        ]
    layers = (hotspots or {}).get("layers")
    if layers and layers["layers"]:
        rows = tuple(
            (
                layer["layer"] + (f" (mostly {layer['heaviest_sublayer']})" if layer["heaviest_sublayer"] else ""),
                _ms(layer["seconds_per_step"]),
                f"{100 * layer['share_of_device']:.0f}%",
                f"{100 * layer['share_of_step']:.0f}%" if layer["share_of_step"] is not None else "n/a",
                ", ".join(op for op, _ in layer["op_types"]),
                f"{layer['intensity']:.1f}" if layer["intensity"] is not None else "n/a",
                layer["bound"] or "n/a",
                layer["recipe"] or "-",
            )
            for layer in layers["layers"][:HOTSPOT_ROWS]
        )
        top = next((layer for layer in layers["layers"] if layer["layer"] == layers["top"]), None)
        ridge = f" Ridge point: {layers['ridge_point']:.0f} FLOPs/byte." if layers["ridge_point"] else ""
        header = (
            "layer",
            "ms per step",
            f"share of {layers['device']} time",
            "share of step",
            "heaviest op types",
            "FLOPs/byte",
            "bound",
            "recipe",
        )
        fix = (f"Heaviest layer: {top['layer']}: {top['fix']}" if top else "No Keras layer found.") + ridge
        blocks += [
            Heading(f"Model, layer by layer: {name}"),
            Table(header, rows, id=f"model-{name}"),
            Paragraph(fix),
        ]
    return blocks


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3g}"


def _rounded_diagnosis(diagnosis: dict[str, Any]) -> dict[str, Any]:
    findings = [{**finding, "percent": _round(finding["percent"])} for finding in diagnosis["findings"]]
    return {**diagnosis, "input_percent": _round(diagnosis["input_percent"]), "findings": findings}


def _round(value: float) -> float:
    """4 significant digits, and every digit before the point (16384 MiB stays 16384): what the reports
    print, and exactly what the JSON holds."""
    if not math.isfinite(value) or value == 0:
        return value
    integer_digits = math.floor(math.log10(abs(value))) + 1
    return float(f"{value:.{max(4, integer_digits)}g}")


def _show(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def _step_text(step: Mapping[str, Any]) -> str:
    return f"{step['recipe']}: {'skipped: ' if step['skipped'] else ''}{step['detail']}".rstrip(": ")


def _overhead_text(data: dict[str, Any]) -> str:
    runs = "; ".join(_overhead_of(name, run) for name, run in data["runs"].items())
    return f"{runs}. Speeds above are measured without the profiler; the breakdown comes from the profiled run."


def _overhead_of(name: str, run: dict[str, Any]) -> str:
    """One run's profiler overhead in words: a run faster under the profiler (separate runs, minutes apart) says
    the machine's load changed, as no profiler speeds a step up."""
    overhead = run["profiling_overhead_percent"]
    spread = _show(_round(100 * run["step_time_spread_ms"] / run["step_time_median_ms"]))
    faster = overhead < 0
    return (
        f"{name}: {_show(run['profiled_steps_per_second'])} steps/s with the profiler vs "
        f"{_show(run['steps_per_second'])} without ({_show(abs(overhead))}% {'faster' if faster else 'slower'}; step "
        f"times spread by {spread}% (IQR / median), so smaller differences are noise"
        + ("; faster under the profiler is the machine's load changing between the two runs" if faster else "")
        + ")"
    )


_CSS = """
.tfopt-report { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
                color: #222; }
.tfopt-report table { border-collapse: collapse; margin: 1rem 0; }
.tfopt-report th, .tfopt-report td { border: 1px solid #ccc; padding: 0.3rem 0.7rem; text-align: right; }
.tfopt-report th:first-child { text-align: left; font-weight: normal; }
.tfopt-report thead th { background: #f3f3f3; font-weight: bold; }
.tfopt-report figure { margin: 1rem 0; } .tfopt-report img { max-width: 100%; }
.tfopt-report .speedup { font-size: 1.3rem; } .tfopt-report code { background: #f3f3f3; padding: 0 0.2rem; }
.tfopt-report footer { margin-top: 2rem; color: #777; font-size: 0.8rem; }
"""
