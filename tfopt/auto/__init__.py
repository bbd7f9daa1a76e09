"""Auto mode: measure each candidate recipe on the user's own hardware and keep only what helps.

    >>> tuning = tfopt.auto.tune(plan, budget_seconds=120)   # doctest: +SKIP
    >>> print(tuning.table.to_markdown())                     # doctest: +SKIP

`tfopt.apply(model, dataset, recipes="auto")` runs it and applies what it chose.

Modules: `candidates` (what to try, from the diagnosis and hardware), `trials` (one timed trial),
`decide` (noise and verdicts, pure), `search` (order, greedy combination, budget), `table` (the trials
table), `tune` (all of it together).
"""

from tfopt.auto.tune import DEFAULT_BUDGET_SECONDS, Tuning, tune

__all__ = ["DEFAULT_BUDGET_SECONDS", "Tuning", "tune"]
