"""Putting a built model's layers on a dtype policy, as if it had been global when the user made them, and
which layers a mixed policy leaves at float32: those producing the outputs, and those reading ids or carrying
them there (`tfopt.id_readers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfopt.id_readers import calls_recorded, reading_and_carrying_ids
from tfopt.policies import has_call, model_dtype_policy

if TYPE_CHECKING:
    import keras


def set_dtype_policy(model: keras.Model, policy: str, sample_inputs: Any, *, float32_outputs: bool = True) -> list[str]:
    """Puts a model's layers on `policy` as if it had been the global policy when they were made.

    Layers still on the policy the model was made under (its default: float32, or the mixed policy that
    was global when the user built it) take `policy`; layers the user pinned to another dtype keep theirs.
    Under a mixed policy two kinds stay float32, named in the returned list: the layers producing the
    model's outputs (softmax and the loss keep float32 precision), and the layers that read ids or raw
    features (`Embedding`, lookups, `CategoryEncoding`, hashing, `Normalization`, ..., and user code casting
    a float input to integers) with every layer holding one (a custom layer around an `Embedding`): Keras
    casts a layer's floating inputs to its compute dtype before `call`, and bfloat16 rounds ids above 256
    (15000 and 15001 both become 14976).

    Args:
        model: A built model; its layers are changed in place (tfopt's own copy, never the user's model).
        policy: A Keras dtype policy name.
        sample_inputs: One batch of the model's inputs: a model without a functional graph is called on it
            once to find the layers that produce its outputs.
        float32_outputs: Whether the layers producing the outputs stay float32 (False: they take `policy`, as
            under Keras' own mixed policy, where the model's own code mixes their results with 16-bit ones).

    Returns:
        What stayed float32 and why, one entry per kind; empty under a float32 policy.

    Example:
        >>> import keras
        >>> inputs = keras.Input((2,))  # a user id and a feature, in one float Input
        >>> user = keras.layers.Lambda(lambda columns: columns[:, :1], name="user_id")(inputs)
        >>> vectors = keras.layers.Flatten()(keras.layers.Embedding(20000, 8, name="users")(user))
        >>> model = keras.Model(inputs, keras.layers.Dense(2, name="head")(vectors))
        >>> set_dtype_policy(model, "mixed_bfloat16", None)
        ["carrying them there: 'user_id' (Lambda)", "producing the outputs: 'head' (Dense)"]
        >>> [layer.compute_dtype for layer in model.layers[1:]]  # an Embedding reads its ids exactly in 16 bits
        ['float32', 'bfloat16', 'bfloat16', 'float32']
    """
    defaults = {"float32", model_dtype_policy(model)}
    layers = [layer for layer in _policy_layers(model) if layer.dtype_policy.name in defaults]
    kept: dict[str, list[Any]] = {}
    if policy in ("mixed_float16", "mixed_bfloat16"):
        kept = _kept_float32(model, layers, sample_inputs, float32_outputs)
    float32 = {id(layer) for group in kept.values() for layer in group}
    for layer in layers:
        layer.dtype_policy = "float32" if id(layer) in float32 else policy
    return [f"{why}: {', '.join(_describe(layer) for layer in group)}" for why, group in kept.items() if group]


def float32_output_layers(model: keras.Model, sample_inputs: Any) -> list[Any]:
    """The layers `set_dtype_policy` keeps float32 under a mixed policy as producing the outputs, where they
    still are (none where the forward pass that finds them fails). Found with every layer in float32: a model
    that fails under the mixed policy fails that forward pass."""
    layers = _policy_layers(model)
    policies = [layer.dtype_policy for layer in layers]
    for layer in layers:
        layer.dtype_policy = "float32"
    try:
        producing = _kept_float32(model, layers, sample_inputs, float32_outputs=True)["producing the outputs"]
    except Exception:  # noqa: BLE001 - out of memory, a model failing in float32 too: none known
        producing = []
    finally:
        for layer, policy in zip(layers, policies, strict=True):
            layer.dtype_policy = policy
    return [layer for layer in producing if layer.dtype_policy.name == "float32"]


def _policy_layers(model: keras.Model) -> list[Any]:
    """The layers a policy is set on. The model itself keeps its own: what its call() computes between its
    layers stays in the user's precision, and its input signature (which `export` serves) stays what the user
    feeds it (a model whose call only runs its layers takes theirs once it is compiled: `tfopt.builder`). Not
    where it holds weights of its own that its call() mixes with its layers' outputs (a ViT's class token):
    those must come in its layers' dtype."""
    import keras

    own_weights = bool(model._trainable_variables or model._non_trainable_variables)
    return [
        layer
        for layer in model._flatten_layers(include_self=own_weights, recursive=True)
        if not isinstance(layer, keras.layers.InputLayer)
    ]


def _kept_float32(
    model: keras.Model, layers: list[Any], sample_inputs: Any, float32_outputs: bool
) -> dict[str, list[Any]]:
    """The layers among `layers` a mixed policy keeps float32, by why."""
    reading, carrying = reading_and_carrying_ids(model, layers, sample_inputs)
    outputs = _output_layers(model, sample_inputs) - reading - carrying if float32_outputs else set()
    return {
        "reading ids or raw features": [layer for layer in layers if id(layer) in reading],
        "carrying them there": [layer for layer in layers if id(layer) in carrying],
        "producing the outputs": [layer for layer in layers if id(layer) in outputs],
    }


def _describe(layer: keras.Layer) -> str:
    return f"{layer.name!r} ({type(layer).__name__})"


def _output_layers(model: keras.Model, sample_inputs: Any) -> set[int]:
    """The ids of the innermost layers whose results are the model's outputs."""
    import keras
    import tensorflow as tf

    if isinstance(model, keras.src.models.functional.Functional) and model.outputs:
        return set().union(*(_producing_layers(tensor, sample_inputs) for tensor in model.outputs))
    if isinstance(model, keras.Sequential) and model.layers:
        last = model.layers[-1]
        return _output_layers(last, sample_inputs) if isinstance(last, keras.Model) else {id(last)}
    if not isinstance(model, keras.Model):
        return {id(model)}
    if not has_call(model):
        # A GAN's, a VAE's: its train_step calls its parts, and the outputs of those that are models of their own
        # (a generator, a discriminator, an encoder) are what its losses read.
        parts = model._flatten_layers(include_self=False, recursive=False)
        return set().union(*(_output_layers(part, sample_inputs) for part in parts if isinstance(part, keras.Model)))
    # A subclassed model: call it once and see which layer made each output (inner calls return first). An output
    # its own call() made with `keras.ops` (`ops.softmax(self.head(x))`) comes from the last layer that returned.
    made_by: dict[int, Any] = {}
    alive: list[Any] = []
    returned: list[Any] = []
    sublayers = model._flatten_layers(include_self=False, recursive=True)

    def recording(layer: keras.Layer) -> Any:
        call = layer.call

        def record(*args: Any, **kwargs: Any) -> Any:
            result = call(*args, **kwargs)
            alive.append(result)
            if not isinstance(layer, keras.Model):
                returned.append(layer)
            for tensor in tf.nest.flatten(result):
                made_by.setdefault(id(tensor), layer)
            return result

        return record

    try:
        with calls_recorded(sublayers, recording):
            outputs = tf.nest.flatten(model(sample_inputs, training=False))
    except Exception:  # noqa: BLE001 - a forward pass that fails on these inputs: no output layer found
        return set()
    return {id(made_by.get(id(tensor), returned[-1] if returned else None)) for tensor in outputs} - {id(None)}


def _producing_layers(tensor: Any, sample_inputs: Any) -> set[int]:
    """The ids of the innermost layers whose results a functional graph's tensor is: its own layer's, or where a
    `keras.ops` call made it (`outputs = ops.softmax(logits)`), the layers that made that call's inputs."""
    import keras

    operation, node_index, _ = tensor._keras_history
    if isinstance(operation, keras.Model):
        return _output_layers(operation, sample_inputs)
    if isinstance(operation, keras.layers.InputLayer):
        return set()
    if isinstance(operation, keras.layers.Layer):
        return {id(operation)}
    inputs = operation._inbound_nodes[node_index].input_tensors
    return set().union(*(_producing_layers(each, sample_inputs) for each in inputs))
