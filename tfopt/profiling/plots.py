"""The report's two figures, drawn with matplotlib's object API (no pyplot, so no global state and no
display needed) and encoded as PNG for self-contained HTML.

- Step-time breakdown: one horizontal bar per run, stacked by where the time went.
- Utilization over time: per step, the compute-only ceiling divided by the step's time; below it,
  the hardware's own utilization (NVML on GPUs, this process's CPU use on the host).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

from tfopt.profiling.analyze import CATEGORY_LABELS
from tfopt.profiling.monitor import HOST

# One fixed color per category, so a category has the same color in every run and every report.
_CATEGORY_COLORS = dict(zip(CATEGORY_LABELS, ("#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd",
                                              "#8c564b", "#e377c2", "#7f7f7f")))
_RUN_COLORS = ("#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e")


def breakdown_figure(profiles: Mapping[str, Any]) -> Any:
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
    categories = [category for category in CATEGORY_LABELS
                  if any(profile.breakdown.categories[category] > 0 for profile in profiles.values())]
    left = [0.0] * len(names)
    for category in categories:
        widths = [profile.breakdown.categories[category] * 1000.0 for profile in profiles.values()]
        axes.barh(names, widths, left=left, label=CATEGORY_LABELS[category], color=_CATEGORY_COLORS[category],
                  height=0.55)
        left = [start + width for start, width in zip(left, widths)]
    for row, total in enumerate(left):
        axes.text(total, row, f"  {total:.1f} ms", va="center", fontsize=9)
    axes.set_xlim(0, max(left) * 1.25 if max(left) > 0 else 1)
    axes.invert_yaxis()  # the first run ("before") on top
    axes.set_xlabel("mean step time (ms)")
    axes.set_title("Where a training step's time goes")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45 if len(names) < 3 else -0.3),
                ncol=min(4, len(categories)), fontsize=8, frameon=False)
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def utilization_figure(profiles: Mapping[str, Any]) -> Any:
    """Utilization over each profiled run.

    Top: every measured step's share of the compute-only ceiling (ceiling median / step time, %), one
    line per run. Bottom: the hardware's readings, one line per run and GPU (NVML), or per run for the
    host's CPU use where no GPU was sampled.

    Args:
        profiles: Run name -> Profile.

    Returns:
        A matplotlib Figure with two axes.
    """
    figure = _figure(height=5.2)
    ceiling_axes, hardware_axes = figure.subplots(2, 1, sharex=True)
    gpu = any(profile.samples.accelerator_devices for profile in profiles.values())
    for index, (name, profile) in enumerate(profiles.items()):
        color = _RUN_COLORS[index % len(_RUN_COLORS)]
        ceiling = profile.measurement.ceiling.median_seconds
        times = profile.capture.step_end_seconds
        ratios = [100.0 * ceiling / seconds for seconds in profile.capture.step_times.seconds]
        ceiling_axes.plot(times, ratios, marker="o", markersize=3, color=color, label=name)
        devices = profile.samples.accelerator_devices if gpu else (HOST,)
        for device_index, device in enumerate(devices):
            readings = profile.samples.of(device)
            label = f"{name} {device}" if gpu else name
            hardware_axes.plot([sample.seconds for sample in readings],
                               [sample.utilization_percent for sample in readings],
                               color=color, linestyle=("-", "--", ":", "-.")[device_index % 4], label=label)
    ceiling_axes.axhline(100.0, color="black", linewidth=0.8, linestyle=":")
    ceiling_axes.set_ylabel("% of compute-only\nceiling")
    ceiling_axes.set_title("Utilization during the profiled run")
    ceiling_axes.set_ylim(bottom=0)
    hardware_axes.set_ylabel("GPU utilization %\n(NVML)" if gpu else "host CPU use %\n(this process)")
    hardware_axes.set_xlabel("seconds since the profiled run started")
    hardware_axes.set_ylim(0, 105)
    for axes in (ceiling_axes, hardware_axes):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    return figure


def png_base64(figure: Any) -> str:
    """The figure as a base64 PNG, for an `<img src="data:image/png;base64,...">`."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("Report figures need matplotlib: pip install tfopt[profile].") from error
    return Figure(figsize=(8.0, height))
