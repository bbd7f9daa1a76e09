"""What a `tfopt-recipe` process must do before anything initialises TensorFlow's devices.

TensorFlow fixes two things at its first op or device query, and both come from the recipe file:
GPU memory growth or limits (the `gpu_memory` recipe item), and, in a worker of a multi-worker
cluster, the MultiWorkerMirroredStrategy itself ("Collective ops must be configured at program
startup"; creating a second one later hangs). So these are read from the file without TensorFlow
(`recipe_item_settings`) and applied first; the strategy is then reused by the run's build.
"""

from __future__ import annotations

import logging
from typing import Any

from tfopt.recipe_file import RecipeDocument, recipe_item_settings

_log = logging.getLogger("tfopt")


def start_process(document: RecipeDocument) -> Any | None:
    """Applies the recipe file's process-wide settings; call it before `load_recipe`.

    Args:
        document: The recipe file as `tfopt.recipe_file.read_recipe` read it (once, for the whole run).

    Returns:
        The MultiWorkerMirroredStrategy this worker joined (TF_CONFIG or Slurm lists several workers and
        the recipes have a `distribution` item with strategy auto or multi_worker), else None.

    Raises:
        RecipeFileError: The gpu_memory or distribution item is invalid.
        RecipeConfigError: TensorFlow refused the GPU memory setting.
        DistributionError: The cluster could not be joined.
    """
    from tfopt.distribute.environment import detect_environment
    memory = recipe_item_settings(document, "gpu_memory")
    if memory is not None:
        from tfopt.recipes.memory import configure_gpu_memory

        configured = configure_gpu_memory(**memory)
        _log.info("gpu_memory: %s applied to %d GPU(s) before TensorFlow initialised them", memory, len(configured))
    cluster = detect_environment()
    if cluster.launcher not in ("tf_config", "slurm") or cluster.num_workers < 2:
        return None
    distribution = recipe_item_settings(document, "distribution")
    if distribution is None or distribution["strategy"] not in ("auto", "multi_worker"):
        return None
    from tfopt.distribute.strategy import make_strategy

    _log.info("joining the cluster: %s", cluster.reason)
    return make_strategy("multi_worker", communication_timeout_seconds=distribution["communication_timeout_seconds"],
                         cluster_resolver="slurm" if cluster.launcher == "slurm" else "tf_config")
