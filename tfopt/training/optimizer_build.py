"""Building an optimizer's state before the first step, as Keras' own fit would build it for the model.

Where fit builds it decides its start: an optimizer whose `build` sets its state from the weights
(ScheduleFreeAdamW copies them into its momentum) starts elsewhere when built eagerly than when fit builds it in
the first step's trace, so tfopt, which builds early (to snapshot, restore or carry the state), builds where fit
would.
"""

from __future__ import annotations

from typing import Any


def build_as_fit_does(optimizer: Any, model: Any, variables: list[Any] | None = None) -> None:
    """Builds `optimizer` over `variables` (default: the model's trainable ones) the way Keras' fit builds it.

    For a model made in a strategy's scope, fit builds it eagerly in that scope (its symbolic build), and so does
    this. For a model made outside any, fit builds it while tracing the first step; `tf.function` runs only a
    second trace of a function that created variables, where `build` has already returned, so what `build`
    assigned in the first never reaches the variables: they hold their initializers' values. Tracing `build`
    in a `tf.function` here gives the same state (and its concrete function, never run, no retracing
    warnings when many optimizers are built)."""
    import tensorflow as tf

    variables = model.trainable_variables if variables is None else variables
    if model.__dict__.get("_distribute_strategy") is not None:
        with model.distribute_strategy.scope():
            optimizer.build(variables)
        return
    # Traced twice (the second time with variable creation off): built in the first, as `apply` checks first.
    tf.function(lambda: optimizer.built or optimizer.build(variables), autograph=False).get_concrete_function()
