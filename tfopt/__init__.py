"""tfopt: find out why TensorFlow/Keras training underuses its hardware, apply the fix, prove the gain.

    >>> import tfopt
    >>> result = tfopt.apply(model, dataset)          # doctest: +SKIP
    >>> result.summary()                              # doctest: +SKIP

The top level is what a user calls, what they get back and what they may catch; everything else is
reached through its subpackage (`tfopt.recipes`, `tfopt.data`, `tfopt.builder`, ...).

Importing tfopt does not import TensorFlow: the public names load their modules on first use, so
`tfopt-recipe --help` stays instant.
"""

import os

from tfopt._lazy import lazy_exports
from tfopt._version import __version__

# TensorFlow's C++ INFO and WARNING lines drown the output people need; users can still lower this.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_PUBLIC = {
    # what a user calls
    "apply": "tfopt.optimize",
    "profile": "tfopt.profiling.capture",
    "diagnose": "tfopt.profiling.diagnose",
    "compare": "tfopt.profiling.report",
    "load_recipe": "tfopt.recipe_file",
    "chain": "tfopt.recipes.base",
    "Monitor": "tfopt.profiling.monitor",
    # what they get back
    "ApplyResult": "tfopt.optimize",
    "Profile": "tfopt.profiling.capture",
    "Report": "tfopt.profiling.report",
    # what they may catch
    "TfoptError": "tfopt.errors",
    "CheckpointWriteError": "tfopt.errors",
    "DataError": "tfopt.errors",
    "DistributionError": "tfopt.errors",
    "EnvironmentVariableError": "tfopt.errors",
    "IncompatibleModelError": "tfopt.errors",
    "MeasurementError": "tfopt.errors",
    "NonFiniteLossError": "tfopt.errors",
    "OutOfMemoryError": "tfopt.errors",
    "RecipeClashError": "tfopt.errors",
    "RecipeConfigError": "tfopt.errors",
    "RecipeFileError": "tfopt.errors",
    "StorageError": "tfopt.errors",
}

__all__ = ["__version__", *_PUBLIC]  # noqa: PLE0604 - the lazy table names every export


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC)
