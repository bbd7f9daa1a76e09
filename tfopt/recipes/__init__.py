"""The recipes, one module each (`tfopt.registry` knows them by name).

Each module offers the recipe class and a functional form for people who want one piece only.
"""

from tfopt.recipes.base import Recipe, Stage, chain
from tfopt.recipes.batch_size import BatchSize, find_batch_size, rebatch
from tfopt.recipes.data_pipeline import DataPipeline, tune_pipeline
from tfopt.recipes.data_service import DataService, offload_pipeline
from tfopt.recipes.distribution import Distribution, choose_strategy
from tfopt.recipes.fused_layers import FusedLayers
from tfopt.recipes.grad_accum import GradAccum, with_gradient_accumulation
from tfopt.recipes.mixed_precision import MixedPrecision, choose_policy, float32_matmul_scope, policy_scope
from tfopt.recipes.steps_per_execution import StepsPerExecution
from tfopt.recipes.xla import Xla

__all__ = [
    "BatchSize",
    "DataPipeline",
    "DataService",
    "Distribution",
    "FusedLayers",
    "GradAccum",
    "MixedPrecision",
    "Recipe",
    "Stage",
    "StepsPerExecution",
    "Xla",
    "chain",
    "choose_policy",
    "choose_strategy",
    "find_batch_size",
    "float32_matmul_scope",
    "offload_pipeline",
    "policy_scope",
    "rebatch",
    "tune_pipeline",
    "with_gradient_accumulation",
]
