"""Layers Keras 3 computes slowly, rewritten in the model copy into equivalents with the same semantics.

The rewrites themselves are `tfopt.rewrites`; this recipe only records which the build makes, since the layers
exist only once the build has created the model. The build then says which layers it rewrote and why others
were left as they are. With "auto" the rewrite is kept only where the optimized setup measures faster with it
than without it, side by side on this machine (`tfopt.verdict.decided_alone`): fused BatchNormalization
was faster than Keras' own on a CPU without XLA and slower with XLA there (docs/recipes/fused_layers.md).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tfopt.errors import RecipeConfigError
from tfopt.plan import Plan
from tfopt.recipes.base import Recipe, Stage
from tfopt.rewrites import REWRITES


@dataclasses.dataclass(frozen=True, kw_only=True)
class FusedLayers(Recipe):
    """Runs the model copy's BatchNormalization layers through TensorFlow's fused kernel, and folds the bias of
    a convolution into the BatchNormalization that cancels it.

    Args:
        batch_norm: "auto", True or False: BatchNormalization through the fused kernel
            (`tfopt.rewrites.batch_norm`).
        conv_bias: "auto", True or False: convolution biases folded (`tfopt.rewrites.conv_bias`).
        Either "auto" lets the measurement decide (kept where the setup measured faster with the rewrites than
        without them); True and False are kept as asked.

    Example:
        >>> FusedLayers().get_config()
        {'batch_norm': 'auto', 'conv_bias': 'auto'}
    """

    name: ClassVar[str] = "fused_layers"
    stage: ClassVar[Stage] = Stage.NUMERICS

    batch_norm: bool | str = "auto"
    conv_bias: bool | str = "auto"

    def __post_init__(self) -> None:
        for setting in REWRITES:  # a setting per rewrite, named as the rewrite
            value = getattr(self, setting)
            if not (value == "auto" or isinstance(value, bool)):
                raise RecipeConfigError(
                    f"fused_layers: {setting}={value!r} is not valid. Expected 'auto', true or false.",
                    setting=setting,
                )

    @property
    def verified(self) -> bool:
        """Whether the measurement decides (a rewrite left on "auto"), rather than the settings as asked."""
        return any(getattr(self, name) == "auto" for name in REWRITES)

    def __call__(self, plan: Plan) -> Plan:
        rewrites = tuple(name for name in REWRITES if getattr(self, name) is not False)
        if not rewrites:
            return plan.replace(layer_rewrites=()).record(
                self.name, "batch_norm=False and conv_bias=False requested", skipped=True
            )
        return plan.replace(layer_rewrites=rewrites).record(
            self.name, "where the model has such layers, rewritten with Keras' semantics (variables, config kept)"
        )
