"""The errors tfopt raises on purpose.

Every error tfopt raises about the user's input is a `TfoptError`, so the CLI can print its message as
one paragraph (no traceback) and notebooks can catch one class. Each message says what was received,
what was expected and how to fix it. The subclasses that stand for a bad value also derive from
`ValueError`/`TypeError` so plain Python code catching those keeps working.
"""

from __future__ import annotations


class TfoptError(Exception):
    """Base class of every error tfopt raises about its input or environment."""


class RecipeConfigError(TfoptError, ValueError):
    """A recipe was given a value it cannot take, or an unknown recipe name was used."""


class RecipeClashError(TfoptError, ValueError):
    """Two recipes in one chain contradict each other (two strategies, fp16 and bf16, a duplicate)."""


class IncompatibleModelError(TfoptError, TypeError):
    """The model cannot be rebuilt by tfopt as given (not a Keras model, subclassed without model_fn)."""


class DataError(TfoptError, ValueError):
    """The dataset is missing, empty, malformed or not a tf.data.Dataset."""


class RecipeFileError(TfoptError, ValueError):
    """A YAML recipe file is malformed; the message names the file, the line and the key path."""


class MeasurementError(TfoptError, RuntimeError):
    """A timing or profiling run could not produce a measurement (it failed, or there was nothing to time)."""


class DistributionError(TfoptError, RuntimeError):
    """A distributed run could not start or lost a worker."""


class NonFiniteLossError(TfoptError, FloatingPointError):
    """Training produced a NaN or Inf loss (or weights), so it was stopped.

    Attributes:
        step: The global step (1-based) whose loss was not finite.
        last_good_checkpoint: The newest checkpoint written from finite weights, or None.
    """

    def __init__(self, message: str, *, step: int, last_good_checkpoint: str | None = None):
        super().__init__(message)
        self.step = step
        self.last_good_checkpoint = last_good_checkpoint

    def with_checkpoint(self, path: str | None) -> NonFiniteLossError:
        """The same error with the last good checkpoint named in the message."""
        where = (f" The last good checkpoint is {path}; it was written before the loss went bad, and "
                 "train() resumes from it when started again with the same checkpoint_dir."
                 if path else " No checkpoint had been written yet.")
        return NonFiniteLossError(f"{self}{where}", step=self.step, last_good_checkpoint=path)
