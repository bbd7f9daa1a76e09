"""The copy of a pipeline that tfopt reads, so that its checks and measurements leave the user's data as it was.

Reading a pipeline moves its state on: each iterator of a reshuffling `shuffle` (or a rerandomizing
`Dataset.random`, as tfopt's own pipelines draw their augmentation's seeds) draws the next seeds from its seed
generator, a Keras random layer in a map advances its seed variable, a memory cache fills.
`fit` then trains on the user's pipeline from where tfopt left it: a seeded shuffle's first epoch is what
plain Keras would train as its third (one iterator for the first batch, one for the check, then the
measurements), and the pipeline tfopt hands back, which shares those seed generators by handle, the same.

So tfopt reads a copy: the pipeline rebuilt from its graph (`tfopt.data.graph`), each shuffle with a seed
generator and each memory cache of its own, starting where a new pipeline starts, the variables it captures
copied with their present values. A pipeline holding none of that state is read as it is; one whose graph
cannot be read or rebuilt (too large, an op whose round trip no test checks, as the rewrite's) is read as it is
too, and moves on as before. The random generators a pipeline's Python code draws from (Python's and NumPy's
global ones, and those its functions hold) are put back after (`tfopt.data.python_generators`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tfopt.data import graph as pipeline_graph
from tfopt.data.rewrite import KNOWN_DATASET_OPS

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

# The resource each stateful dataset op takes by handle, and the op that makes it a new one of the dataset's own.
_OWN_RESOURCE = {
    "ShuffleDatasetV3": "DummySeedGenerator",
    "ShuffleAndRepeatDatasetV2": "DummySeedGenerator",
    "RandomDatasetV2": "DummySeedGenerator",
    "CacheDatasetV2": "DummyMemoryCache",
}
_STATE_CAPTURED = ("VarHandleOp", "MutableHashTable", "MutableDenseHashTable")

_kept: dict[int, tuple[Any, Any]] | None = None


def copy_to_read(dataset: Any) -> Any:
    """The copy of `dataset` to read in its place, or `dataset` itself where reading it changes nothing (or it
    cannot be copied). Within `copies_kept()`, one copy per pipeline however often it is asked for.

    Example:
        >>> data = tf.data.Dataset.range(6).shuffle(6, seed=1).batch(3)
        >>> first_epoch = [list(batch.numpy()) for batch in tf.data.Dataset.range(6).shuffle(6, seed=1).batch(3)]
        >>> _ = list(copy_to_read(data))  # read twice: the copy's seeds move on, not the pipeline's
        >>> _ = list(copy_to_read(data))
        >>> [list(batch.numpy()) for batch in data] == first_epoch
        True
    """
    if not isinstance(dataset, tf.data.Dataset):
        return dataset
    if _kept is not None and id(dataset) in _kept:
        return _kept[id(dataset)][1]
    copy = _copied(dataset)
    if _kept is not None:
        _kept[id(dataset)] = (dataset, copy)  # the pipeline held too: its id is not taken by another while kept
    return copy


@contextlib.contextmanager
def copies_kept() -> Iterator[None]:
    """Keeps the copies `copy_to_read` makes for the length of the block (an `apply`): a pipeline is read again
    each measuring round, and a graph holding arrays takes seconds to copy."""
    global _kept
    outer, _kept = _kept, {} if _kept is None else _kept
    try:
        yield
    finally:
        _kept = outer


def _copied(dataset: tf.data.Dataset) -> Any:
    graph, _ = pipeline_graph.read(dataset)
    if graph is None or not _holds_state(graph) or _untested_ops(graph):
        return dataset
    for node in graph.node:
        if node.op == "Const" and node.attr["dtype"].type == tf.resource.as_datatype_enum:
            own = _own_resource(graph, node.name)
            if own is not None:
                node.op = own
                node.attr.clear()
    rebuilt = pipeline_graph.rebuild(dataset, graph)
    return dataset if isinstance(rebuilt, str) else rebuilt


def _holds_state(graph: GraphDef) -> bool:
    """Whether reading the pipeline changes what it holds: a shuffle's or a cache's resource, captured variables
    or tables, or stateful ops in its functions (a random op's kernel draws on from where the last read left it)."""
    if any(node.op in _OWN_RESOURCE or node.op.startswith(_STATE_CAPTURED) for node in graph.node):
        return True
    ops = {node.op for function in graph.library.function for node in function.node_def}
    return bool(pipeline_graph.stateful_kinds(ops))


def _untested_ops(graph: GraphDef) -> bool:
    """Whether the pipeline has a dataset op whose graph round trip no test checks (a data service's: its copy
    would start a job of its own)."""
    ops = pipeline_graph.pipeline_ops(graph)
    return any(pipeline_graph.DATASET_OP.search(op) and op not in KNOWN_DATASET_OPS for op in ops)


def _own_resource(graph: GraphDef, name: str) -> str | None:
    """The op making a new resource for the one handle `name` passes, where a stateful dataset op takes it."""
    for node in graph.node:
        if node.op in _OWN_RESOURCE and any(value.split(":")[0] == name for value in node.input):
            return _OWN_RESOURCE[node.op]
    return None
