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
global ones, and those its functions hold) are put back after (`python_generators_kept`).
"""

from __future__ import annotations

import contextlib
import types
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


@contextlib.contextmanager
def python_generators_kept() -> Iterator[None]:
    """Puts the random generators Python code run by TensorFlow draws from back as they were before the block
    (an `apply`): Python's and NumPy's global ones, and those the Python functions TensorFlow calls hold.

    A pipeline's own Python code (a `tf.numpy_function` augmentation, a `from_generator` generator) draws from
    them each time tfopt reads it, and no copy of the pipeline has generators of its own for them: without
    this, the user's training draws what plain Keras' would draw later. Held ones are found from every Python
    function TensorFlow holds to call (its registry of `numpy_function`s, `py_function`s and generators: the
    pipeline's, and a model's), through their closures, defaults, the globals they name and the attributes of
    what they hold (keras.io's 3D CT classifier draws from `random`; NumPy recommends a `default_rng()` of
    one's own). Other state the Python code keeps (a counter, a generator's position) moves on as tfopt reads.
    """
    import random

    import numpy as np

    python_state, numpy_state = random.getstate(), np.random.get_state()
    states = [(generator, _state(generator)) for generator in _generators_held()]
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        for generator, state in states:
            _put_back(generator, state)


# How far from a function, and through how many objects, generators are looked for: a closure over a model
# must not walk all of it.
_MOST_STEPS, _MOST_OBJECTS = 6, 20_000


def _generators_held() -> list[Any]:
    """The NumPy and Python random generators reachable from the Python functions TensorFlow holds to call."""
    import random

    import numpy as np
    from tensorflow.python.ops import script_ops

    frontier = list(getattr(getattr(script_ops, "_py_funcs", None), "_funcs", {}).values())
    kinds = (np.random.Generator, np.random.RandomState, random.Random)
    found: list[Any] = []
    seen: set[int] = set()
    for _ in range(_MOST_STEPS):
        following = []
        for obj in frontier:
            if id(obj) in seen or len(seen) >= _MOST_OBJECTS:
                continue
            seen.add(id(obj))
            if isinstance(obj, kinds):
                found.append(obj)
            else:
                following.extend(_parts(obj))
        frontier = following
    return found


def _parts(obj: Any) -> list[Any]:
    """What a Python object holds that its code may draw from."""
    if isinstance(obj, types.MethodType):
        return [obj.__self__, obj.__func__]
    if isinstance(obj, types.FunctionType):
        cells = []
        for cell in obj.__closure__ or ():
            with contextlib.suppress(ValueError):  # a cell not assigned yet
                cells.append(cell.cell_contents)
        named = [obj.__globals__[name] for name in _names(obj.__code__) if name in obj.__globals__]
        return [*cells, *(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values(), *named]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, (types.ModuleType, type)):
        return []
    return list(getattr(obj, "__dict__", {}).values())


def _names(code: types.CodeType) -> set[str]:
    """The global names a function's code (and the functions it defines) refers to."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


def _state(generator: Any) -> Any:
    import random

    import numpy as np

    if isinstance(generator, np.random.Generator):
        return generator.bit_generator.state
    if isinstance(generator, random.Random):
        return generator.getstate()
    return generator.get_state()


def _put_back(generator: Any, state: Any) -> None:
    import random

    import numpy as np

    if isinstance(generator, np.random.Generator):
        generator.bit_generator.state = state
    elif isinstance(generator, random.Random):
        generator.setstate(state)
    else:
        generator.set_state(state)


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
