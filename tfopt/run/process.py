"""What a `tfopt-recipe` process does before anything initialises TensorFlow's devices.

The recipe file says how the process must run (its `runtime:` section: GPU memory, the GPUs' threads)
and whether a worker joins a multi-worker cluster (its `distribution` item). TensorFlow fixes both at its
first op or device query (see `tfopt.runtime`), which loading the whole recipe reaches (it checks
optimizer names and data sources), so these are read from the file without TensorFlow and applied first.
"""

from __future__ import annotations

import logging
from typing import Any

from tfopt.recipe_file import RecipeDocument, recipe_item_settings, runtime_settings

_log = logging.getLogger("tfopt")


def start_process(document: RecipeDocument) -> Any | None:
    """Applies the recipe file's process settings; call it before `load_recipe`.

    Args:
        document: The recipe file as `tfopt.recipe_file.read_recipe` read it (once, for the whole run).

    Returns:
        The MultiWorkerMirroredStrategy this worker joined (TF_CONFIG or Slurm lists several workers and
        the recipes have a `distribution` item with strategy auto or multi_worker), else None.

    Raises:
        RecipeFileError: The runtime section or the distribution item is invalid (naming its line).
        RecipeConfigError: TensorFlow refused the GPU memory setting.
        DistributionError: The cluster could not be joined.
    """
    from tfopt import runtime

    settings = runtime_settings(document)
    if settings.gpu_memory_growth is not None or settings.gpu_memory_limit_bytes is not None:
        memory = {"growth": bool(settings.gpu_memory_growth), "limit_bytes": settings.gpu_memory_limit_bytes}
        configured = runtime.configure_gpu_memory(**memory)
        _log.info("gpu memory: %s applied to %d GPU(s) before TensorFlow initialised them", memory, len(configured))
    if settings.gpu_thread_mode is not None:
        configured = runtime.configure_gpu_threads(settings.gpu_thread_mode, settings.gpu_thread_count)
        _log.info(
            "gpu threads: %s (count %s) applied to %d GPU(s) before TensorFlow initialised them",
            settings.gpu_thread_mode,
            settings.gpu_thread_count or "TensorFlow's 2",
            len(configured),
        )
    distribution = recipe_item_settings(document, "distribution")
    if distribution is None or distribution["strategy"] not in ("auto", "multi_worker"):
        return None
    return runtime.join_cluster(
        communication_timeout_seconds=distribution["communication_timeout_seconds"],
        start_timeout_seconds=distribution["start_timeout_seconds"],
    )
