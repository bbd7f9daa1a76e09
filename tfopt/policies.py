"""The numerics a model computes with: Keras dtype policies (the scope that sets one, the policy a model
was built under, the setting of a built model's layers to another one) and TensorFlow's TF32 switch.

Its own module because both `make_plan` (which records the user's policy and TF32 setting) and `build`
(which puts the model it builds on the plan's) need it, and neither may import the other. The plan stays
pure data: the process-wide state these settings live in is kept here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras


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


# Layers that read integers (ids, indices, categories, strings) or raw features: under a mixed policy Keras
# casts a layer's floating inputs to 16 bits before `call`, which rounds ids above 256 in bfloat16.
_READS_IDS_OR_RAW_FEATURES = (
    "layers.Embedding",
    "layers.StringLookup",
    "layers.IntegerLookup",
    "layers.CategoryEncoding",
    "layers.Hashing",
    "layers.HashedCrossing",
    "layers.Discretization",
    "layers.Normalization",
    "layers.TextVectorization",
    "utils.FeatureSpace",
)


def set_dtype_policy(model: keras.Model, policy: str, sample_inputs: Any) -> list[str]:
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

    Returns:
        What stayed float32 and why, one entry per kind; empty under a float32 policy.

    Example:
        >>> import keras
        >>> inputs = keras.Input((4,))
        >>> ids = keras.layers.Embedding(20000, 8, name="tokens")(inputs)
        >>> model = keras.Model(inputs, keras.layers.Dense(2, name="head")(keras.layers.Flatten()(ids)))
        >>> set_dtype_policy(model, "mixed_bfloat16", None)
        ["reading ids or raw features: 'tokens' (Embedding)", "producing the outputs: 'head' (Dense)"]
        >>> [layer.compute_dtype for layer in model.layers[1:]]
        ['float32', 'bfloat16', 'float32']
    """
    import keras

    defaults = {"float32", model_dtype_policy(model)}
    # The model itself keeps its own: what its call() computes between its layers stays in the user's
    # precision, and its input signature (which `export` serves) stays what the user feeds it. Not where it
    # holds weights of its own that its call() mixes with its layers' outputs (a ViT's class token): those
    # must come in its layers' dtype.
    own_weights = bool(model._trainable_variables or model._non_trainable_variables)
    layers = [
        layer
        for layer in model._flatten_layers(include_self=own_weights, recursive=True)
        if not isinstance(layer, keras.layers.InputLayer) and layer.dtype_policy.name in defaults
    ]
    kept: dict[str, list[Any]] = {}
    if policy in ("mixed_float16", "mixed_bfloat16"):
        reading = _holding_id_readers(model, _casting_floats_to_integers(model, layers, sample_inputs))
        carrying = _carrying_to_id_readers(model, reading) - reading
        outputs = _output_layers(model, sample_inputs) - reading - carrying
        kept = {
            "reading ids or raw features": [layer for layer in layers if id(layer) in reading],
            "carrying them there": [layer for layer in layers if id(layer) in carrying],
            "producing the outputs": [layer for layer in layers if id(layer) in outputs],
        }
    float32 = {id(layer) for group in kept.values() for layer in group}
    for layer in layers:
        layer.dtype_policy = "float32" if id(layer) in float32 else policy
    return [f"{why}: {', '.join(_describe(layer) for layer in group)}" for why, group in kept.items() if group]


def _describe(layer: keras.Layer) -> str:
    return f"{layer.name!r} ({type(layer).__name__})"


def _holding_id_readers(model: keras.Model, casting: set[int]) -> set[int]:
    """The ids of the layers that read ids or raw features (subclasses too, and the `casting` ones: their own
    call() reads them), and of every layer that holds one."""
    readers = _id_reader_classes()
    holding: set[int] = set()

    def visit(layer: keras.Layer) -> bool:
        inner = [visit(child) for child in layer._flatten_layers(include_self=False, recursive=False)]
        if any(inner) or isinstance(layer, readers) or id(layer) in casting:
            holding.add(id(layer))
            return True
        return False

    visit(model)
    return holding


def _carrying_to_id_readers(model: keras.Model, reading: set[int]) -> set[int]:
    """The ids of the layers a functional graph passes the inputs of the `reading` layers through, from the model's
    inputs on (a Lambda taking the user-id column of a float Input): Keras casts their float inputs to 16 bits as
    well. The way back stops at a layer with weights, which computes features rather than carrying ids. A
    subclassed model's call() has no graph to read: its first batch is checked (`tfopt.fidelity`)."""
    import keras

    layers = model._flatten_layers(include_self=False, recursive=True)
    # A nested model's inputs are what the graph around it feeds it: the way back goes on there.
    fed: dict[int, list[Any]] = {}
    for nested in layers:
        if isinstance(nested, keras.Model) and getattr(nested, "inputs", None):
            for node in nested._inbound_nodes:
                for inner, outer in zip(keras.tree.flatten(nested.inputs), node.input_tensors):
                    fed.setdefault(id(inner), []).append(outer)
    carrying: set[int] = set()
    seen: set[int] = set()
    tensors = [
        tensor
        for layer in layers
        if id(layer) in reading
        for node in layer._inbound_nodes
        for tensor in node.input_tensors
    ]
    while tensors:
        tensor = tensors.pop()
        history = getattr(tensor, "_keras_history", None)
        if history is None or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        operation, node_index, _ = history
        if isinstance(operation, keras.layers.InputLayer):
            tensors.extend(fed.get(id(tensor), ()))
            continue
        if isinstance(operation, keras.layers.Layer):
            if operation.weights:  # it computes features (a Dense before a Normalization), carries no ids
                continue
            carrying.add(id(operation))
        tensors.extend(operation._inbound_nodes[node_index].input_tensors)
    return carrying


def _id_reader_classes() -> tuple[type, ...]:
    """The Keras classes of `_READS_IDS_OR_RAW_FEATURES`."""
    import keras

    return tuple(
        getattr(getattr(keras, module), name)
        for module, name in (path.split(".") for path in _READS_IDS_OR_RAW_FEATURES)
    )


def _casting_floats_to_integers(model: keras.Model, layers: list[Any], sample_inputs: Any) -> set[int]:
    """The ids of the layers of user code (a custom class's, a `Lambda`'s) whose own call() turns a float input into
    integers (`one_hot(cast(x[:, 0], "int32"))`): ids a float input carries, which no class tells. Found in a graph
    of the model's forward pass, traced (nothing runs) with every such layer's call() recorded: the ops it made,
    and a way from one of its float inputs through them, reading no weights, to a cast to an integer type. Keras
    rounds those inputs to 16 bits before call() (`autocast`); ids past 256 round in bfloat16, and sorted data
    shows them only after the first batch, which is all the first-batch check sees."""
    import keras
    import tensorflow as tf

    readers = _id_reader_classes()
    users = [
        layer
        for layer in layers
        if layer.autocast
        and not isinstance(layer, readers)
        and (isinstance(layer, keras.layers.Lambda) or not type(layer).__module__.startswith("keras."))
    ]
    if not users:
        return set()
    calls: list[tuple[Any, list[Any], list[Any]]] = []

    def recording(layer: keras.Layer) -> Any:
        call = layer.call

        def record(*args: Any, **kwargs: Any) -> Any:
            graph = tf.compat.v1.get_default_graph()
            before = len(graph.get_operations())
            result = call(*args, **kwargs)
            floats = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t) and t.dtype.is_floating]
            calls.append((layer, floats, graph.get_operations()[before:]))
            return result

        return record

    for layer in users:
        object.__setattr__(layer, "call", recording(layer))
    try:
        for forward, specs in _forward_passes(model, sample_inputs):
            tf.function(lambda batch, forward=forward: forward(batch, training=False)).get_concrete_function(specs)
    except Exception:  # noqa: BLE001 - a call() that cannot be traced runs eagerly; its first batch is checked
        pass
    finally:
        for layer in users:
            layer.__dict__.pop("call", None)
    return {id(layer) for layer, floats, ops in calls if _reaches_an_integer_cast(floats, ops)}


def _forward_passes(model: keras.Model, sample_inputs: Any) -> Iterator[tuple[Any, Any]]:
    """The models whose forward passes reach the model's layers, each with the specs of its inputs: the model's
    own (of `sample_inputs`, or of its functional inputs), or where it has no call() (a GAN's), its functional
    parts'."""
    import keras
    import tensorflow as tf

    def specs(functional: keras.Model) -> Any:
        return keras.tree.map_structure(lambda x: tf.TensorSpec(x.shape, x.dtype), functional._inputs_struct)

    if has_call(model):
        if sample_inputs is not None:
            yield model, tf.nest.map_structure(tf.type_spec_from_value, sample_inputs)
        elif getattr(model, "inputs", None):
            yield model, specs(model)
        return
    for part in model._flatten_layers(include_self=False, recursive=False):
        if isinstance(part, keras.Model) and getattr(part, "inputs", None):
            yield part, specs(part)


def _reaches_an_integer_cast(floats: list[Any], ops: list[Any]) -> bool:
    """Whether a way leads from the `floats` through the `ops` to a cast from floats to integers, through no op that
    reads a weight (which computes features from them, as a layer with weights does on the functional graph)."""
    ours = {op.name for op in ops}
    seen: set[str] = set()
    tensors = list(floats)
    while tensors:
        for op in tensors.pop().consumers():
            if op.name not in ours or op.name in seen or any(_is_a_weight(each) for each in op.inputs):
                continue
            seen.add(op.name)
            if op.type == "Cast" and op.inputs[0].dtype.is_floating and op.outputs[0].dtype.is_integer:
                return True
            tensors.extend(op.outputs)
    return False


def _is_a_weight(tensor: Any) -> bool:
    """Whether a graph tensor is a variable's value, read (and perhaps cast) in the traced call."""
    while tensor.op.type in ("Identity", "Cast"):
        tensor = tensor.op.inputs[0]
    return tensor.op.type == "ReadVariableOp"


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

    for layer in sublayers:
        object.__setattr__(layer, "call", recording(layer))
    try:
        outputs = tf.nest.flatten(model(sample_inputs, training=False))
    except Exception:  # noqa: BLE001 - a forward pass that fails on these inputs: no output layer found
        return set()
    finally:
        for layer in sublayers:
            layer.__dict__.pop("call", None)
    return {id(made_by.get(id(tensor), returned[-1] if returned else None)) for tensor in outputs} - {id(None)}


def has_call(model: keras.Model) -> bool:
    """Whether the model has a forward pass of its own: a model whose class defines no call() (a GAN's, a VAE's)
    is trained by a train_step that calls its parts."""
    import keras

    return type(model).call is not keras.Model.call


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


def model_dtype_policy(model: keras.Model) -> str:
    """The dtype policy a model was built under: "float32", or a mixed policy set globally at the time."""
    name = model.dtype_policy.name
    return name if name in ("mixed_float16", "mixed_bfloat16") else "float32"


# TensorFlow's TF32 switch is process-wide and read when kernels run, so a build that turns it off for its
# model (mixed_precision tf32: false) must leave it off while that model trains: after `tfopt.apply` returns,
# the user trains `result.model`. The user's own setting from before is kept here, so that the next plan's
# baseline is the user's float32 and not the last build's; None while the switch is as the user set it.
_users_tf32_before_build: bool | None = None


def users_tf32_setting() -> bool:
    """Whether float32 matmuls and convolutions may run in TF32, as the user set it (TensorFlow's default:
    True): TensorFlow's switch, or, while a build's change of it is in force, the setting from before.

    The switch has two values, so a user who sets it, after such a build, to the value the build left is
    not told apart from the build, and reads as the setting from before: `mixed_precision: {tf32: ...}`
    says it explicitly.

    Example:
        >>> users_tf32_setting() in (True, False)
        True
    """
    import tensorflow as tf

    if _users_tf32_before_build is not None:
        return _users_tf32_before_build
    return bool(tf.config.experimental.tensor_float_32_execution_enabled())


def put_tf32_in_force(tf32: bool) -> None:
    """Sets TensorFlow's TF32 switch for a model built or run under a plan whose `tf32` is `tf32`, keeping
    the user's setting for `users_tf32_setting`. It stays set: the model trains under it."""
    import tensorflow as tf

    global _users_tf32_before_build
    users = users_tf32_setting()
    if bool(tf.config.experimental.tensor_float_32_execution_enabled()) != tf32:
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
    _users_tf32_before_build = None if tf32 == users else users
