"""Training that survives faults: resumable checkpoints, a NaN/Inf guard, and `train()` over both.

Names load on first use (PEP 562), so `import tfopt.recipes` (which uses the batch-size search from
here) does not import Keras.
"""

from __future__ import annotations

from tfopt._lazy import lazy_exports

_EXPORTS = {
    "train": "tfopt.training.fit",
    "TrainingResult": "tfopt.training.fit",
    "TrainingCheckpoint": "tfopt.training.checkpointing",
    "CheckpointCallback": "tfopt.training.checkpointing",
    "NonFiniteLossError": "tfopt.errors",
    "NonFiniteLossGuard": "tfopt.training.guards",
    "check_finite_loss": "tfopt.training.guards",
    "track_peak_memory": "tfopt.training.peak_memory",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - the lazy table names every export


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
