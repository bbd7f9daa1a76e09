"""Running a compiled model at another number of steps per call of its train function, for a while.

Keras reads `steps_per_execution` when it makes the train function, so changing it means making the function
again (a new trace, an XLA compilation); the model's own function is put back afterwards, so its next `fit` runs
as before without tracing again. Used where Keras' calls must be of another size than the model's: a capture
marks each step (one per call), and an epoch that is not a whole number of the model's calls (`whole_calls`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras

_log = logging.getLogger("tfopt")


@contextlib.contextmanager
def steps_per_call(model: keras.Model, steps: int) -> Iterator[None]:
    """Runs `model`'s training at `steps` steps per call inside the block, then as it was.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
        >>> with steps_per_call(model, 2):
        ...     model.steps_per_execution
        2
        >>> model.steps_per_execution
        4
    """
    own = model.steps_per_execution
    if steps == own:
        yield
        return
    function = model.train_function
    model.steps_per_execution, model.train_function = steps, None
    try:
        yield
    finally:
        model.steps_per_execution, model.train_function = own, function


def whole_calls(model: keras.Model, steps_per_epoch: int | None) -> int:
    """The steps per call an epoch of `steps_per_epoch` steps trains exactly at: the model's own where they divide
    it, else the largest number that divides both. Given steps_per_epoch, Keras' loop counts calls and each call
    runs its N steps while the data lasts, so 10 steps an epoch at 4 per call train 12 (one pass over a finite
    dataset, steps_per_epoch None, ends with the data)."""
    own = int(model.steps_per_execution)
    whole = math.gcd(own, steps_per_epoch) if steps_per_epoch else own
    if whole != own:
        _log.info(
            "training %d steps per call, not the model's %d: an epoch of %d steps is not a whole number of its calls, "
            "and Keras would run the last call whole",
            whole,
            own,
            steps_per_epoch,
        )
    return whole
