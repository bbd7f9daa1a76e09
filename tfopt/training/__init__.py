"""Training that survives faults: resumable checkpoints, a NaN/Inf guard, and `train()` over both.

Names load on first use (PEP 562), so `import tfopt.recipes` (which uses the batch-size search from
here) does not import Keras.
"""

from __future__ import annotations

import importlib

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

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'tfopt.training' has no attribute {name!r}; public names are {__all__}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
