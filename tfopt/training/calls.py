"""Running a compiled model at another number of steps per call of its train function, for a while.

Keras reads `steps_per_execution` when it makes the train function, so changing it means making the function
again (a new trace, an XLA compilation); the model's own function is put back afterwards, so its next `fit` runs
as before without tracing again. Used where Keras' calls must be of another size than the model's: a capture
marks each step (one per call), and an epoch that is not a whole number of the model's calls
(`tfopt.training.fit`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras


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
