"""Parallelizes a `tf.data` pipeline that tfopt did not build, by rewriting its graph.

`tf.data.Options` cannot do it: TF's `map_parallelization` rewrite skips every map whose function is
stateful, and py_function, numpy_function and every `tf.random`/`tf.image.random_*` op are. So the
usual augmentation map stays sequential (docs/recipes/data_pipeline.md measures the tf.data guide's
py_function case). This module takes the
pipeline's graph (`DatasetToGraphV2`), turns each sequential `MapDataset` that is safe to run in
parallel into a `ParallelMapDatasetV2` (AUTOTUNE calls) and each `BatchDatasetV2` into a
`ParallelBatchDataset`, both in the order the pipeline's options keep (`deterministic`), bounds a final
`prefetch(AUTOTUNE)` like the prefetch it adds where there is none, and rebuilds the dataset in this
process (`DatasetFromGraph`), with the same element_spec. A pipeline ending with `repeat()` gets its prefetch
inside the repeat: one after it would read into the next pass before training asks for it, and a pass draws
its seeds when it opens (a reshuffling seeded shuffle's), from a generator every iterator of the pipeline
shares, so a later `fit` on it would start at other seeds than plain Keras'. What is safe (see
`tfopt.data.graph`):

* a map without state: always; its output is identical, element by element, in the same order;
* a map whose only state is random draws (`parallel_random_maps`, default on): the draws keep their
  distribution, not their assignment to elements;
* a map calling Python (`parallel_python_maps`, default on): identical unless the Python function
  shares mutable state between calls, which tfopt cannot see;
* a map with other state (a queue, an iterator, a variable it writes, as a Keras random layer's seed
  generator does on every call) or `synchronous=True`: never.

The pipeline's own options are the user's word: `experimental_optimization.map_parallelization=False` keeps
every map sequential and `parallel_batch=False` every batch, as tf.data itself would.

Only the pipeline's top level is rewritten: maps inside an interleave's or flat_map's function build
one small dataset per input element and stay as they are. A dataset made by `from_generator` is
rewritten too, since its generator is not: TensorFlow calls it under the generator dataset's iterator
lock, one call at a time, in the rebuilt pipeline as in the original, from whichever TensorFlow thread
asks for the next element (the original already runs it on TensorFlow's threads, never on Python's main
thread). What the rewrite changes for a generator is how far ahead of training it is asked for elements.

A pipeline tfopt cannot rebuild (a dataset op no test here round-trips, a graph that cannot be serialized or
is too large, a rebuild that fails) keeps its maps and batches as they were, with the reason, and only gets
the bounded prefetch at its end that needs no rewrite; nothing in here raises. The rebuilt graph refers to
live resources of this process (a shuffle's seed generator, a memory cache, py_function tokens), so the
rebuilt dataset keeps the original alive and is valid in this process only; a variable it captures is
copied with its value (a Keras layer's seed variable goes on in the copy), so a pipeline reading a variable
that none of its functions assigns, which the user sets as training goes, is left as it was, whatever other
variables it writes. A mutable table (`tf.lookup.experimental.MutableHashTable`) would be copied as it stands
too, so a pipeline looking one up is left as it was (Keras' lookup layers hold static tables, set once).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tfopt.data import graph as pipeline_graph
from tfopt.errors import describe_error

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

logger = logging.getLogger("tfopt")

# Dataset ops whose graph round trip tests/data/test_rewrite.py checks element by element, each built
# the way tf.data's Python API (TF 2.21) builds it; a test holds this set equal to the tested one. A
# pipeline with any other op (a snapshot's files, a data service, a deprecated op nobody tested) is left
# as it was: an op outside the set may hold state the round trip does not carry.
KNOWN_DATASET_OPS = frozenset(
    {
        "RangeDataset",
        "TensorDataset",
        "TensorSliceDataset",
        "TFRecordDataset",
        "TextLineDataset",
        "FixedLengthRecordDatasetV2",
        "RandomDataset",
        "RandomDatasetV2",
        "GeneratorDataset",
        "MapDataset",
        "ParallelMapDatasetV2",
        "FilterDataset",
        "FlatMapDataset",
        "InterleaveDataset",
        "ParallelInterleaveDatasetV4",
        "BatchDatasetV2",
        "ParallelBatchDataset",
        "PaddedBatchDatasetV2",
        "MapAndBatchDataset",
        "UnbatchDataset",
        "ShuffleDatasetV3",
        "ShuffleAndRepeatDataset",
        "RepeatDataset",
        "CacheDatasetV2",
        "TakeDataset",
        "SkipDataset",
        "ZipDataset",
        "ConcatenateDataset",
        "PrefetchDataset",
        "OptionsDataset",
        "DirectedInterleaveDataset",
        "ShardDataset",
        "RebatchDatasetV2",
        "AssertCardinalityDataset",
        "WindowDataset",
        "ScanDataset",
        "GroupByWindowDataset",
        "IgnoreErrorsDataset",
        "TakeWhileDataset",
        "UniqueDataset",
    }
)
_AUTOTUNE_NODE = "tfopt/num_parallel_calls_autotune"
_PREFETCH_NODE = "tfopt/final_prefetch_elements"
_PREFETCH_IN_REPEAT_NODE = "tfopt/prefetch_within_each_pass"
_NOT_REWRITTEN = "maps and batches left as they were"


def parallelize(
    dataset: tf.data.Dataset,
    *,
    prefetch_batches: int | None,
    parallel_random_maps: bool = True,
    parallel_python_maps: bool = True,
) -> tuple[Any, list[str]]:
    """Returns the dataset with its sequential maps and batches made parallel, ending with a bounded prefetch.

    Idempotent: a pipeline with nothing left to rewrite is returned as the same object. Never raises:
    a pipeline whose graph it cannot rewrite keeps its maps and batches as they were (ending with the
    prefetch where it had none), and the notes say why.

    Args:
        dataset: Any `tf.data.Dataset`.
        prefetch_batches: Elements the final prefetch holds: the one added where the pipeline does not
            end with a prefetch, and a final `prefetch(AUTOTUNE)`, which tf.data would otherwise grow
            within the whole autotune RAM budget. None where the elements' size is unknown: the prefetch
            added is then `AUTOTUNE` and a final `AUTOTUNE` stays, both sized by tf.data within that budget.
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
    result, notes = _rewritten(
        dataset,
        prefetch_batches=prefetch_batches,
        parallel_random_maps=parallel_random_maps,
        parallel_python_maps=parallel_python_maps,
    )
    if result is None:  # its maps and batches stay as they were; a prefetch at its end needs no rewrite
        result = dataset
        if not _ends_with_prefetch(dataset):
            result = dataset.prefetch(tf.data.AUTOTUNE if prefetch_batches is None else prefetch_batches)
            notes.append(_prefetch_note(prefetch_batches))
    return result, notes


def _rewritten(
    dataset: tf.data.Dataset, *, prefetch_batches: int | None, parallel_random_maps: bool, parallel_python_maps: bool
) -> tuple[Any | None, list[str]]:
    """`parallelize` through the graph: (the dataset rewritten, or None where its graph cannot be), notes."""
    graph, unreadable = pipeline_graph.read(dataset)
    if graph is None:
        return None, [f"{_NOT_REWRITTEN}: {unreadable}"]
    unknown = sorted(
        op
        for op in pipeline_graph.pipeline_ops(graph)
        if pipeline_graph.DATASET_OP.search(op) and op not in KNOWN_DATASET_OPS
    )
    if unknown:
        return None, [
            f"{_NOT_REWRITTEN}: it uses {', '.join(unknown)}, which tfopt has not verified to survive a "
            "graph rewrite (use num_parallel_calls in your own maps instead)"
        ]
    mutable_tables = sorted(pipeline_graph.pipeline_ops(graph) & pipeline_graph.MUTABLE_TABLES)
    if mutable_tables:
        return None, [
            f"{_NOT_REWRITTEN}: it looks up a mutable table ({', '.join(mutable_tables)}), which a rebuilt graph "
            "would hold as a copy of today's contents, blind to what is inserted later"
        ]
    if any("read" in uses and "write" not in uses for uses in pipeline_graph.variable_uses(graph)):
        return None, [
            f"{_NOT_REWRITTEN}: it reads a tf.Variable it never assigns (one set from outside, as a curriculum's "
            "strength is as training goes, or a tf.random.Generator's state), which a rebuilt graph would hold "
            "as a copy of today's value"
        ]
    options = dataset.options()
    order = "order kept" if options.deterministic is not False else "order relaxed (deterministic=False)"
    maps_allowed = options.experimental_optimization.map_parallelization is not False
    batches_allowed = options.experimental_optimization.parallel_batch is not False
    try:
        notes = (
            _rewrite_maps(
                graph, order, parallel_random_maps=parallel_random_maps, parallel_python_maps=parallel_python_maps
            )
            if maps_allowed
            else ["maps kept sequential: your pipeline options set map_parallelization=False"]
        )
        batches = _rewrite_batches(graph) if batches_allowed else 0
        final = next((node for node in pipeline_graph.output_chain(graph) if node.op != "OptionsDataset"), None)
        ends_with_prefetch = final is not None and final.op == "PrefetchDataset"
        autotuned_prefetch = ends_with_prefetch and _buffer_size(graph, final) == tf.data.AUTOTUNE
        if autotuned_prefetch and prefetch_batches is not None:
            final.input[1] = pipeline_graph.int64_constant(graph, _PREFETCH_NODE, prefetch_batches)
        in_repeat = final is not None and final.op == "RepeatDataset"
        prefetched_in_repeat = in_repeat and _prefetch_before(graph, final, prefetch_batches)
    except Exception as error:  # a graph tfopt misreads: never a crash
        logger.debug("graph rewrite failed", exc_info=True)
        return None, [f"{_NOT_REWRITTEN}: tfopt could not rewrite its graph ({describe_error(error)})"]
    if batches:
        notes.append(f"{batches} batch{'es' if batches > 1 else ''} made parallel ({order})")
    if not batches_allowed:
        notes.append("batches kept sequential: your pipeline options set parallel_batch=False")
    if autotuned_prefetch:
        notes.append(
            "its final prefetch(AUTOTUNE) stays: the elements' size is unknown, so tf.data sizes it within "
            "the autotune RAM budget"
            if prefetch_batches is None
            else f"its final prefetch(AUTOTUNE) now holds {prefetch_batches} elements"
        )
    rewritten = any(node.name in (_AUTOTUNE_NODE, _PREFETCH_NODE, _PREFETCH_IN_REPEAT_NODE) for node in graph.node)
    if not rewritten and ends_with_prefetch:
        return dataset, notes + [
            "nothing left to parallelize: the pipeline's maps and batches already run in "
            "parallel and it ends with a prefetch"
        ]
    result = pipeline_graph.rebuild(dataset, graph) if rewritten else dataset
    if isinstance(result, str):
        return None, [f"{_NOT_REWRITTEN}: {result}"]
    if prefetched_in_repeat:
        notes.append(
            f"{_prefetch_note(prefetch_batches)}, inside its final repeat(): no pass is read ahead of training"
        )
    elif in_repeat:
        notes.append("its prefetch inside its final repeat() stays: no pass is read ahead of training")
    elif not ends_with_prefetch:
        result = result.prefetch(tf.data.AUTOTUNE if prefetch_batches is None else prefetch_batches)
        notes.append(_prefetch_note(prefetch_batches))
    return result, notes


def _prefetch_before(graph: GraphDef, repeat: Any, prefetch_batches: int | None) -> bool:
    """Puts a prefetch of `prefetch_batches` elements (AUTOTUNE for None) between `repeat` and its input, unless
    one is there (the user's, or one put there before); whether it did."""
    feeding = next((node for node in graph.node if node.name == repeat.input[0].split(":")[0]), None)
    if feeding is not None and feeding.op == "PrefetchDataset":
        return False
    prefetch = graph.node.add(name=_PREFETCH_IN_REPEAT_NODE, op="PrefetchDataset")
    size = tf.data.AUTOTUNE if prefetch_batches is None else prefetch_batches
    prefetch.input.extend(
        [repeat.input[0], pipeline_graph.int64_constant(graph, _PREFETCH_IN_REPEAT_NODE + "/size", size)]
    )
    for name in ("output_types", "output_shapes"):
        prefetch.attr[name].CopyFrom(repeat.attr[name])
    prefetch.attr["slack_period"].i = 0
    prefetch.attr["buffer_size_min"].i = 0
    prefetch.attr["legacy_autotune"].b = size == tf.data.AUTOTUNE  # as Dataset.prefetch sets it
    prefetch.experimental_type.CopyFrom(repeat.experimental_type)
    repeat.input[0] = prefetch.name
    return True


def _prefetch_note(prefetch_batches: int | None) -> str:
    return (
        "ends with a prefetch(AUTOTUNE), sized by tf.data within the autotune RAM budget, since the elements' "
        "size is unknown"
        if prefetch_batches is None
        else f"ends with a prefetch of {prefetch_batches} elements"
    )


def _ends_with_prefetch(dataset: tf.data.Dataset) -> bool:
    """Whether the pipeline's last stage (options aside) is a prefetch, read from its Python objects."""
    node = dataset
    while type(node).__name__ == "_OptionsDataset":
        node = node._input_dataset
    return type(node).__name__ == "_PrefetchDataset"


def _rewrite_maps(graph: GraphDef, order: str, *, parallel_random_maps: bool, parallel_python_maps: bool) -> list[str]:
    parallel, random_maps, python_maps, kept = [], [], [], []
    maps = [node for node in graph.node if node.op == "MapDataset"]
    for number, node in enumerate(maps, start=1):
        label = f"map {number} {_function_label(node.attr['f'].func.name)!r}"
        kinds = pipeline_graph.stateful_kinds(pipeline_graph.function_ops(graph, node.attr["f"].func.name))
        if node.attr["force_synchronous"].b:
            kept.append(f"{label} (synchronous=True)")
        elif pipeline_graph.OTHER in kinds:
            kept.append(
                f"{label} (stateful {', '.join(sorted(kinds[pipeline_graph.OTHER]))}"
                f"{_why_stateful(kinds[pipeline_graph.OTHER])})"
            )
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
        notes.append(f"parallel map (AUTOTUNE calls, {order}): {', '.join(parallel)}")
    if random_maps:
        notes.append(
            f"random draws of {', '.join(random_maps)} keep their distribution but may reach other "
            "elements; parallel_random_maps=False keeps the exact draw order"
        )
    if python_maps:
        notes.append(
            f"Python runs in parallel in {', '.join(python_maps)}: a Python function with mutable state "
            "shared between calls must opt out with parallel_python_maps=False"
        )
    if kept:
        notes.append(f"kept sequential: {', '.join(kept)}")
    return notes


def _why_stateful(ops: set[str]) -> str:
    if ops & pipeline_graph.VARIABLE_WRITES:
        return (
            ": it writes a variable, as a Keras random layer's seed generator does on every call, and "
            "parallel calls could read the same seed"
        )
    return ""


def _to_parallel_map(graph: GraphDef, node: Any) -> None:
    """MapDataset(input, *captured) -> ParallelMapDatasetV2(input, *captured, num_parallel_calls)."""
    _insert_input(node, position=None, name=pipeline_graph.int64_constant(graph, _AUTOTUNE_NODE, tf.data.AUTOTUNE))
    node.op = "ParallelMapDatasetV2"
    del node.attr["force_synchronous"]
    # "default" follows tf.data.Options.deterministic, which is True unless the user relaxed it.
    node.attr["deterministic"].s = b"default"


def _rewrite_batches(graph: GraphDef) -> int:
    """BatchDatasetV2(input, batch_size, drop_remainder) -> ParallelBatchDataset(..., num_parallel_calls, ...)."""
    batches = [node for node in graph.node if node.op == "BatchDatasetV2"]
    for node in batches:
        _insert_input(node, position=2, name=pipeline_graph.int64_constant(graph, _AUTOTUNE_NODE, tf.data.AUTOTUNE))
        node.op = "ParallelBatchDataset"
        node.attr["deterministic"].s = b"default"
    return len(batches)


def _buffer_size(graph: GraphDef, prefetch: Any) -> int | None:
    """A PrefetchDataset's buffer size, where it is a constant (AUTOTUNE is -1)."""
    size = next((node for node in graph.node if node.name == prefetch.input[1].split(":")[0]), None)
    return int(tf.make_ndarray(size.attr["value"].tensor)) if size is not None and size.op == "Const" else None


def _insert_input(node: Any, *, position: int | None, name: str) -> None:
    """Inserts a data input at `position` (None: after the last), before any control input."""
    data = [value for value in node.input if not value.startswith("^")]
    control = [value for value in node.input if value.startswith("^")]
    data.insert(len(data) if position is None else position, name)
    del node.input[:]
    node.input.extend(data + control)


def _function_label(name: str) -> str:
    """'__inference_Dataset_map_augment_123' -> 'augment': the Python function's name, as traced."""
    match = re.fullmatch(r"__inference_Dataset_map_(.+?)_\d+", name)
    return match.group(1) if match else name
