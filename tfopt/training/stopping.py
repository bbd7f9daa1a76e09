"""A stop asked for while tfopt drives TensorFlow takes effect at the end of a training step, or not in Python.

A signal handler that raises does so at whatever Python line the main thread is on, and inside Keras' loop
that can be halfway through setting up or tearing down TensorFlow state (an iterator, an asynchronous
checkpoint): under load, one SIGTERM raised so was followed by `free(): invalid next size` and an abort.
While a run measures, profiles or trains, the command line's handler asks here instead (`deferred`): the
`StopAtStepEnd` callback, last in a training step's callbacks, raises `RunInterrupted` once the step and its
checkpoint bookkeeping are done (the weights are then exactly at the step counted), and the timed and
profiled steps take it at their ends too (`take_stop`); in a phase without such a point (compiling, building)
the command line's watcher ends the process after its grace period, with nothing half-written, as tfopt writes
its outputs atomically.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras

from tfopt.errors import RunInterrupted

_state: dict = {"blocks": 0, "asked": None, "taken": False}


def deferred(signal_name: str) -> bool:
    """Asks the work of a `stops_at_step_ends` block to stop at its next step end; False outside one (the
    caller raises at once: a wait in Python, such as on worker processes, is safe to interrupt)."""
    if not _state["blocks"]:
        return False
    _state["asked"] = signal_name
    return True


def taken() -> bool:
    """Whether a stop asked for was taken at a step end (the main thread is cleaning up)."""
    return _state["taken"]


@contextlib.contextmanager
def stops_at_step_ends() -> Iterator[None]:
    """In the block, stops are asked for (`deferred`), and training loops take them through `StopAtStepEnd`.
    A stop asked for that no step end took (the block measured, or trained no step after it) is taken where
    the outermost block ends: a signal is not lost because the work it came during ended well (where the work
    failed, its error ends the command)."""
    _state["blocks"] += 1
    asked = None
    try:
        yield
    finally:
        _state["blocks"] -= 1
        if not _state["blocks"]:
            asked, _state["asked"] = _state["asked"], None
    if asked is not None:
        _state["taken"] = True
        raise KeyboardInterrupt if asked == "SIGINT" else RunInterrupted(asked)


def take_stop() -> None:
    """Raises `RunInterrupted` where a stop was asked for: a loop of steps calls it at each step's end (a
    measurement's, a capture's), where nothing is half-done."""
    asked = _state["asked"]
    if asked is not None:
        _state["asked"], _state["taken"] = None, True
        raise RunInterrupted(asked)


class StopAtStepEnd(keras.callbacks.Callback):
    """Raises `RunInterrupted` at the end of the step during which a stop was asked."""

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        take_stop()
