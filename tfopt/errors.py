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
