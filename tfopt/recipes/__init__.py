"""The recipes, one module each: importing this package registers them all.

Each module offers the recipe class and a functional form for people who want one piece only.
"""

from tfopt.recipes.base import Chain, Recipe, Stage, chain
from tfopt.recipes.data_pipeline import DataPipeline, tune_pipeline
from tfopt.recipes.mixed_precision import MixedPrecision, choose_policy, policy_scope
from tfopt.recipes.xla import Xla, xla_blockers

__all__ = [
    "Chain", "DataPipeline", "MixedPrecision", "Recipe", "Stage", "Xla", "chain", "choose_policy",
    "policy_scope", "tune_pipeline", "xla_blockers",
]
