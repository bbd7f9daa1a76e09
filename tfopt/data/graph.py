"""What a `tf.data` pipeline's graph holds: its ops, and what makes a map function stateful.

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
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

PYTHON = "python"
RANDOM = "random"
OTHER = "other"

# `numpy_function(stateful=False)` (PyFuncStateless) is stateless by the user's own declaration.
_PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc"})
_RANDOM_OPS = frozenset({
    "RandomCrop", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "RandomShuffle", "RandomStandardNormal",
    "RandomUniform", "RandomUniformInt", "TruncatedNormal", "ParameterizedTruncatedNormal", "Multinomial",
    "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2", "NonDeterministicInts", "RngSkip",
    "RngReadAndSkip", "StatefulRandomBinomial", "StatefulStandardNormal", "StatefulStandardNormalV2",
    "StatefulTruncatedNormal", "StatefulUniform", "StatefulUniformFullInt", "StatefulUniformInt",
    "AllCandidateSampler", "FixedUnigramCandidateSampler", "LearnedUnigramCandidateSampler",
    "LogUniformCandidateSampler", "ThreadUnsafeUnigramCandidateSampler", "UniformCandidateSampler",
})
# Registered as stateful, yet the same inputs give the same outputs whatever the call order.
_ORDER_FREE_OPS = frozenset({
    "Assert", "StatelessRandomGetAlg", "ReadVariableOp", "VariableShape", "LookupTableFindV2", "LookupTableSizeV2",
    "_Arg", "_Retval", "NoOp",
})
# Calls and control flow: their own statefulness is their callees'.
_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "While",
                       "StatelessWhile", "Case", "StatelessCase"})


def serialize(dataset: Any) -> Any:
    """The dataset's `GraphDef`, stateful functions included, devices kept.

    `external_state_policy` only decides what happens when a function holds state: WARN (0) logs and
    IGNORE (1) both keep the stateful ops in the graph, FAIL (2) raises ("RandomUniformInt is
    stateful"). Captured resources (a shuffle's seed generator, a memory cache, a variable) are written
    as handles to the live resources of this process, which is why the graph is only valid here.
    Devices are kept: `strip_device_assignment=True` leaves py_function nodes with the malformed
    device '/device::0', which fails when the rebuilt dataset is iterated (TF 2.21).

    Raises:
        tf.errors.OpError: a dataset op in the pipeline cannot be serialized (e.g. the generator that
            `tf.data.experimental.copy_to_device` inserts).

    Example:
        >>> graph = serialize(tf.data.Dataset.range(3).map(lambda i: i + 1))
        >>> [node.op for node in graph.node if "Dataset" in node.op]
        ['RangeDataset', 'MapDataset']
    """
    serialized = tf.raw_ops.DatasetToGraphV2(
        input_dataset=dataset._variant_tensor,
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE.value,
        strip_device_assignment=False,
    )
    return tf.compat.v1.GraphDef.FromString(serialized.numpy())


def pipeline_ops(graph: Any) -> set[str]:
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


def function_ops(graph: Any, name: str) -> set[str]:
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
            if node.op not in _CALL_OPS and node.op not in functions:
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
