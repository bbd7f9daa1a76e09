"""tfopt: find out why TensorFlow/Keras training underuses its hardware, apply the fix, prove the gain.

    >>> import tfopt
    >>> result = tfopt.apply(model, dataset)          # doctest: +SKIP
    >>> result.summary()                              # doctest: +SKIP

Importing tfopt does not import TensorFlow: the public names load their modules on first use, so
`tfopt-recipe --help` stays instant.
"""

import os

from tfopt._lazy import lazy_exports
from tfopt._version import __version__

# TensorFlow's C++ INFO and WARNING lines drown the output people need; users can still lower this.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_PUBLIC = {
    "apply": "tfopt.optimize",
    "ApplyResult": "tfopt.optimize",
    "Plan": "tfopt.plan",
    "build": "tfopt.builder",
    "chain": "tfopt.recipes.base",
    "profile": "tfopt.profiling.capture",
    "Profile": "tfopt.profiling.capture",
    "compare": "tfopt.profiling.report",
    "Report": "tfopt.profiling.report",
    "diagnose": "tfopt.profiling.diagnose",
    "Monitor": "tfopt.profiling.live",
    "find_batch_size": "tfopt.recipes.batch_size",
    "load_recipe": "tfopt.recipe_file",
}

__all__ = ["__version__", *_PUBLIC]


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC)
