"""A stop asked for while training takes effect at the end of a step.

A signal handler that raises does so at whatever Python line the main thread is on, and inside Keras' loop
that can be halfway through setting up or tearing down TensorFlow state (an iterator, an asynchronous
checkpoint): under load, one SIGTERM raised so was followed by `free(): invalid next size` and an abort.
While `train` runs, the command line's handler asks here instead (`deferred`), and the `StopAtStepEnd`
callback, last in the step's callbacks, raises `RunInterrupted` once the step and its checkpoint
bookkeeping are done: the weights are then exactly at the step counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras

from tfopt.errors import RunInterrupted

_state = {"loops": 0, "asked": None}


def deferred(signal_name: str) -> bool:
    """Asks a running training loop to stop at its next step end; False where none runs (raise now)."""
    if not _state["loops"]:
        return False
    _state["asked"] = signal_name
    return True


@contextlib.contextmanager
def stops_at_step_ends() -> Iterator[None]:
    """The block's training loops take stops through `StopAtStepEnd`."""
    _state["loops"] += 1
    try:
        yield
    finally:
        _state["loops"] -= 1
        if not _state["loops"]:
            _state["asked"] = None


class StopAtStepEnd(keras.callbacks.Callback):
    """Raises `RunInterrupted` at the end of the step during which a stop was asked."""

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        asked = _state["asked"]
        if asked is not None:
            _state["asked"] = None
            raise RunInterrupted(asked)
