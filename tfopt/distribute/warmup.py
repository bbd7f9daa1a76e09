"""Linear learning-rate scaling with warm-up, for a global batch that grew with the replica count.

Goyal et al. (2017): when the batch grows k-fold, multiply the learning rate by k, but ramp up to it over
the first steps, because the scaled rate is too large while the weights are still random. The schedule
wraps the user's own learning rate (a number or any Keras schedule), so decay schedules keep their shape.
"""

from __future__ import annotations

from typing import Any

import keras


@keras.saving.register_keras_serializable(package="tfopt")
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """`scale x base(step)`, ramped linearly from `scale x base / warmup_steps` over `warmup_steps` steps.

    Args:
        base: The original learning rate: a float or a `LearningRateSchedule` (or its serialized dict).
        scale: The factor to multiply it by (the replica count for linear scaling).
        warmup_steps: Steps of the linear ramp; 0 applies `scale` from the first step.

    Example:
        >>> schedule = LinearWarmup(0.1, scale=4, warmup_steps=4)
        >>> [round(float(schedule(step)), 3) for step in range(6)]
        [0.1, 0.2, 0.3, 0.4, 0.4, 0.4]
    """

    def __init__(self, base: Any, scale: float = 1.0, warmup_steps: int = 0):
        if isinstance(base, dict):
            base = keras.saving.deserialize_keras_object(base)
        if warmup_steps < 0 or scale <= 0:
            raise ValueError(
                f"LinearWarmup needs warmup_steps >= 0 and scale > 0; received "
                f"warmup_steps={warmup_steps}, scale={scale}."
            )
        self.base, self.scale, self.warmup_steps = base, float(scale), int(warmup_steps)

    def __call__(self, step: Any) -> Any:
        step = keras.ops.cast(step, "float32")
        base = self.base(step) if callable(self.base) else keras.ops.cast(self.base, "float32")
        if not self.warmup_steps:
            return base * self.scale
        ramp = keras.ops.minimum(1.0, (step + 1.0) / float(self.warmup_steps))
        return base * self.scale * ramp

    def get_config(self) -> dict[str, Any]:
        base = keras.saving.serialize_keras_object(self.base) if callable(self.base) else self.base
        return {"base": base, "scale": self.scale, "warmup_steps": self.warmup_steps}
