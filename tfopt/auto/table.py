"""The trials table: every configuration auto mode measured, and why each recipe was kept or rejected.

A plain value with `to_dict()` (JSON-safe, for the report's data), `to_markdown()` (for the Markdown
and HTML reports) and `to_text()` (for the terminal), so the report and the CLI embed it without knowing
how it was measured.
"""

from __future__ import annotations

import dataclasses
from typing import Any

STATUSES = ("baseline", "kept", "rejected", "failed", "not measured", "not run", "not tried")


@dataclasses.dataclass(frozen=True)
class TrialRow:
    """One configuration in the table.

    Attributes:
        configuration: Its label: "baseline", a candidate ("xla", "mixed_bfloat16") or a combination
            ("data_pipeline + mixed_bfloat16").
        role: "baseline", "alone" (one candidate), "combination" (greedy), or "candidate" (not tried).
        status: One of `STATUSES`.
        reason: One line with the numbers behind the status.
        examples_per_second: Throughput over the timed steps (examples / total time), where measured.
        spread_examples_per_second: The interquartile range of step times, in examples/s
            (throughput x IQR / median step).
        ratio: Examples/s relative to the baseline (the mean of its runs).
        step_seconds: The median step time.
        compile_seconds: First-step time beyond a steady step (tracing, XLA); None where the trial reused
            a model compiled earlier.
        loss_deviation: Largest relative step-by-step loss difference from the float32 baseline.
    """

    configuration: str
    role: str
    status: str
    reason: str
    examples_per_second: float | None = None
    spread_examples_per_second: float | None = None
    ratio: float | None = None
    step_seconds: float | None = None
    compile_seconds: float | None = None
    loss_deviation: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"TrialRow status {self.status!r} is not one of {', '.join(STATUSES)}.")


@dataclasses.dataclass(frozen=True)
class Decision:
    """The final word on one candidate recipe: kept or not, and why (e.g. "xla: rejected, 0.52x ...")."""

    candidate: str
    kept: bool
    reason: str

    def __str__(self) -> str:
        return f"{self.candidate}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class TrialsTable:
    """All trials of one tuning run, the configuration chosen, and the noise it was judged against.

    Attributes:
        rows: The configurations, in the order they ran (then those not run or not tried).
        decisions: One per candidate recipe.
        chosen: The candidate labels of the chosen configuration; () keeps the baseline.
        baseline_examples_per_second: The mean of the baseline's runs.
        noise_fraction: The speed difference noise alone can make (see `tfopt.auto.decide`).
        loss_tolerance: The largest accepted relative loss difference from float32.
        budget_seconds: The tuning time budget.
        elapsed_seconds: The time tuning took, diagnosis included.
        notes: Context lines: the diagnosis and hardware the candidates were chosen for.
    """

    rows: tuple[TrialRow, ...]
    decisions: tuple[Decision, ...]
    chosen: tuple[str, ...]
    baseline_examples_per_second: float
    noise_fraction: float
    loss_tolerance: float
    budget_seconds: float
    elapsed_seconds: float
    notes: tuple[str, ...] = ()

    @property
    def chosen_label(self) -> str:
        return " + ".join(self.chosen) or "baseline"

    @property
    def chosen_examples_per_second(self) -> float:
        """The chosen configuration's measured speed (the baseline's mean when nothing was kept)."""
        if not self.chosen:
            return self.baseline_examples_per_second
        return next(
            row.examples_per_second
            for row in self.rows
            if row.configuration == self.chosen_label and row.examples_per_second is not None
        )

    @property
    def best_row(self) -> TrialRow | None:
        """The fastest measured non-baseline configuration whose numerics passed (kept or not), if any.

        Compare it with `baseline_examples_per_second`, the mean of the baseline's runs: a single
        baseline run is not a configuration of its own.
        """
        rows = [
            row
            for row in self.rows
            if row.examples_per_second is not None
            and row.role != "baseline"
            and row.status != "failed"
            and (row.loss_deviation is None or row.loss_deviation <= self.loss_tolerance)
        ]
        return max(rows, key=lambda row: row.examples_per_second, default=None)

    @property
    def best_examples_per_second(self) -> float:
        """The fastest sound configuration's speed, the baseline (mean of its runs) included."""
        best = self.best_row
        return max(self.baseline_examples_per_second, best.examples_per_second if best else 0.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: every row, every decision, the choice and the numbers it was judged by."""
        return {
            "rows": [dataclasses.asdict(row) for row in self.rows],
            "decisions": [dataclasses.asdict(decision) for decision in self.decisions],
            "chosen": list(self.chosen),
            "chosen_label": self.chosen_label,
            "chosen_examples_per_second": self.chosen_examples_per_second,
            "baseline_examples_per_second": self.baseline_examples_per_second,
            "best_examples_per_second": self.best_examples_per_second,
            "noise_fraction": self.noise_fraction,
            "loss_tolerance": self.loss_tolerance,
            "budget_seconds": self.budget_seconds,
            "elapsed_seconds": self.elapsed_seconds,
            "notes": list(self.notes),
        }

    def to_markdown(self) -> str:
        """A Markdown table of the trials, then the decisions and the choice."""
        header = ["configuration", "examples/s", "vs baseline", "step ms", "compile s", "loss diff", "result"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in self._cells(row)) + " |" for row in self.rows]
        lines += ["", *self._footer()]
        return "\n".join(lines)

    def to_text(self) -> str:
        """The same table in aligned plain text, for a terminal."""
        header = ["configuration", "examples/s", "vs base", "step ms", "compile s", "loss diff", "result"]
        body = [self._cells(row) for row in self.rows]
        widths = [max(len(line[column]) for line in [header, *body]) for column in range(len(header) - 1)]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1]
            for line in [header, *body]
        ]
        return "\n".join([*lines, "", *self._footer()])

    def __str__(self) -> str:
        return self.to_text()

    def _cells(self, row: TrialRow) -> list[str]:
        speed = (
            ""
            if row.examples_per_second is None
            else (f"{row.examples_per_second:.1f} ± {row.spread_examples_per_second / 2:.1f}")
        )
        return [
            row.configuration,
            speed,
            _number(row.ratio, "{:.2f}x"),
            _number(row.step_seconds, "{:.1f}", 1e3),
            "shared"
            if row.compile_seconds is None and row.examples_per_second is not None
            else _number(row.compile_seconds, "{:.2f}"),
            _number(row.loss_deviation, "{:.2%}"),
            f"{row.status}: {_without_status(row)}",
        ]

    def _footer(self) -> list[str]:
        lines = [
            f"Chosen: {self.chosen_label} at {self.chosen_examples_per_second:.1f} examples/s "
            f"({self.chosen_examples_per_second / self.baseline_examples_per_second:.2f}x baseline). "
            f"Noise {self.noise_fraction:.0%}, loss tolerance {self.loss_tolerance:.0%}; tuning took "
            f"{self.elapsed_seconds:.0f} s of a {self.budget_seconds:.0f} s budget.",
            *(f"- {decision}" for decision in self.decisions),
        ]
        return lines + [f"Note: {note}" for note in self.notes]


def _number(value: float | None, template: str, scale: float = 1.0) -> str:
    return "" if value is None else template.format(value * scale)


def _without_status(row: TrialRow) -> str:
    prefix = f"{row.status}: "
    return row.reason[len(prefix) :] if row.reason.startswith(prefix) else row.reason
