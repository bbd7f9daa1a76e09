"""Keras dtype policies: the scope that sets one, the policy a model was built under, and the clone that
rebuilds a Functional or Sequential model under the current one.

Its own module because both `make_plan` (which records the user's policy and prepares the clone) and
`build` (which enters the scope and calls the clone) need it, and neither may import the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def dtype_policy_scope(policy: str) -> Iterator[None]:
    """Sets Keras' global dtype policy for the block and restores the previous one afterwards.

    Example:
        >>> import keras
        >>> with dtype_policy_scope("mixed_bfloat16"):
        ...     keras.layers.Dense(2).compute_dtype
        'bfloat16'
        >>> keras.config.dtype_policy().name
        'float32'
    """
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def clone_under_current_policy(model: Any) -> Any:
    """Clones a Functional or Sequential model so its layers take the current global dtype policy.

    A layer's config records the policy it was made with, so a plain `clone_model` keeps it even inside
    another policy's scope. Layers on the policy the model was built under (its default: float32, or the
    mixed policy that was global when the user built it) get the current policy; layers the user pinned to
    another dtype (e.g. int lookups) keep theirs; the layers producing the model's outputs compute in
    float32, so softmax and the loss do not lose precision. Operations that are not layers (`keras.ops`
    calls, `x + y`) are recreated as they are. The clone has fresh weights: `build()` copies the user's in.
    """
    import keras

    policy = keras.config.dtype_policy().name
    defaults = {"float32", model_dtype_policy(model)}
    if model.built:
        output_layers = {id(tensor._keras_history.operation) for tensor in model.outputs}
    else:  # a Sequential model without an Input: its last layer makes the output
        output_layers = {id(model.layers[-1])}

    def clone_layer(layer: Any) -> Any:
        config = layer.get_config()
        if isinstance(layer, keras.layers.Layer) and not isinstance(layer, keras.layers.InputLayer) \
                and layer.dtype_policy.name in defaults:
            config["dtype"] = "float32" if id(layer) in output_layers else policy
        return layer.__class__.from_config(config)

    return keras.models.clone_model(model, clone_function=clone_layer, recursive=True)


def model_dtype_policy(model: Any) -> str:
    """The dtype policy a model was built under: "float32", or a mixed policy set globally at the time."""
    name = model.dtype_policy.name
    return name if name in ("mixed_float16", "mixed_bfloat16") else "float32"
