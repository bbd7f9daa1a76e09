"""The report's figures, drawn with matplotlib's object API (no pyplot, so no global state and no
display needed) and encoded as PNG for self-contained HTML.

- Step-time breakdown: one horizontal bar per run, stacked by where the wall step's time went.
- Metrics: accelerator busy %, MFU, input wait and input efficiency per run, side by side; below them,
  the hardware's own readings over time (NVML's coarse "a kernel was running" sample on GPUs, this
  process's CPU use on the host).
- Hotspots: per run, a bar per input-pipeline stage and per layer (`hotspots.py`).
- Training: the `tfopt.Monitor` windows of the training that followed, over the steps: examples/s, and
  input wait % and MFU % where measured, so a run that degraded after an hour shows where.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tfopt.profiling.alerts import INPUT_BOUND_HIGH_PERCENT
from tfopt.profiling.breakdown import CATEGORY_LABELS
from tfopt.profiling.sampler import HOST

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# One fixed color per category, so a category has the same color in every run and every report.
_CATEGORY_COLORS = dict(
    zip(CATEGORY_LABELS, ("#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"))
)
_RUN_COLORS = ("#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e")


def breakdown_figure(profiles: Mapping[str, Any]) -> Figure:
    """A stacked bar per run: the mean step's milliseconds by category (categories that are 0 everywhere
    are left out).

    Args:
        profiles: Run name ("before", "after") -> Profile.

    Returns:
        A matplotlib Figure.
    """
    figure = _figure(height=1.4 + 0.7 * len(profiles))
    axes = figure.add_subplot()
    names = list(profiles)
    categories = [
        category
        for category in CATEGORY_LABELS
        if any(profile.breakdown.categories[category] > 0 for profile in profiles.values())
    ]
    left = [0.0] * len(names)
    for category in categories:
        widths = [profile.breakdown.categories[category] * 1000.0 for profile in profiles.values()]
        axes.barh(
            names, widths, left=left, label=CATEGORY_LABELS[category], color=_CATEGORY_COLORS[category], height=0.55
        )
        left = [start + width for start, width in zip(left, widths)]
    for row, total in enumerate(left):
        axes.text(total, row, f"  {total:.1f} ms", va="center", fontsize=9)
    axes.set_xlim(0, max(left) * 1.25 if max(left) > 0 else 1)
    axes.invert_yaxis()  # the first run ("before") on top
    axes.set_xlabel("mean step time (ms)")
    axes.set_title("Where a training step's time goes")
    axes.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.45 if len(names) < 3 else -0.3),
        ncol=min(4, len(categories)),
        fontsize=8,
        frameon=False,
    )
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def metrics_figure(profiles: Mapping[str, Any]) -> Figure:
    """The runs' metrics as grouped bars, and the hardware's readings during the profiled runs.

    Metrics a run did not measure (busy % and MFU on a CPU-only machine) are left out of the bars.

    Args:
        profiles: Run name -> Profile.

    Returns:
        A matplotlib Figure with two axes.
    """
    figure = _figure(height=5.6)
    metric_axes, hardware_axes = figure.subplots(2, 1)
    runs = {name: profile.metrics.to_dict() for name, profile in profiles.items()}
    shown = [name for name in _METRIC_LABELS if any(run[name] is not None for run in runs.values())]
    width = 0.8 / max(1, len(runs))
    for index, (name, run) in enumerate(runs.items()):
        positions = [position + index * width for position in range(len(shown))]
        values = [run[metric] or 0.0 for metric in shown]
        bars = metric_axes.bar(positions, values, width=width, color=_RUN_COLORS[index % len(_RUN_COLORS)], label=name)
        metric_axes.bar_label(
            bars,
            labels=[f"{value:.0f}%" if run[metric] is not None else "n/a" for value, metric in zip(values, shown)],
            fontsize=8,
        )
    metric_axes.set_xticks(
        [position + width * (len(runs) - 1) / 2 for position in range(len(shown))],
        [_METRIC_LABELS[name] for name in shown],
    )
    metric_axes.set_ylim(0, 115)
    metric_axes.set_ylabel("%")
    metric_axes.set_title("What the hardware did")
    gpu = any(profile.samples.accelerator_devices for profile in profiles.values())
    for index, (name, profile) in enumerate(profiles.items()):
        devices = profile.samples.accelerator_devices if gpu else (HOST,)
        for device_index, device in enumerate(devices):
            readings = profile.samples.of(device)
            hardware_axes.plot(
                [sample.seconds for sample in readings],
                [sample.utilization_percent for sample in readings],
                color=_RUN_COLORS[index % len(_RUN_COLORS)],
                linestyle=("-", "--", ":", "-.")[device_index % 4],
                label=f"{name} {device}" if gpu else name,
            )
    hardware_axes.set_ylabel("NVML sample %\n(a kernel ran)" if gpu else "host CPU use %\n(this process)")
    hardware_axes.set_xlabel("seconds since the profiled run started")
    hardware_axes.set_ylim(0, 105)
    for axes in (metric_axes, hardware_axes):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    return figure


def hotspots_figure(profiles: Mapping[str, Any], *, rows: int = 5) -> Any | None:
    """Where the time goes inside the step, per run: a bar per input stage (its least time per batch at
    its parallelism) and a bar per layer (its device time per step), the heaviest `rows` of each.

    Returns:
        A matplotlib Figure with two axes, or None where no run has either table.
    """
    tables = {name: profile.hotspots for name, profile in profiles.items() if profile.hotspots is not None}
    if not tables:
        return None
    figure = _figure(height=2.2 + 0.45 * rows * len(tables))
    stage_axes, layer_axes = figure.subplots(2, 1)
    for axes, title, unit, bars in (
        (
            stage_axes,
            "Input pipeline: least time per batch by stage",
            "ms per batch",
            lambda hotspots: (
                [
                    (stage.label, stage.bound_seconds_per_batch)
                    for stage in hotspots.stages.stages
                    if stage.work_seconds > 0
                ][:rows]
                if hotspots.stages
                else []
            ),
        ),
        (
            layer_axes,
            "Model: device time per step by layer",
            "ms per step",
            lambda hotspots: (
                [(layer.layer, layer.seconds_per_step) for layer in hotspots.layers.layers][:rows]
                if hotspots.layers
                else []
            ),
        ),
    ):
        labels, values, colors = [], [], []
        for index, (name, hotspots) in enumerate(tables.items()):
            for label, seconds in bars(hotspots):
                labels.append(f"{name}: {label}"[:60])
                values.append(seconds * 1000.0)
                colors.append(_RUN_COLORS[index % len(_RUN_COLORS)])
        positions = range(len(labels))
        axes.barh(positions, values, color=colors, height=0.6)
        axes.set_yticks(positions, labels, fontsize=8)
        axes.invert_yaxis()
        axes.set_xlabel(unit)
        axes.set_title(title)
        axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def training_figure(windows: Sequence[Mapping[str, Any]]) -> Figure:
    """The Monitor's windows over the training steps: throughput above, input wait and MFU below.

    The lower axes, and the input-wait alert's threshold on them, are drawn only for what was measured
    (no input wait under `steps_per_execution > 1`, no MFU on a CPU).

    Args:
        windows: `tfopt.Monitor` window records (`kind == "window"`), in order.

    Returns:
        A matplotlib Figure with one or two axes.
    """
    percents = [
        (key, label)
        for key, label in (("input_wait_percent", "input wait %"), ("mfu_percent", "MFU %"))
        if any(key in window for window in windows)
    ]
    figure = _figure(height=4.6 if percents else 2.6)
    speed_axes, percent_axes = figure.subplots(2, 1, sharex=True) if percents else (figure.add_subplot(), None)
    steps = [window["step"] for window in windows]
    throughput = (
        "examples_per_second" if all("examples_per_second" in window for window in windows) else "steps_per_second"
    )
    speed_axes.plot(steps, [window[throughput] for window in windows], marker=".", color=_RUN_COLORS[1])
    speed_axes.set_ylabel(throughput.replace("_per_second", "/s"))
    speed_axes.set_ylim(bottom=0)
    speed_axes.set_title("Training, window by window (tfopt.Monitor)")
    speed_axes.grid(alpha=0.3)
    (percent_axes or speed_axes).set_xlabel("training step (window end)")
    if percent_axes is not None:
        for index, (key, label) in enumerate(percents):
            percent_axes.plot(
                [window["step"] for window in windows if key in window],
                [window[key] for window in windows if key in window],
                marker=".",
                color=_RUN_COLORS[2 + index],
                label=label,
            )
            if key == "input_wait_percent":
                percent_axes.axhline(
                    INPUT_BOUND_HIGH_PERCENT,
                    color="#d62728",
                    linewidth=0.8,
                    linestyle=":",
                    label=f"input-wait alert ({INPUT_BOUND_HIGH_PERCENT:.0f}%)",
                )
        percent_axes.set_ylabel("%")
        percent_axes.set_ylim(0, 105)
        percent_axes.grid(alpha=0.3)
        percent_axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    return figure


_METRIC_LABELS = {
    "busy_percent": "accelerator busy",
    "mfu_percent": "MFU",
    "input_wait_percent": "input wait",
    "input_efficiency_percent": "input efficiency",
}


def with_hardware(figure: Figure, hardware: str) -> Figure:
    """The figure with the hardware its numbers were measured on written under it, so that an exported
    picture still says where it comes from."""
    figure.text(0.995, 0.0, hardware, ha="right", va="bottom", fontsize=7, color="#555555")
    return figure


def png_base64(figure: Any) -> str:
    """The figure as a base64 PNG, for an `<img src="data:image/png;base64,...">`."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(height: float) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            "Report figures need matplotlib: install tfopt's profile extra "
            '(pip install -e ".[profile]" in a clone) or pip install matplotlib.'
        ) from error
    return Figure(figsize=(8.0, height))
