"""One RAM budget for what a tf.data pipeline holds: its cache, its autotuned buffers and its last prefetch.

The budget is a share of the host memory *available* when the pipeline is built (not of the total: what
other processes hold is not ours to fill), a quarter by default. A cache holds the whole decoded (sharded)
dataset and a shuffle buffer after it may hold as much again, so a quarter is the most a cache may take;
tf.data's autotuner (whose own default is half the RAM) and the final prefetch live within the same
budget. The data_pipeline recipe's `ram_budget_fraction` sets the share for every pipeline it builds or
rewrites, a tfopt source's included.
"""

from __future__ import annotations

import psutil

DEFAULT_FRACTION = 0.25
MAX_PREFETCH_BATCHES = 16
# The final prefetch takes a small part of the budget: a few batches are enough to hide one step's jitter.
_PREFETCH_SHARE = 0.08


def ram_budget_bytes(fraction: float = DEFAULT_FRACTION) -> int:
    """`fraction` of the host memory available right now, in bytes.

    Example:
        >>> 0 < ram_budget_bytes(0.01) < ram_budget_bytes(0.5)
        True
    """
    return int(psutil.virtual_memory().available * fraction)


def prefetch_batches(batch_bytes: int, budget_bytes: int) -> int:
    """How many batches the final prefetch holds: as many as fit its share of the budget, from 1 to 16.

    Example:
        >>> prefetch_batches(1_000, 125_000), prefetch_batches(10**6, 125_000), prefetch_batches(1, 2**40)
        (10, 1, 16)
    """
    return int(min(MAX_PREFETCH_BATCHES, max(1, int(budget_bytes * _PREFETCH_SHARE) // max(1, batch_bytes))))
