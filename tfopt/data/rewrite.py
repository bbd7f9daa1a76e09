"""Parallelizes a `tf.data` pipeline that tfopt did not build, by rewriting its graph.

`tf.data.Options` cannot do it: TF's `map_parallelization` rewrite skips every map whose function is
stateful, and py_function, numpy_function and every `tf.random`/`tf.image.random_*` op are. So the
usual augmentation map stays sequential (measured on an H100 host, the tf.data guide's py_function
case: 220 elements/s after `tf.data.Options`, 2,831 with `num_parallel_calls`). This module takes the
pipeline's graph (`DatasetToGraphV2`), turns each sequential `MapDataset` that is safe to run in
parallel into a `ParallelMapDatasetV2` (AUTOTUNE calls, order kept) and each `BatchDatasetV2` into a
`ParallelBatchDataset`, and rebuilds the dataset in this process (`DatasetFromGraph`), with the same
element_spec. What is safe (see `tfopt.data.graph`):

* a map without state: always; its output is identical, element by element, in the same order;
* a map whose only state is random draws (`parallel_random_maps`, default on): the draws keep their
  distribution, not their assignment to elements;
* a map calling Python (`parallel_python_maps`, default on): identical unless the Python function
  shares mutable state between calls, which tfopt cannot see;
* a map with other state (a queue, an iterator, a variable assignment) or `synchronous=True`: never.

Only the pipeline's top level is rewritten: maps inside an interleave's or flat_map's function build
one small dataset per input element and stay as they are. A pipeline tfopt cannot rebuild (a dataset op
it has not verified, a graph that cannot be serialized) is returned as it was, with the reason.

The rebuilt graph refers to live resources of this process (a shuffle's seed generator, a memory cache,
py_function tokens), so the rebuilt dataset keeps the original alive and is valid in this process only.
"""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from tfopt.data import graph as pipeline_graph

# Dataset ops verified to survive the graph round trip in-process (tests/data/test_rewrite.py). An op
# outside this set may hold state the round trip does not carry (a snapshot's files, a data service):
# the pipeline is left as it was rather than guessed at.
KNOWN_DATASET_OPS = frozenset({
    "RangeDataset", "TensorDataset", "TensorSliceDataset", "SparseTensorSliceDataset", "TFRecordDataset",
    "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDatasetV2", "RandomDataset", "RandomDatasetV2",
    "GeneratorDataset", "MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2", "FilterDataset",
    "ParallelFilterDataset", "FlatMapDataset", "InterleaveDataset", "ParallelInterleaveDatasetV2",
    "ParallelInterleaveDatasetV3", "ParallelInterleaveDatasetV4", "BatchDatasetV2", "ParallelBatchDataset",
    "PaddedBatchDatasetV2", "MapAndBatchDataset", "UnbatchDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
    "ShuffleAndRepeatDatasetV2", "RepeatDataset", "CacheDatasetV2", "TakeDataset", "SkipDataset", "ZipDataset",
    "ConcatenateDataset", "PrefetchDataset", "OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset", "DirectedInterleaveDataset", "ShardDataset", "RebatchDatasetV2",
    "AssertCardinalityDataset", "WindowDataset", "ScanDataset", "GroupByWindowDataset", "IgnoreErrorsDataset",
    "TakeWhileDataset", "UniqueDataset",
})
# Between these and the graph's output a prefetch still ends the pipeline.
_PASS_THROUGH_OPS = frozenset({"OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
                               "PrivateThreadPoolDataset"})
_AUTOTUNE_NODE = "tfopt/num_parallel_calls_autotune"
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")


def parallelize(dataset: Any, *, prefetch_batches: int, parallel_random_maps: bool = True,
                parallel_python_maps: bool = True) -> tuple[Any, list[str]]:
    """Returns the dataset with its sequential maps and batches made parallel, ending with a prefetch.

    Idempotent: a pipeline with nothing left to rewrite is returned as the same object.

    Args:
        dataset: Any `tf.data.Dataset`.
        prefetch_batches: Elements the final prefetch holds, when the pipeline does not end with one.
        parallel_random_maps: Parallelize maps whose only state is random ops. False keeps them
            sequential, so that each element gets exactly the draw it got before.
        parallel_python_maps: Parallelize maps that call py_function/numpy_function. Set False when the
            Python function keeps mutable state shared between calls (a counter, a list it appends to).

    Returns:
        (dataset, notes): the rewritten dataset (or `dataset` itself), and what was done and why.

    Example:
        >>> data = tf.data.Dataset.range(4).map(lambda i: tf.py_function(lambda x: x * 2, [i], tf.int64))
        >>> fast, notes = parallelize(data, prefetch_batches=2)
        >>> [int(x) for x in fast], notes[0].startswith("parallel map")
        ([0, 2, 4, 6], True)
    """
    try:
        graph = pipeline_graph.serialize(dataset)
    except tf.errors.OpError as error:
        return dataset, [f"pipeline left as it was: its graph cannot be serialized ({_first_line(error.message)})"]
    unknown = sorted(op for op in pipeline_graph.pipeline_ops(graph)
                     if _DATASET_OP.search(op) and op not in KNOWN_DATASET_OPS)
    if unknown:
        return dataset, [f"pipeline left as it was: it uses {', '.join(unknown)}, which tfopt has not verified "
                         "to survive a graph rewrite (use num_parallel_calls in your own maps instead)"]
    notes = _rewrite_maps(graph, parallel_random_maps=parallel_random_maps, parallel_python_maps=parallel_python_maps)
    batches = _rewrite_batches(graph)
    if batches:
        notes.append(f"{batches} batch{'es' if batches > 1 else ''} made parallel (order kept)")
    rewritten = any(node.name == _AUTOTUNE_NODE for node in graph.node)
    needs_prefetch = not _ends_with_prefetch(graph)
    if not rewritten and not needs_prefetch:
        return dataset, notes + ["nothing left to parallelize: the pipeline's maps and batches already run in "
                                 "parallel and it ends with a prefetch"]
    result = _rebuild(dataset, graph) if rewritten else dataset
    if isinstance(result, str):
        return dataset, [f"pipeline left as it was: {result}"]
    if needs_prefetch:
        result = result.prefetch(prefetch_batches)
        notes.append(f"ends with a prefetch of {prefetch_batches} elements")
    return result, notes


def _rewrite_maps(graph: Any, *, parallel_random_maps: bool, parallel_python_maps: bool) -> list[str]:
    parallel, random_maps, python_maps, kept = [], [], [], []
    maps = [node for node in graph.node if node.op == "MapDataset"]
    for number, node in enumerate(maps, start=1):
        label = f"map {number} {_function_label(node.attr['f'].func.name)!r}"
        kinds = pipeline_graph.stateful_kinds(pipeline_graph.function_ops(graph, node.attr["f"].func.name))
        if node.attr["force_synchronous"].b:
            kept.append(f"{label} (synchronous=True)")
        elif pipeline_graph.OTHER in kinds:
            kept.append(f"{label} (stateful {', '.join(sorted(kinds[pipeline_graph.OTHER]))})")
        elif pipeline_graph.RANDOM in kinds and not parallel_random_maps:
            kept.append(f"{label} (random ops, parallel_random_maps=False)")
        elif pipeline_graph.PYTHON in kinds and not parallel_python_maps:
            kept.append(f"{label} (Python function, parallel_python_maps=False)")
        else:
            _to_parallel_map(graph, node)
            parallel.append(label)
            if pipeline_graph.RANDOM in kinds:
                random_maps.append(f"{label} ({', '.join(sorted(kinds[pipeline_graph.RANDOM]))})")
            if pipeline_graph.PYTHON in kinds:
                python_maps.append(label)
    notes = []
    if parallel:
        notes.append(f"parallel map (AUTOTUNE calls, order kept): {', '.join(parallel)}")
    if random_maps:
        notes.append(f"random draws of {', '.join(random_maps)} keep their distribution but may reach other "
                     "elements; parallel_random_maps=False keeps the exact draw order")
    if python_maps:
        notes.append(f"Python runs in parallel in {', '.join(python_maps)}: a Python function with mutable state "
                     "shared between calls must opt out with parallel_python_maps=False")
    if kept:
        notes.append(f"kept sequential: {', '.join(kept)}")
    return notes


def _to_parallel_map(graph: Any, node: Any) -> None:
    """MapDataset(input, *captured) -> ParallelMapDatasetV2(input, *captured, num_parallel_calls)."""
    _insert_input(node, position=None, name=_autotune_node(graph))
    node.op = "ParallelMapDatasetV2"
    del node.attr["force_synchronous"]
    # "default" follows tf.data.Options.deterministic, which is True unless the user relaxed it.
    node.attr["deterministic"].s = b"default"


def _rewrite_batches(graph: Any) -> int:
    """BatchDatasetV2(input, batch_size, drop_remainder) -> ParallelBatchDataset(..., num_parallel_calls, ...)."""
    batches = [node for node in graph.node if node.op == "BatchDatasetV2"]
    for node in batches:
        _insert_input(node, position=2, name=_autotune_node(graph))
        node.op = "ParallelBatchDataset"
        node.attr["deterministic"].s = b"default"
    return len(batches)


def _insert_input(node: Any, *, position: int | None, name: str) -> None:
    """Inserts a data input at `position` (None: after the last), before any control input."""
    data = [value for value in node.input if not value.startswith("^")]
    control = [value for value in node.input if value.startswith("^")]
    data.insert(len(data) if position is None else position, name)
    del node.input[:]
    node.input.extend(data + control)


def _autotune_node(graph: Any) -> str:
    if not any(node.name == _AUTOTUNE_NODE for node in graph.node):
        constant = graph.node.add(name=_AUTOTUNE_NODE, op="Const")
        constant.attr["dtype"].type = tf.int64.as_datatype_enum
        constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(tf.data.AUTOTUNE, tf.int64))
    return _AUTOTUNE_NODE


def _ends_with_prefetch(graph: Any) -> bool:
    nodes = {node.name: node for node in graph.node}
    output = next(node for node in graph.node if node.op == "_Retval")
    current = nodes[output.input[0].split(":")[0]]
    while current.op in _PASS_THROUGH_OPS:
        current = nodes[current.input[0].split(":")[0]]
    return current.op == "PrefetchDataset"


def _rebuild(original: Any, graph: Any) -> Any:
    """The dataset `graph` describes, or a string saying why it could not be rebuilt."""
    try:
        rebuilt = _RewrittenDataset(tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString()), original)
        cardinality, expected = int(rebuilt.cardinality()), int(original.cardinality())
    except (tf.errors.OpError, ValueError, TypeError) as error:
        return f"its rewritten graph could not be rebuilt ({_first_line(str(error))})"
    if cardinality != expected:
        return f"the rewritten graph has cardinality {cardinality}, the original {expected}"
    return rebuilt


class _RewrittenDataset(tf.data.Dataset):
    """A dataset rebuilt from a rewritten graph (what `tf.data.experimental.from_variant` makes).

    It holds the original dataset: the graph refers to the original's resources (seed generators,
    caches) by handle, and those are freed with it.
    """

    def __init__(self, variant: Any, original: Any):
        self._element_spec = original.element_spec
        self._original = original
        super().__init__(variant)

    def _inputs(self) -> list:
        return []

    @property
    def element_spec(self) -> Any:
        return self._element_spec


def _function_label(name: str) -> str:
    """'__inference_Dataset_map_augment_123' -> 'augment': the Python function's name, as traced."""
    match = re.fullmatch(r"__inference_Dataset_map_(.+?)_\d+", name)
    return match.group(1) if match else name


def _first_line(message: str) -> str:
    """A TF error's own words, without the '{{function_node ...}}' prefix and '[Op:...]' suffix."""
    text = re.sub(r"^\{\{[^}]*\}\}\s*|\s*\[Op:.*$", "", message.strip().splitlines()[0] if message.strip() else "")
    return text or "no message"
