"""Running a compiled model at another number of steps per call of its train function, for a while.

Keras reads `steps_per_execution` when it makes the train, test and predict functions, so changing it means
making them again (a new trace, an XLA compilation); the model's own are put back afterwards, so its next
`fit`, `evaluate` and `predict` run as before without tracing again. Used where Keras' calls must be of another
size than the model's: a capture marks each step (one per call), and an epoch that is not a whole number of
the model's calls (`whole_calls`).
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
    # Keras makes each of them with the number in force: fit's validation and a callback's predict too.
    functions = (model.train_function, model.test_function, model.predict_function)
    model.steps_per_execution = steps
    model.train_function = model.test_function = model.predict_function = None
    try:
        yield
    finally:
        model.steps_per_execution = own
        model.train_function, model.test_function, model.predict_function = functions


def whole_calls(model: keras.Model, steps_per_epoch: int | None) -> int:
    """The steps per call an epoch of `steps_per_epoch` steps trains exactly at: the model's own where it divides
    the epoch, else the divisor of the epoch nearest to it (by ratio: 5 for 4 in an epoch of 10, 19 for 16 in an
    epoch of 19). Given steps_per_epoch, Keras' loop counts calls and each call runs its N steps while the data
    lasts, so 10 steps an epoch at 4 per call would train 12; one pass over a finite dataset (steps_per_epoch
    None) ends with the data. The learning is the same at any number; the host's cost per call is spread as
    much as the model's own number spreads it.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse", steps_per_execution=16)
        >>> whole_calls(model, 64), whole_calls(model, 19), whole_calls(model, 10), whole_calls(model, None)
        (16, 19, 10, 16)
    """
    own = int(model.steps_per_execution)
    if not steps_per_epoch or steps_per_epoch % own == 0:
        return own
    small = [n for n in range(1, math.isqrt(steps_per_epoch) + 1) if steps_per_epoch % n == 0]
    divisors = {*small, *(steps_per_epoch // n for n in small)}
    whole = min(divisors, key=lambda n: (abs(math.log(n / own)), n))
    _log.info(
        "training %d steps per call, not the model's %d: an epoch of %d steps is not a whole number of its calls, "
        "and Keras would run the last call whole",
        whole,
        own,
        steps_per_epoch,
    )
    return whole
