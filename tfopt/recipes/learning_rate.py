"""Scaling the learning rate with the batch: one rule for every recipe that makes an update see more examples.

`batch_size` (a larger batch), `grad_accum` (an effective batch of several micro-batches) and
`distribution` (a global batch over several replicas) all scale the optimizer's rate the same way. The
rate is found in the serialized compile config, through a LossScaleOptimizer's inner optimizer, and
scaled in place where it is a number or a Keras schedule (each rate it holds, `_SCHEDULE_RATES`, so that
its shape stays); a warm-up, or a schedule of the user's own, is a `LinearWarmup` around the user's rate,
which keeps a schedule's shape too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tfopt.errors import RecipeConfigError
from tfopt.plan import Unserializable

if TYPE_CHECKING:
    import keras

RULES = ("none", "linear", "sqrt")
_REASONS = {
    "linear": "linear scaling rule (Goyal et al. 2017, for SGD-like optimizers)",
    "sqrt": "square-root scaling (keeps gradient noise constant; often better for Adam)",
}


def check_rule(recipe: str, rule: Any, rules: tuple[str, ...] = RULES) -> None:
    """Raises RecipeConfigError naming the recipe where `rule` is not one of `rules`."""
    if rule not in rules:
        raise RecipeConfigError(
            f"{recipe}: scale_learning_rate={rule!r}. Expected one of {', '.join(map(repr, rules))}.",
            setting="scale_learning_rate",
        )


def scale_learning_rate(
    compile_config: Mapping[str, Any], *, old_batch_size: int, new_batch_size: int, rule: str, warmup_steps: int = 0
) -> tuple[dict[str, Any], str]:
    """Scales the optimizer's learning rate in a compile config by the batch ratio (linear or square root).

    Args:
        compile_config: A serialized Keras compile config (`Plan.compile_config`); not modified.
        old_batch_size: Examples per update before.
        new_batch_size: Examples per update after.
        rule: "none", "linear" or "sqrt".
        warmup_steps: Steps over which the scaled rate is ramped up linearly (0: none).

    Returns:
        The new compile config and a sentence saying what changed and why.

    Raises:
        RecipeConfigError: The learning rate cannot be found, or is a schedule Keras cannot recreate.

    Example:
        >>> config = {"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}}}
        >>> scale_learning_rate(config, old_batch_size=32, new_batch_size=128, rule="sqrt")[0]["optimizer"]
        {'class_name': 'SGD', 'config': {'learning_rate': 0.2}}
    """
    ratio = new_batch_size / old_batch_size
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]
    if factor == 1.0 and not warmup_steps:
        return dict(compile_config), "learning rate kept"
    optimizer = compile_config.get("optimizer")
    if isinstance(optimizer, str):  # compile(optimizer="adam"): Keras' defaults for that optimizer
        import keras

        optimizer = keras.saving.serialize_keras_object(keras.optimizers.get(optimizer))
    changes: list[str] = []
    scaled = _with_scaled_rate(optimizer, factor, warmup_steps, rule, changes)
    detail = f"learning rate {changes[0]} (x{factor:.3g}"
    detail += f", batch {old_batch_size} -> {new_batch_size}: {_REASONS[rule]}" if rule != "none" else ""
    detail += f", linear warm-up over {warmup_steps} steps)" if warmup_steps else ")"
    return {**compile_config, "optimizer": scaled}, detail


def _with_scaled_rate(
    optimizer: keras.optimizers.Optimizer, factor: float, warmup_steps: int, rule: str, changes: list[str]
) -> dict:
    config = dict(optimizer.get("config", {})) if isinstance(optimizer, Mapping) else {}
    if "inner_optimizer" in config:  # LossScaleOptimizer: the rate lives in the wrapped optimizer
        config["inner_optimizer"] = _with_scaled_rate(config["inner_optimizer"], factor, warmup_steps, rule, changes)
        return {**optimizer, "config": config}
    if isinstance(optimizer, Unserializable):
        raise _cannot_scale(rule, optimizer.kind, f"Keras cannot serialize it ({optimizer.why})")
    if "learning_rate" not in config:
        raise _cannot_scale(rule, optimizer, "it has no learning_rate in its config")
    rate = config["learning_rate"]
    if isinstance(rate, (int, float)) and not warmup_steps:
        config["learning_rate"] = rate * factor
        changes.append(f"{rate:g} -> {rate * factor:g}")
    elif isinstance(rate, Mapping) and _rates_of(rate) and not warmup_steps:
        scaled = {key: _times(value, factor) for key, value in _rates_of(rate).items()}
        config["learning_rate"] = {**rate, "config": {**rate["config"], **scaled}}
        changes.append(
            ", ".join(f"{key} {_shown(value)} -> {_shown(scaled[key])}" for key, value in _rates_of(rate).items())
            + f" (of its {rate.get('class_name')})"
        )
    else:
        config["learning_rate"] = _warmup(rate, factor, warmup_steps, rule, optimizer)
        changes.append(
            f"{rate:g} -> LinearWarmup"
            if isinstance(rate, (int, float))
            else f"schedule {rate.get('class_name') if isinstance(rate, Mapping) else rate!r} -> LinearWarmup"
        )
    return {**optimizer, "config": config}


# The settings of Keras' schedules that are rates (not steps, nor fractions of a rate such as CosineDecay's alpha):
# scaling a schedule scales all of them, so that its shape (a warm-up's peak, a decay's floor) scales too.
_SCHEDULE_RATES = ("initial_learning_rate", "warmup_target", "end_learning_rate", "values")


def _rates_of(schedule: Mapping[str, Any]) -> dict[str, Any]:
    """The rates a serialized schedule's config holds (`_SCHEDULE_RATES`), by name."""
    config = schedule.get("config", {})
    return {key: config[key] for key in _SCHEDULE_RATES if config.get(key) is not None}


def _times(value: Any, factor: float) -> Any:
    return [each * factor for each in value] if isinstance(value, (list, tuple)) else value * factor


def _shown(value: Any) -> str:
    return f"[{', '.join(f'{each:g}' for each in value)}]" if isinstance(value, (list, tuple)) else f"{value:g}"


def _warmup(rate: Any, factor: float, warmup_steps: int, rule: str, optimizer: keras.optimizers.Optimizer) -> dict:
    import keras

    from tfopt.distribute.warmup import LinearWarmup

    try:
        return keras.saving.serialize_keras_object(LinearWarmup(rate, scale=factor, warmup_steps=warmup_steps))
    except (TypeError, ValueError) as error:
        raise _cannot_scale(rule, optimizer, f"its learning rate {rate!r} could not be recreated ({error})") from None


def _cannot_scale(rule: str, optimizer: keras.optimizers.Optimizer, why: str) -> RecipeConfigError:
    name = optimizer.get("class_name") if isinstance(optimizer, Mapping) else optimizer
    return RecipeConfigError(
        f"scale_learning_rate={rule!r}: cannot scale the learning rate of optimizer {name!r}: {why}. It must be a "
        "number or a Keras learning-rate schedule; set scale_learning_rate='none' and set the rate yourself."
    )
