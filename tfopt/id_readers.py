"""Which layers of a model read ids (or raw features) and which carry them there: the layers a mixed policy
must leave at float32.

Under a mixed policy Keras casts a layer's floating inputs to its 16-bit compute dtype before `call`, and
bfloat16 rounds integers past 256 (15000 and 15001 both become 14976). Float inputs carry ids in public Keras
code all the time (keras-io's recommenders take the user and movie ids as columns of one float `Input`), and
data sorted by id (MovieLens') shows ids past 256 only after the first batch, which is all tfopt's first-batch
check (`tfopt.fidelity`) sees: rounding them must be prevented, not detected.

A layer reads ids where its class says so (`Embedding`, the lookups, hashing, ...) or where its own call()
turns a float input into integers (user code: a custom layer's `one_hot(cast(x, "int32"))`, `digitize`, a
`Lambda`). Every layer holding one reads them too (Keras casts at the outer layer's call already), and a
layer that passes a reader's input on to it carries them: a functional graph tells those by its nodes (a
nested model is walked through); a model's or custom layer's own call() by a graph of the forward pass,
traced (nothing runs) with each layer's call() recorded, where a layer with weights (a preprocessing block
that scales its features and passes the id column on) carries the ids its weights never touch.

Only where Keras casts a layer's float inputs (`autocast` and `_convert_input_args`: not `Embedding`'s, nor
the lookups', nor a functional model's) must it stay float32: those read their ids exactly under any policy.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from tfopt.policies import has_call

_log = logging.getLogger("tfopt")

if TYPE_CHECKING:
    import keras

# Layers that read integers (ids, indices, categories, strings) or raw features.
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


def reading_and_carrying_ids(model: keras.Model, layers: list[Any], sample_inputs: Any) -> tuple[set[int], set[int]]:
    """The ids (`id()`) of the model's layers that read ids or raw features (or hold a layer that does) and of
    those carrying them there, each where Keras would cast its float inputs to 16 bits.

    Args:
        model: A built model.
        layers: The layers a mixed policy would cast: those of user code among them are traced.
        sample_inputs: One batch of the model's inputs (or None: a functional model's own inputs are traced).

    Returns:
        `(reading, carrying)`, disjoint.
    """
    # Only user code has a call() to read: casts in its layers', ids carried in its model's (to a reader).
    calls, whole = _traced_calls(model, sample_inputs) if any(map(_is_user_code, [model, *layers])) else ([], True)
    casting = {id(call.layer) for call in calls if _is_user_code(call.layer) and _makes_integers(call.inputs, call.ops)}
    holding = _holding_id_readers(model, casting)
    carrying = _carrying_in_the_functional_graph(model, holding) | _carrying_in_traced_calls(calls, holding)
    if not whole and holding:
        # A forward pass that cannot be traced (a call() reading `.numpy()`, compiled to run eagerly) hides where
        # its ids go: every layer passing on what it is given, weights unread, may carry them.
        carrying |= {id(layer) for layer in layers if not layer.weights}
    rounding = {id(layer) for layer in model._flatten_layers(include_self=True, recursive=True) if _casts_inputs(layer)}
    return holding & rounding, (carrying & rounding) - holding


def _casts_inputs(layer: keras.Layer) -> bool:
    """Whether Keras casts the layer's float inputs to its compute dtype before its call(): where `autocast` and
    `_convert_input_args` say so, and always for its data layers (`CategoryEncoding`, `Discretization`) in a
    graph, which is how `fit` runs them."""
    from keras.src.layers.preprocessing.data_layer import DataLayer

    return isinstance(layer, DataLayer) or bool(layer.autocast and getattr(layer, "_convert_input_args", True))


def _is_user_code(layer: keras.Layer) -> bool:
    """Whether a layer's call() is the user's: a class of their own or a `Lambda`'s function."""
    import keras

    return isinstance(layer, keras.layers.Lambda) or not type(layer).__module__.startswith("keras.")


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


def _id_reader_classes() -> tuple[type, ...]:
    """The Keras classes of `_READS_IDS_OR_RAW_FEATURES`."""
    import keras

    return tuple(
        getattr(getattr(keras, module), name)
        for module, name in (path.split(".") for path in _READS_IDS_OR_RAW_FEATURES)
    )


def _carrying_in_the_functional_graph(model: keras.Model, reading: set[int]) -> set[int]:
    """The ids of the layers a functional graph passes the inputs of the `reading` layers through, from the model's
    inputs on (a Lambda taking the user-id column of a float Input). The way back goes through a nested model and
    stops at a layer with weights, which computes features rather than carrying ids (user code's is traced:
    `_carrying_in_traced_calls`)."""
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
    # A `keras.ops` call of the graph's own turning floats into integers (`ops.cast(column, "int32")`) reads ids too.
    graphs = [graph for graph in (model, *layers) if isinstance(graph, keras.src.models.functional.Functional)]
    tensors += [
        tensor
        for graph in graphs
        for operation in graph._operations
        if not isinstance(operation, keras.layers.Layer)
        for node in operation._inbound_nodes
        if any("int" in str(output.dtype) for output in node.output_tensors)
        for tensor in node.input_tensors
        if "float" in str(tensor.dtype)
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
        if isinstance(operation, keras.Model) and getattr(operation, "outputs", None):
            carrying.add(id(operation))  # the way goes on inside it, to its inputs and on in the graph around
            tensors.append(keras.tree.flatten(operation.outputs)[history[2]])
            continue
        if isinstance(operation, keras.layers.Layer):
            if operation.weights:  # it computes features (a Dense before a Normalization), carries no ids
                continue
            carrying.add(id(operation))
        tensors.extend(operation._inbound_nodes[node_index].input_tensors)
    return carrying


class _Call(NamedTuple):
    """One call() of a layer in a traced forward pass: its float inputs, its outputs and the ops it made."""

    layer: Any
    inputs: list[Any]
    outputs: list[Any]
    ops: list[Any]


def _traced_calls(model: keras.Model, sample_inputs: Any) -> tuple[list[_Call], bool]:
    """Every layer's call() in a graph of the model's forward pass, traced (no op runs: no variable changes; the
    losses `add_loss` adds meanwhile are cleared), and whether the whole pass was traced: one that cannot be (a
    call() reading `.numpy()`, compiled to run eagerly) gives what it recorded before it failed."""
    import tensorflow as tf

    calls: list[_Call] = []

    def recording(layer: keras.Layer) -> Any:
        call = layer.call

        def record(*args: Any, **kwargs: Any) -> Any:
            graph = tf.compat.v1.get_default_graph()
            before = len(graph.get_operations())
            result = call(*args, **kwargs)
            floats = [t for t in _graph_tensors((args, kwargs)) if t.dtype.is_floating]
            outputs = _graph_tensors(result)
            calls.append(_Call(layer, floats, outputs, graph.get_operations()[before:]))
            return result

        return record

    import keras

    layers = [
        layer
        for layer in model._flatten_layers(include_self=True, recursive=True)
        if not isinstance(layer, keras.layers.InputLayer)
    ]
    try:
        with calls_recorded(layers, recording):
            for forward, specs in _forward_passes(model, sample_inputs):
                tf.function(lambda batch, forward=forward: forward(batch, training=False)).get_concrete_function(specs)
    except Exception as error:  # noqa: BLE001 - see the docstring
        _log.debug("mixed_precision: the forward pass could not be traced to find the ids it carries: %s", error)
        return calls, False
    finally:
        model._clear_losses()  # those `add_loss` added while tracing belong to the trace's graph
    return calls, True


@contextlib.contextmanager
def calls_recorded(layers: list[Any], recording: Callable[[Any], Callable[..., Any]]) -> Iterator[None]:
    """Each layer's call() replaced, for the block, by `recording(layer)` (which calls the layer's own), and put
    back as it was (a `call` the layer set on itself, `self.call = tf.function(self.call)`, too)."""
    previous = [layer.__dict__.get("call", _NONE) for layer in layers]
    for layer in layers:
        object.__setattr__(layer, "call", recording(layer))
    try:
        yield
    finally:
        for layer, call in zip(layers, previous):
            if call is _NONE:
                layer.__dict__.pop("call", None)
            else:
                object.__setattr__(layer, "call", call)


_NONE = object()


def _graph_tensors(structure: Any) -> list[Any]:
    """The graph tensors of a structure, those of sparse and ragged tensors included."""
    import tensorflow as tf

    return [item for item in tf.nest.flatten(structure, expand_composites=True) if isinstance(item, tf.Tensor)]


def _forward_passes(model: keras.Model, sample_inputs: Any) -> Iterator[tuple[Any, Any]]:
    """The models whose forward passes reach the model's layers, each with the specs of its inputs: the model's
    own (of `sample_inputs`, or of its functional inputs), or where it has no call() (a GAN's), its functional
    parts'."""
    import keras
    import tensorflow as tf

    def specs(functional: keras.Model) -> Any:
        def spec(x: Any) -> Any:
            return (tf.SparseTensorSpec if x.sparse else tf.TensorSpec)(x.shape, x.dtype)

        return keras.tree.map_structure(spec, functional._inputs_struct)

    if has_call(model):
        if sample_inputs is not None:
            yield model, tf.nest.map_structure(tf.type_spec_from_value, sample_inputs)
        elif getattr(model, "inputs", None):
            yield model, specs(model)
        return
    for part in model._flatten_layers(include_self=False, recursive=False):
        if isinstance(part, keras.Model) and getattr(part, "inputs", None):
            yield part, specs(part)


# TensorFlow ops turning floats into integers (or strings, to hash): where a float input becomes ids.
_MAKING_INTEGERS = frozenset({"Cast", "Bucketize", "AsString", "LowerBound", "UpperBound", "HistogramFixedWidth"})


def _makes_integers(floats: list[Any], ops: list[Any]) -> bool:
    """Whether a way leads from the `floats` through the `ops` to an op turning floats into integers (a cast, a
    `digitize`), through no op that reads a weight (which computes features from them, as a layer with weights
    does on the functional graph). Where the way enters a function of the graph's (a `map_fn`'s loop, a
    `tf.function` it calls), any such op on floats in it counts."""
    return any(
        _turns_floats_into_integers(op) or any(map(_turns_floats_into_integers, _called_ops(op)))
        for op in _ops_reached(floats, within=ops)
    )


def _turns_floats_into_integers(op: Any) -> bool:
    import tensorflow as tf

    return (
        op.type in _MAKING_INTEGERS
        and any(tensor.dtype.is_floating for tensor in op.inputs)
        and any(tensor.dtype.is_integer or tensor.dtype == tf.string for tensor in op.outputs)
    )


def _called_ops(op: Any) -> Iterator[Any]:
    """The ops of the functions an op calls (a `While`'s body, a `PartitionedCall`'s function), and of theirs."""
    for value in op.node_def.attr.values():
        function = op.graph._get_function(value.func.name) if value.HasField("func") else None
        for inner in getattr(getattr(function, "graph", None), "get_operations", list)():
            yield inner
            yield from _called_ops(inner)


def _carrying_in_traced_calls(calls: list[_Call], reading: set[int]) -> set[int]:
    """The ids of the layers passing a float input on, through ops of their own reading no weight, to an output
    that reaches, through ops reading no weight, a float input of a `reading` layer (or of one carrying) or of
    an op turning floats into integers (a model's own `one_hot(cast(self.column(x), "int32"))`) in the traced
    graph: a subclassed model's `self.embed(self.pick(x))`, where `pick` is a `Lambda` taking the id column."""
    targets = {tensor.ref() for call in calls if id(call.layer) in reading for tensor in call.inputs}
    targets |= {
        tensor.ref()
        for call in calls
        for op in call.ops
        if _turns_floats_into_integers(op)
        for tensor in op.inputs
        if tensor.dtype.is_floating
    }
    if not targets:
        return set()
    passed_on = {id(call): _passed_on(call) for call in calls}
    carrying: set[int] = set()
    grown = True
    while grown:
        grown = False
        for call in calls:
            key = id(call.layer)
            if key not in reading and key not in carrying and _reaches(passed_on[id(call)], targets):
                carrying.add(key)
                targets |= {tensor.ref() for tensor in call.inputs}
                grown = True
    return carrying


def _passed_on(call: _Call) -> list[Any]:
    """The outputs of a call its float inputs reach through its own ops, reading no weight (or that they are)."""
    reached = {tensor.ref() for tensor in call.inputs}
    reached |= {tensor.ref() for op in _ops_reached(call.inputs, within=call.ops) for tensor in op.outputs}
    return [tensor for tensor in call.outputs if tensor.ref() in reached]


def _reaches(tensors: list[Any], targets: set[Any]) -> bool:
    """Whether a way leads from the `tensors` to one of the `targets` (tensor refs), through no op reading a weight."""
    return any(tensor.ref() in targets for tensor in tensors) or any(
        tensor.ref() in targets for op in _ops_reached(tensors) for tensor in op.outputs
    )


def _ops_reached(tensors: list[Any], within: list[Any] | None = None) -> Iterator[Any]:
    """The ops a way from the `tensors` reaches (among `within` only, where given), each once, through no op
    that reads a weight; lazily, so that a search ends at what it looks for."""
    allowed = None if within is None else {op.name for op in within}
    seen: set[str] = set()
    tensors = list(tensors)
    while tensors:
        for op in tensors.pop().consumers():
            if op.name in seen or (allowed is not None and op.name not in allowed) or any(map(_is_a_weight, op.inputs)):
                continue
            seen.add(op.name)
            yield op
            tensors.extend(op.outputs)


def _is_a_weight(tensor: Any) -> bool:
    """Whether a graph tensor is a variable's value, read (and perhaps cast) in the traced call."""
    while tensor.op.type in ("Identity", "Cast"):
        tensor = tensor.op.inputs[0]
    return tensor.op.type == "ReadVariableOp"
