"""What a `tf.data` pipeline's graph holds: its ops, what makes a map function stateful, how large its elements are.

tf.data's own `map_parallelization` rewrite only parallelizes maps whose function is stateless, and
`tf.py_function`, `tf.numpy_function` and every `tf.random.*`/`tf.image.random_*` op are registered
as stateful: the usual augmentation map stays sequential. tfopt reads the pipeline's graph itself and
sorts each function's stateful ops into kinds that tell whether running the function in parallel
changes its output:

* `python`: a Python function (py_function, numpy_function). Parallel calls are safe unless the
  function shares mutable Python state between calls, which tfopt cannot see.
* `random`: stateful random draws. Parallel calls draw the same numbers from the same kernel, handed
  to the elements in a different order: the distribution is kept, the exact draw per element is not.
* anything else stateful (a queue, a variable assignment, an iterator): tfopt cannot say, so it
  leaves such a map as it is.

Ops that are registered as stateful but read only, or are stateful only so that TF does not fold them
(`Assert`, `StatelessRandomGetAlg`, table and variable reads), count as stateless, as TF's own rewrite
counts `Assert`.

The graph holds every tensor the pipeline was built from as a constant: `from_tensor_slices` over
in-memory arrays puts the arrays themselves in it. Reading it copies them several times, in seconds and
gigabytes of peak memory for arrays of a few hundred MiB, and a graph over protobuf's 2 GiB limit cannot
be serialized at all: it fails only after the copies, with an empty result (docs/recipes/data_pipeline.md
has the measurements). So `read` refuses a graph holding more than `MAX_GRAPH_BYTES`, before serializing where
the pipeline's own objects show the arrays.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tfopt.errors import describe_error

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

PYTHON = "python"
RANDOM = "random"
OTHER = "other"

# `numpy_function(stateful=False)` (PyFuncStateless) is stateless by the user's own declaration.
_PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc"})
_RANDOM_OPS = frozenset(
    {
        "RandomCrop",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomShuffle",
        "RandomStandardNormal",
        "RandomUniform",
        "RandomUniformInt",
        "TruncatedNormal",
        "ParameterizedTruncatedNormal",
        "Multinomial",
        "SampleDistortedBoundingBox",
        "SampleDistortedBoundingBoxV2",
        "NonDeterministicInts",
        "RngSkip",
        "RngReadAndSkip",
        "StatefulRandomBinomial",
        "StatefulStandardNormal",
        "StatefulStandardNormalV2",
        "StatefulTruncatedNormal",
        "StatefulUniform",
        "StatefulUniformFullInt",
        "StatefulUniformInt",
        "AllCandidateSampler",
        "FixedUnigramCandidateSampler",
        "LearnedUnigramCandidateSampler",
        "LogUniformCandidateSampler",
        "ThreadUnsafeUnigramCandidateSampler",
        "UniformCandidateSampler",
    }
)
# Registered as stateful, yet the same inputs give the same outputs whatever the call order.
_ORDER_FREE_OPS = frozenset(
    {
        "Assert",
        "StatelessRandomGetAlg",
        "ReadVariableOp",
        "VariableShape",
        "LookupTableFindV2",
        "LookupTableSizeV2",
        "_Arg",
        "_Retval",
        "NoOp",
    }
)
# Calls and control flow: their own statefulness is their callees'.
CALL_OPS = frozenset(
    {
        "PartitionedCall",
        "StatefulPartitionedCall",
        "If",
        "StatelessIf",
        "While",
        "StatelessWhile",
        "Case",
        "StatelessCase",
    }
)
# The most data a graph may hold for tfopt to read and rebuild it in this process (see the module docstring).
MAX_GRAPH_BYTES = 256 * 2**20
# Ops that hand on their input's elements with the same shapes, between a pipeline's last batch and its output.
_SHAPE_KEEPING_OPS = frozenset(
    {
        "PrefetchDataset",
        "OptionsDataset",
        "CacheDatasetV2",
        "RepeatDataset",
        "TakeDataset",
        "SkipDataset",
        "ShuffleDatasetV3",
        "ShardDataset",
        "FilterDataset",
        "AssertCardinalityDataset",
        "IgnoreErrorsDataset",
        "TakeWhileDataset",
    }
)
# Batching ops whose second input is the batch size.
_BATCH_OPS = frozenset({"BatchDatasetV2", "ParallelBatchDataset", "PaddedBatchDatasetV2"})
_NOT_SIZED = (tf.string, tf.variant, tf.resource)
# The names of dataset ops (not every op with "Dataset" in its name is one: DatasetToGraphV2, ...).
DATASET_OP = re.compile(r"Dataset(V\d+)?$")


# Ops that assign a variable: stateful for a reason their names alone do not tell a user.
VARIABLE_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
# A tf.random.Generator's draws read its state variable (and skip it on in place): reads of a variable set elsewhere.
_VARIABLE_READS = frozenset({"ReadVariableOp", "VariableShape", "VarIsInitializedOp", "RngReadAndSkip", "RngSkip"})
# Tables a user can insert into as training goes (`tf.lookup.experimental.MutableHashTable`, `DenseHashTable`):
# `DatasetToGraphV2` writes them by value, as they stand. Keras' lookup layers hold static `HashTableV2`s.
MUTABLE_TABLES = frozenset({"MutableHashTableV2", "MutableHashTableOfTensorsV2", "MutableDenseHashTableV2"})


class GraphTooLarge(ValueError):
    """The pipeline's graph holds more data than tfopt reads in-process; the message says how much."""


_RESOURCE_ELSEWHERE = re.compile(
    r"Trying to access resource (?P<resource>\S+) located in device \S*device:(?P<device>\w+:\d+) from device"
)


def read(dataset: tf.data.Dataset) -> tuple[Any, str | None]:
    """The dataset's `GraphDef` and None, or None and why it cannot be read. Never raises.

    Example:
        >>> graph, why = read(tf.data.Dataset.range(3).apply(tf.data.experimental.copy_to_device("/cpu:0")))
        >>> graph is None, why.startswith("its graph cannot be serialized")
        (True, True)
    """
    try:
        return serialize(dataset), None
    except GraphTooLarge as error:
        return None, str(error)
    except Exception as error:  # noqa: BLE001 - an OpError, a protobuf DecodeError: the caller leaves the pipeline as it is
        elsewhere = _RESOURCE_ELSEWHERE.search(str(error))
        if elsewhere:
            return None, (
                f"its graph cannot be serialized: a function of it uses {elsewhere['resource']} on "
                f"{elsewhere['device']}, and tf.data writes graphs on the CPU (a Keras preprocessing layer made "
                "on a GPU host keeps its seed generator there); make it under `with tf.device('/cpu:0'):`"
            )
        return None, f"its graph cannot be serialized ({describe_error(error)})"


def serialize(dataset: tf.data.Dataset) -> GraphDef:
    """The dataset's `GraphDef`, stateful functions included, devices kept.

    `external_state_policy` only decides what happens when a function holds state: WARN (0) logs and
    IGNORE (1) both keep the stateful ops in the graph, FAIL (2) raises ("RandomUniformInt is
    stateful"). Captured resources (a shuffle's seed generator, a memory cache) are written as handles
    to the live resources of this process, which is why the graph is only valid here; a captured variable
    is written as a new variable holding its current value.
    Devices are kept: `strip_device_assignment=True` leaves py_function nodes with the malformed
    device '/device::0', which fails when the rebuilt dataset is iterated (TF 2.21).

    Raises:
        GraphTooLarge: The graph would hold more than `MAX_GRAPH_BYTES`, or over protobuf's 2 GiB limit.
        tf.errors.OpError: a dataset op in the pipeline cannot be serialized (e.g. the generator that
            `tf.data.experimental.copy_to_device` inserts).

    Example:
        >>> graph = serialize(tf.data.Dataset.range(3).map(lambda i: i + 1))
        >>> [node.op for node in graph.node if "Dataset" in node.op]
        ['RangeDataset', 'MapDataset']
    """
    limit = MAX_GRAPH_BYTES
    held = _held_bytes(dataset)
    if held > limit:
        raise GraphTooLarge(_too_large(f"holds {_size(held)} of in-memory data", limit))
    serialized = tf.raw_ops.DatasetToGraphV2(
        input_dataset=dataset._variant_tensor,
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE.value,
        strip_device_assignment=False,
    )
    # Measured in TensorFlow, before Python copies it. Protobuf serializes a GraphDef over 2 GiB as nothing.
    size = int(tf.strings.length(serialized))
    if size == 0:
        raise GraphTooLarge(_too_large("is over protobuf's 2 GiB limit", limit))
    if size > limit:
        raise GraphTooLarge(_too_large(f"holds {_size(size)}", limit))
    return tf.compat.v1.GraphDef.FromString(serialized.numpy())


def _too_large(what: str, limit: int) -> str:
    return (
        f"its graph {what} (arrays passed to from_tensor_slices or captured by its functions are part of it), "
        f"more than the {_size(limit)} tfopt copies to rewrite a pipeline; pass "
        "num_parallel_calls=tf.data.AUTOTUNE to your own maps instead"
    )


def _size(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:.0f} MiB" if size_bytes >= 2**20 else f"{size_bytes / 2**10:.0f} KiB"


def _held_bytes(dataset: tf.data.Dataset) -> int:
    """Bytes of the numeric tensors the pipeline's Python objects hold: the arrays of `from_tensor_slices`
    and `from_tensors`, and tensors its functions capture. Known before serializing, unlike the graph's size.

    It reads tf.data's private structure (`_inputs`, `_functions`, `_tensors`); where that changes it
    finds less, and the serialized graph's own size still bounds what Python copies.
    """
    total, pending, seen = 0, [dataset], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        tensors = list(getattr(current, "_tensors", ()))
        for function in _private_list(current, "_functions"):
            tensors.extend(getattr(getattr(function, "function", None), "captured_inputs", ()))
        total += sum(
            tensor.shape.num_elements() * tensor.dtype.size
            for tensor in tensors
            if tensor.dtype not in _NOT_SIZED and tensor.shape.is_fully_defined()
        )
        pending.extend(_private_list(current, "_inputs"))
    return total


def _private_list(dataset: tf.data.Dataset, method: str) -> list:
    try:
        return list(getattr(dataset, method)())
    except Exception:  # noqa: BLE001 - a TensorFlow without this private method: find less, never fail
        return []


def output_chain(graph: GraphDef) -> Iterator[Any]:
    """The top-level dataset nodes from the pipeline's output back to its source, by first inputs.

    Example:
        >>> graph = serialize(tf.data.Dataset.range(4).batch(2).prefetch(1))
        >>> [node.op for node in output_chain(graph)]
        ['PrefetchDataset', 'BatchDatasetV2', 'RangeDataset']
    """
    nodes = {node.name: node for node in graph.node}
    current = next(node for node in graph.node if node.op == "_Retval")
    while current.input:
        current = nodes[current.input[0].split(":")[0]]
        if not DATASET_OP.search(current.op):
            return
        yield current


def element_bytes(element_spec: Any, graph: GraphDef | None = None) -> tuple[int | None, str | None]:
    """Bytes of one element, from static shapes alone: (bytes, None), or (None, why they are unknown).

    No element is read: reading one runs the user's py_function, and it moves a reshuffling shuffle's seed
    generator on, so that the first epoch of a pipeline tuned that way was the original's second
    (measured). A batch dimension that tf.data leaves open (the last batch may be partial) is bounded by
    the batch size of the pipeline's last batch, read from `graph`.

    Example:
        >>> data = tf.data.Dataset.range(8).map(lambda i: tf.fill([3], tf.cast(i, tf.float32))).batch(4)
        >>> element_bytes(data.element_spec, serialize(data))
        (48, None)
        >>> element_bytes(tf.data.Dataset.from_tensors("text").element_spec)
        (None, 'element part 1 is a tf.string tensor, whose size only its data tells')
    """
    batch_size = _last_batch_size(graph) if graph is not None else None
    total = 0
    for index, spec in enumerate(tf.nest.flatten(element_spec), start=1):
        if not isinstance(spec, tf.TensorSpec):
            return None, f"element part {index} is a {type(spec).__name__}, whose size only its data tells"
        if spec.dtype in _NOT_SIZED:
            return None, f"element part {index} is a {spec.dtype!r} tensor, whose size only its data tells"
        if spec.shape.rank is None:
            return None, f"element part {index} has an unknown rank"
        dims = spec.shape.as_list()
        if dims and dims[0] is None and batch_size is not None:
            dims[0] = batch_size
        if None in dims:
            return None, f"element part {index} has shape {spec.shape}, which is not static"
        total += math.prod(dims) * spec.dtype.size
    return total, None


def _last_batch_size(graph: GraphDef) -> int | None:
    """The batch size of the batch that makes the pipeline's elements, where nothing after it reshapes them."""
    nodes = {node.name: node for node in graph.node}
    for node in output_chain(graph):
        if node.op in _BATCH_OPS:
            size = nodes.get(node.input[1].split(":")[0])
            if size is None or size.op != "Const":
                return None
            return int(tf.make_ndarray(size.attr["value"].tensor))
        if node.op not in _SHAPE_KEEPING_OPS:
            return None
    return None


def drops_remainder(graph: GraphDef) -> bool:
    """Whether a batch of the pipeline drops its last partial batch (`drop_remainder=True`), read from the
    constant that is each batch op's last input.

    Example:
        >>> batched = [tf.data.Dataset.range(9).batch(4, drop_remainder=drop) for drop in (True, False)]
        >>> [drops_remainder(serialize(dataset)) for dataset in batched]
        [True, False]
    """
    nodes = {node.name: node for node in graph.node}
    for node in graph.node:
        if node.op in _BATCH_OPS or node.op == "MapAndBatchDataset":
            flag = nodes.get([name for name in node.input if not name.startswith("^")][-1].split(":")[0])
            if flag is not None and flag.op == "Const" and bool(tf.make_ndarray(flag.attr["value"].tensor)):
                return True
    return False


def pipeline_ops(graph: GraphDef) -> set[str]:
    """Every op name in the graph, those inside its functions included.

    Example:
        >>> graph = serialize(tf.data.Dataset.range(3).map(lambda i: i + tf.random.uniform([], 0, 9, tf.int64)))
        >>> "RandomUniformInt" in pipeline_ops(graph)
        True
    """
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


def function_ops(graph: GraphDef, name: str) -> set[str]:
    """The ops the function `name` runs, through the functions it calls, however deep.

    Example:
        >>> shuffle = tf.function(lambda x: tf.random.shuffle(x))  # a call inside the map function
        >>> graph = serialize(tf.data.Dataset.range(3).map(lambda i: shuffle(tf.stack([i, i]))))
        >>> map_node = next(node for node in graph.node if node.op == "MapDataset")
        >>> "RandomShuffle" in function_ops(graph, map_node.attr["f"].func.name)
        True
    """
    functions = {function.signature.name: function for function in graph.library.function}
    ops, pending, seen = set(), [name], set()
    while pending:
        current = pending.pop()
        if current in seen or current not in functions:
            continue
        seen.add(current)
        for node in functions[current].node_def:
            called = [value.func.name for value in node.attr.values() if value.HasField("func")]
            called += [f.name for value in node.attr.values() if value.HasField("list") for f in value.list.func]
            if node.op in functions:
                called.append(node.op)
            pending.extend(called)
            if node.op not in CALL_OPS and node.op not in functions:
                ops.add(node.op)
    return ops


def stateful_kinds(ops: set[str]) -> dict[str, set[str]]:
    """Sorts the stateful ops among `ops` into PYTHON, RANDOM and OTHER (only kinds present are keys).

    Dataset ops count as stateless: a function that builds a dataset (an interleave's, a window's)
    replays the same data each call.

    Example:
        >>> sorted(stateful_kinds({"EagerPyFunc", "RandomUniform", "QueueSizeV2", "AddV2", "Assert"}).items())
        [('other', {'QueueSizeV2'}), ('python', {'EagerPyFunc'}), ('random', {'RandomUniform'})]
    """
    from tensorflow.python.framework import op_def_registry

    kinds: dict[str, set[str]] = {}
    for op in ops:
        if op in _ORDER_FREE_OPS or "Dataset" in op:
            continue
        kind = PYTHON if op in _PYTHON_OPS else RANDOM if op in _RANDOM_OPS else None
        if kind is None:
            definition = op_def_registry.get(op)
            if definition is None or not definition.is_stateful:
                continue
            kind = OTHER
        kinds.setdefault(kind, set()).add(op)
    return kinds


def variable_uses(graph: GraphDef) -> list[set[str]]:
    """How the pipeline's functions use each variable they capture: {"read"}, {"write"} or both, each variable
    followed from the function capturing it into the functions it is passed to.

    `DatasetToGraphV2` writes a captured variable as a new one holding its value, so a pipeline rebuilt from
    its graph (in this process or on a tf.data service worker) reads a copy: one that is read and never
    assigns (a curriculum's strength a callback sets, a tf.random.Generator's state) no longer follows the
    user's, and one it writes (a Keras random layer's seed generator) goes on from the value it had. Tables,
    queues and seed generators are resources too, and not followed.

    Example:
        >>> strength = tf.Variable(2.0)
        >>> variable_uses(serialize(tf.data.Dataset.range(3).map(lambda i: tf.cast(i, tf.float32) * strength)))
        [{'read'}]
    """
    functions = {function.signature.name: function for function in graph.library.function}
    captured = {
        value.func.name for node in graph.node for value in node.attr.values() if value.HasField("func")
    } & functions.keys()
    return [
        _uses(functions, name, arg.name, seen=set())
        for name in sorted(captured)
        for arg in functions[name].signature.input_arg
        if arg.type == tf.resource.as_datatype_enum
    ]


def _uses(functions: dict[str, Any], name: str, arg: str, seen: set[tuple[str, str]]) -> set[str]:
    """How the function `name` uses its resource argument `arg`, through the calls it makes."""
    if (name, arg) in seen:
        return set()
    seen.add((name, arg))
    aliases, uses = {arg}, set()
    for node in functions[name].node_def:
        for position, value in enumerate(node.input):
            if value not in aliases:
                continue
            callee = node.attr["f"].func.name if node.op in ("PartitionedCall", "StatefulPartitionedCall") else None
            callee = node.op if node.op in functions else callee
            if node.op in ("Identity", "IdentityN"):
                aliases.add(f"{node.name}:output:{position if node.op == 'IdentityN' else 0}")
            elif node.op in VARIABLE_WRITES or node.op.startswith(("ResourceScatter", "ResourceApply")):
                uses.add("write")
            elif node.op in _VARIABLE_READS or node.op.startswith("ResourceGather") or "Dataset" in node.op:
                uses.add("read")  # a dataset built inside (an interleave's): what its functions do is not followed
            elif callee in functions and position < len(functions[callee].signature.input_arg):
                uses |= _uses(functions, callee, functions[callee].signature.input_arg[position].name, seen)
    return uses


# Ops that draw anew each pass from a seed generator: the attr that makes them, and where their seed, seed2 and
# seed generator inputs are.
_RESEEDED = {
    "ShuffleDatasetV3": ("reshuffle_each_iteration", 2),
    "ShuffleAndRepeatDatasetV2": ("reshuffle_each_iteration", 2),
    "RandomDatasetV2": ("rerandomize_each_iteration", 0),
}


def reshuffled_before_batching(graph: GraphDef) -> bool:
    """Whether the examples of the pipeline's last batch op change from one pass to the next: a shuffle that
    reshuffles each pass (or a random source drawing anew) comes before it. Without one, the partial batch that
    ends a pass holds the same examples every epoch.

    Example:
        >>> [reshuffled_before_batching(serialize(dataset)) for dataset in (
        ...     tf.data.Dataset.range(9).shuffle(9).batch(4), tf.data.Dataset.range(9).batch(4).shuffle(3))]
        [True, False]
    """
    nodes = {node.name: node for node in graph.node}
    batch = next(
        (node for node in output_chain(graph) if node.op in _BATCH_OPS or node.op == "MapAndBatchDataset"), None
    )
    pending, seen = list(batch.input) if batch is not None else [], set()
    while pending:
        node = nodes.get(pending.pop().lstrip("^").split(":")[0])
        if node is None or node.name in seen or not DATASET_OP.search(node.op):
            continue
        seen.add(node.name)
        if node.op in _RESEEDED and node.attr[_RESEEDED[node.op][0]].b:
            return True
        pending.extend(node.input)
    return False


def seeded_reshuffles(graph: GraphDef) -> list[Any]:
    """The pipeline's shuffles and random sources (`Dataset.random`) that draw anew each pass, in a sequence
    fixed by a seed (their own or the global one): their nodes.

    Each pass draws its order (its numbers) from the op's seed generator, which a pipeline rebuilt from the
    graph starts again: rebuilt for every epoch, it would give every epoch the first epoch's. An unseeded
    one draws a new random sequence each time, as the original does. Only the top level counts: a dataset
    built in an interleave's function is made anew for each element in the original too.

    Example:
        >>> len(seeded_reshuffles(serialize(tf.data.Dataset.range(8).shuffle(8, seed=1).batch(2))))
        1
    """
    nodes = {node.name: node for node in graph.node}

    def seeded(node: Any) -> bool:
        first = _RESEEDED[node.op][1]
        return any(
            nodes[seed.split(":")[0]].attr["value"].tensor.int64_val != [0] for seed in node.input[first : first + 2]
        )

    return [node for node in graph.node if node.op in _RESEEDED and node.attr[_RESEEDED[node.op][0]].b and seeded(node)]


def unseeded(dataset: tf.data.Dataset) -> Any:
    """The pipeline with its seeded reshuffles (`seeded_reshuffles`) unseeded, each with a seed generator of its
    own: every pipeline built from its graph draws a new random sequence of orders and numbers. `dataset` itself
    where it has none; a string saying why where its graph cannot be read or rebuilt.

    Example:
        >>> data = unseeded(tf.data.Dataset.range(64).shuffle(64, seed=1))
        >>> sorted(int(i) for i in data) == list(range(64)), seeded_reshuffles(serialize(data))
        (True, [])
    """
    graph, why = read(dataset)
    if graph is None:
        return why
    reseeded = seeded_reshuffles(graph)
    if not reseeded:
        return dataset
    zero = int64_constant(graph, "tfopt/unseeded", 0)
    generators = set()
    for node in reseeded:
        first = _RESEEDED[node.op][1]
        node.input[first], node.input[first + 1] = zero, zero
        generators.add(node.input[first + 2].split(":")[0])
    for node in graph.node:
        if node.name in generators:  # the handle of the original's generator: a new one of the op's own
            node.op = "DummySeedGenerator"
            node.attr.clear()
    return rebuild(dataset, graph)


def int64_constant(graph: GraphDef, name: str, value: int) -> str:
    """The name of an int64 scalar Const node holding `value`, added to the graph the first time."""
    if not any(node.name == name for node in graph.node):
        constant = graph.node.add(name=name, op="Const")
        constant.attr["dtype"].type = tf.int64.as_datatype_enum
        constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, tf.int64))
    return name


def rebuild(original: Any, graph: GraphDef) -> Any:
    """The dataset `graph` describes, or a string saying why it could not be rebuilt."""
    try:
        rebuilt = RebuiltDataset(tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString()), original)
        cardinality, expected = int(rebuilt.cardinality()), int(original.cardinality())
    except Exception as error:  # noqa: BLE001 - an OpError, a protobuf error, a structure tf.data refuses: never a crash
        return f"its rewritten graph could not be rebuilt ({describe_error(error)})"
    if cardinality != expected:
        return f"the rewritten graph has cardinality {cardinality}, the original {expected}"
    return rebuilt


class RebuiltDataset(tf.data.Dataset):
    """A dataset rebuilt from a graph (what `tf.data.experimental.from_variant` makes).

    It holds the original dataset: the graph refers to the original's resources (seed generators,
    caches) by handle, and those are freed with it. Its batches hold the original's examples
    (`same_batches_as`, which `tfopt.data.batches` counts them by).
    """

    def __init__(self, variant: Any, original: Any):
        self._element_spec = original.element_spec
        self._original = original
        self.same_batches_as = original
        super().__init__(variant)

    def _inputs(self) -> list:
        return []

    @property
    def element_spec(self) -> Any:
        return self._element_spec
