"""Auto mode: measure each candidate recipe on the user's own hardware and keep only what helps.

    >>> tuning = tfopt.auto.tune(plan, budget_seconds=120)   # doctest: +SKIP
    >>> print(tuning.table.to_markdown())                     # doctest: +SKIP

`tfopt.apply(model, dataset, recipes="auto")` runs it and applies what it chose.

Modules: `candidates` (what to try, from the diagnosis and hardware), `trials` (one timed trial),
`decide` (noise and verdicts, pure), `search` (order, greedy combination, budget), `table` (the trials
table), `tune` (all of it together).
"""

from tfopt.auto.candidates import Candidates, choose_candidates
from tfopt.auto.decide import LOSS_TOLERANCE, NOISE_FLOOR_FRACTION, TrialResult, Verdict, judge, noise_fraction
from tfopt.auto.search import ProgressEvent, search
from tfopt.auto.table import Decision, TrialRow, TrialsTable
from tfopt.auto.tune import DEFAULT_BUDGET_SECONDS, Tuning, tune

__all__ = [
    "DEFAULT_BUDGET_SECONDS", "LOSS_TOLERANCE", "NOISE_FLOOR_FRACTION", "Candidates", "Decision", "ProgressEvent",
    "TrialResult", "TrialRow", "TrialsTable", "Tuning", "Verdict", "choose_candidates", "judge", "noise_fraction",
    "search", "tune",
]
