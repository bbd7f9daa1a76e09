"""Offloading a `tf.data` pipeline to tf.data service workers: what may go, how it is split, how it comes back.

tfopt's graph rewrite parallelizes a pipeline over the training host's own cores. Where those are all busy,
the tf.data service (`tf.data.experimental.service`: a dispatcher and workers) runs the same pipeline in
other processes, on this host's spare cores or on other hosts, and streams the batches back over gRPC. This
module decides from the pipeline's graph alone whether and how (`tfopt.data.service_client` sends it and
reads it back):

* **What cannot go.** A function that calls Python (`py_function`, `numpy_function`) or a `from_generator`
  source runs this process's Python, which a worker process does not have: such a pipeline stays local, the
  op named.
* **State.** A worker holds a copy of each variable and mutable table the pipeline reads, as it was when the
  pipeline was sent, and a single training process's epochs are jobs of their own, each built from where the
  pipeline started: a pipeline reading state set from outside, or carrying state from one epoch to the next
  (a Keras random layer's seed, a seeded shuffle's orders), stays local (`state_blocker`). tfopt's own
  source pipelines are served with fresh seeds in each job instead (`served_form`).
* **How it is split.** One worker runs the whole pipeline (sharding off): exact, in the pipeline's own
  order, and nothing asked of the dispatcher per element (a dying worker, started again, replays its pass
  from the start). Several workers share it by dynamic sharding: the dispatcher hands the source's splits
  (a range's or a slice source's elements, a file list's files) to whichever worker asks next, one request
  each, so each element is produced once per pass, by one worker ("at most once": the splits a dying worker
  held are lost). That is right only where every op after the source treats elements one by one; `take`,
  `skip`, `zip`, `enumerate`, `scan`, `unique` and their kin would run once per worker and mean something
  else (`take(50)` of a range over two workers gives 100 elements, and a `zip` of two ranges pairs the
  wrong elements), a `padded_batch` pads each worker's last batch to its own length, a file cache would be
  written by every worker at once. Each worker also makes its batches of the splits it got, so a function
  after a batch (a `map`, a `filter`) would see other rows together than the local pipeline's batches: a
  per-batch normalization gives other values, a padding to each batch's longest text other lengths, which
  the client could not cut into the local batches again. The splits are the source's elements, and tf.data
  service has no way to hand out whole batches, so such a pipeline has no exact split; only a map of
  element-wise ops (a cast, a rescale: tfopt's own pipelines finish their batches so) gives each row the
  same value in any batch. With several workers such a pipeline stays local, with the reason (one worker
  can serve it). A `batch(drop_remainder=True)` drops each worker's last partial batch: said.
* **Caches.** Each epoch is a service job of its own, in which the workers build the pipeline again: an
  in-memory `cache()` lasts one epoch there. On this host that redoes the work the cache saves on the cores
  it saves them for, so it stays local; other hosts may take it, with that said.
* **Compression** costs CPU on both ends to save network: a cluster on this host (loopback) never
  compresses, a remote one compresses elements from `COMPRESS_FROM_BYTES` on (and those of unknown size).
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from tfopt.data import graph as pipeline_graph

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.core.framework.graph_pb2 import GraphDef

# Sources whose splits the dispatcher hands out (TF's split providers), one element or one file each.
SPLITTABLE_SOURCES = frozenset(
    {"RangeDataset", "TensorSliceDataset", "TFRecordDataset", "TextLineDataset", "FixedLengthRecordDatasetV2"}
)
# Ops that treat elements one by one (or batch them), so that running them on each worker's share of the
# splits gives the same elements as running them once on all (tests/data/test_service.py checks a pipeline of
# each against the local one), as long as no function runs after a batch (`_BATCH_SEEING`). Interleave and
# flat_map split their outer input; the datasets their functions build stay whole.
_PER_ELEMENT_OPS = frozenset(
    {
        "MapDataset",
        "ParallelMapDatasetV2",
        "FilterDataset",
        "BatchDatasetV2",
        "ParallelBatchDataset",
        "MapAndBatchDataset",
        "UnbatchDataset",
        "ShuffleDatasetV3",
        "ShuffleAndRepeatDataset",
        "RepeatDataset",
        "CacheDatasetV2",
        "PrefetchDataset",
        "OptionsDataset",
        "FlatMapDataset",
        "InterleaveDataset",
        "ParallelInterleaveDatasetV4",
        "IgnoreErrorsDataset",
        "RebatchDatasetV2",
        "ModelDataset",
        "MaxIntraOpParallelismDataset",
        "PrivateThreadPoolDataset",
    }
)
# Ops that make batches, and ops whose function sees an element whole: after a batch, a whole batch, which
# each worker makes of its own splits (a map of element-wise ops alone excepted, `_element_wise_map`). A batch of
# batches nests each worker's batches likewise.
_BATCHING_OPS = frozenset({"BatchDatasetV2", "ParallelBatchDataset", "MapAndBatchDataset", "RebatchDatasetV2"})
_BATCH_SEEING = frozenset(
    {
        "MapDataset",
        "ParallelMapDatasetV2",
        "FilterDataset",
        "FlatMapDataset",
        "InterleaveDataset",
        "ParallelInterleaveDatasetV4",
        "MapAndBatchDataset",
        "BatchDatasetV2",
        "ParallelBatchDataset",
    }
)
# Ops before which tf.data puts a map of its own (`normalize_to_dense`: sparse and ragged parts as batched
# dense tensors), which changes no row: it is not the user's function. Known by its place and its traced name.
_NORMALIZED_INPUT_OPS = frozenset({"RebatchDatasetV2", "UnbatchDataset"})
_NORMALIZING_FUNCTION = re.compile(r"__inference_Dataset_map_normalize_\d+")
# Ops whose output's row i depends on row i of their inputs alone, broadcast against single values: a function of
# these gives each row the same value in whichever batch it is (tfopt's own `finish`, a cast and a rescale).
# Calls count by the functions they call. A constant of more than one value might broadcast along the batch.
_ELEMENT_WISE_OPS = frozenset(
    {
        *("Identity", "IdentityN", "StopGradient", "NoOp", "Const", "Cast", "PartitionedCall"),
        *("StatefulPartitionedCall", "Select", "SelectV2", "ClipByValue", "AddN"),
        *("Abs", "Neg", "Reciprocal", "Square", "Sqrt", "Rsqrt", "Exp", "Expm1", "Log", "Log1p", "Sin", "Cos"),
        *("Tanh", "Sigmoid", "Relu", "Relu6", "Elu", "Softplus", "Floor", "Ceil", "Round", "Rint", "Sign"),
        *("IsNan", "IsInf", "IsFinite", "LogicalNot", "Erf"),
        *("Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "DivNoNan", "RealDiv", "FloorDiv", "FloorMod"),
        *("TruncateDiv", "TruncateMod", "Pow", "Maximum", "Minimum", "SquaredDifference", "Equal", "NotEqual"),
        *("Less", "LessEqual", "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr"),
        *("BitwiseAnd", "BitwiseOr", "BitwiseXor", "LeftShift", "RightShift"),
    }
)
_PYTHON_OPS = {"EagerPyFunc": "py_function", "PyFunc": "numpy_function", "PyFuncStateless": "numpy_function"}
# Elements from this size on are compressed for a remote service: below it Snappy's per-element cost is
# not repaid by the network time it saves.
COMPRESS_FROM_BYTES = 64 * 2**10


@dataclasses.dataclass(frozen=True)
class Offload:
    """How a pipeline goes to the tf.data service: decided from its graph by `plan_offload`, done by `serve`.

    Attributes:
        dispatcher: "grpc://host:port" of a running service, or None for a cluster tfopt starts on this host.
        workers: Worker processes tfopt starts on this host (127.0.0.1), or None with a dispatcher.
        sharding: "dynamic" (the source's splits shared out) or "off" (one worker serves it whole).
        compression: "AUTO" (Snappy) or None.
        job_name: The job the training workers of a multi-worker run share, or None for one derived from
            their cluster. A single training process reads a job of its own per epoch.
        reasons: Why each choice was made, for `Plan.applied`.
        batch_bytes: Bytes of one batch as the service sends it (before compression), from the static shapes;
            None where only the data tells (strings, open dimensions).
        requested_compression: The compression setting it was planned with ("auto", "none", "snappy"), for
            `planned_again`.
        answer_timeout_seconds: How long the client waits for the dispatcher to answer before it fails.
        start_timeout_seconds: How long a worker process started here may take to serve, and a training
            worker waits for its chief to register the shared pipeline.
    """

    dispatcher: str | None
    workers: int | None
    sharding: str
    compression: str | None
    job_name: str | None
    reasons: tuple[str, ...]
    batch_bytes: int | None = None
    requested_compression: str = "auto"
    answer_timeout_seconds: float = 10.0
    start_timeout_seconds: float = 120.0

    def planned_again(
        self, dataset: tf.data.Dataset, *, batch_size: int | None, batches_per_pass: int | None = None
    ) -> tuple[Offload | None, str]:
        """The same request planned for `dataset`: the pipeline as the build has it, after the recipes of later
        stages rebatched it, which the recipe's decision could not see."""
        return plan_offload(
            dataset,
            dispatcher=self.dispatcher,
            workers=self.workers,
            compression=self.requested_compression,
            job_name=self.job_name,
            batch_size=batch_size,
            batches_per_pass=batches_per_pass,
            answer_timeout_seconds=self.answer_timeout_seconds,
            start_timeout_seconds=self.start_timeout_seconds,
        )

    def describe(self) -> str:
        where = (
            (
                f"{self.workers} tf.data service worker process{'es' if self.workers != 1 else ''} on this host "
                "(127.0.0.1), started with the run and stopped with it"
            )
            if self.workers
            else f"the tf.data service at {self.dispatcher}"
        )
        return f"offloaded to {where}: " + "; ".join(self.reasons)


def plan_offload(
    dataset: tf.data.Dataset,
    *,
    dispatcher: str | None = None,
    workers: int | None = None,
    compression: str = "auto",
    job_name: str | None = None,
    batch_size: int | None = None,
    batches_per_pass: int | None = None,
    answer_timeout_seconds: float = 10.0,
    start_timeout_seconds: float = 120.0,
) -> tuple[Offload | None, str]:
    """How `dataset` goes to the service, or (None, why it stays local). Reads the graph only, never an element;
    `batch_size` sizes batches whose first dimension tf.data leaves open, and `batches_per_pass` is the length the
    client reads per epoch where `dataset` lost it (`served_form`: the workers' pipeline without its final count).

    Example:
        >>> import tensorflow as tf
        >>> offload, _ = plan_offload(tf.data.Dataset.range(64).map(lambda i: i * 2).batch(8), workers=2)
        >>> offload.sharding, offload.compression
        ('dynamic', None)
        >>> print(plan_offload(tf.data.Dataset.range(8).take(4).batch(2), workers=2)[1])  # doctest: +ELLIPSIS
        left local: dynamic sharding does not fit (its TakeDataset would run on each worker...
    """
    graph, why = pipeline_graph.read(dataset)
    if graph is None:
        return None, f"left local: {why}"
    blocker = python_blocker(graph) or state_blocker(graph)
    if blocker:
        return None, f"left local: {blocker}"
    reasons = []
    splittable, why_not = dynamic_sharding(graph)
    if workers == 1:
        sharding = "off"
        reasons.append(
            "sharding off: the one worker runs the whole pipeline, in its own order, asking the "
            "dispatcher for nothing per element"
        )
    elif splittable:
        sharding = "dynamic"
        reasons.append(f"dynamic sharding ({why_not}: each element produced once per pass, by one worker)")
    else:
        many = f"{workers} workers" if workers else "the service's workers"
        return None, (
            f"left local: dynamic sharding does not fit ({why_not}), and with sharding off {many} would "
            "each produce the whole dataset; use data_service: {workers: 1}, or a pipeline whose source "
            "is a range, slices or files and whose ops treat elements one by one"
        )
    files = cache_files(graph)
    if "" in files:
        refilled = (
            "its in-memory cache (cache()) is filled anew every epoch on the workers, each epoch a service "
            "job of its own"
        )
        if workers:
            return None, (
                f"left local: {refilled}, redoing on this host's cores the work the cache saves here; "
                "offload it to other hosts (dispatcher), or with workers: 1 cache to a file "
                "(cache(filename)) or convert the decoded data to TFRecord files first"
            )
        reasons.append(f"{refilled}: the workers redo the work it saves")
    if sharding == "dynamic" and any(files):
        return None, (
            "left local: its file cache (cache(filename)) would be written by every worker at once; use "
            "data_service: {workers: 1}, or convert the decoded data to TFRecord files"
        )
    if sharding == "dynamic" and pipeline_graph.drops_remainder(graph):
        reasons.append(
            "each worker drops its own last partial batch (batch(drop_remainder=True)): a pass loses "
            "up to a batch per worker, taken from the next pass"
        )
    size, size_why = pipeline_graph.element_bytes(dataset.element_spec, graph)
    if size is None and batch_size:
        size = pipeline_graph.element_bytes(_with_batch_dimension(dataset.element_spec, batch_size))[0] or None
    chosen, compression_why = _compression(compression, size, size_why, local=dispatcher is None)
    reasons.append(compression_why)
    reasons.append(
        "read back in the local pipeline's batches, a pass's worth per epoch"
        if (int(dataset.cardinality()) if batches_per_pass is None else batches_per_pass) > 0
        else "read back as it comes (the local pipeline has no known length)"
    )
    return Offload(
        dispatcher=dispatcher,
        workers=workers,
        sharding=sharding,
        compression=chosen,
        job_name=job_name,
        reasons=tuple(reasons),
        batch_bytes=size,
        requested_compression=compression,
        answer_timeout_seconds=answer_timeout_seconds,
        start_timeout_seconds=start_timeout_seconds,
    ), ""


def _with_batch_dimension(element_spec: Any, batch_size: int) -> Any:
    """The element spec with an open first dimension set to `batch_size` (a full batch)."""
    import tensorflow as tf

    def full(spec: Any) -> Any:
        if isinstance(spec, tf.TensorSpec) and spec.shape.rank and spec.shape[0] is None:
            return tf.TensorSpec([batch_size, *spec.shape[1:]], spec.dtype)
        return spec

    return tf.nest.map_structure(full, element_spec)


def python_blocker(graph: GraphDef) -> str | None:
    """Why the pipeline cannot run in another process (its Python op named), or None.

    Example:
        >>> import tensorflow as tf
        >>> data = tf.data.Dataset.range(4).map(lambda i: tf.py_function(lambda v: v, [i], tf.int64))
        >>> print(python_blocker(pipeline_graph.serialize(data)))  # doctest: +ELLIPSIS
        its map calls py_function (EagerPyFunc), which runs this process's Python; ...
    """
    if "GeneratorDataset" in pipeline_graph.pipeline_ops(graph):  # from_generator: a flat_map over one
        return (
            "its source is from_generator (GeneratorDataset), which calls this process's Python generator; "
            "a worker process cannot. Write the data to TFRecord files (tfopt-recipe convert) to offload it"
        )
    for node in graph.node:
        for value in node.attr.values():
            if not value.HasField("func"):
                continue
            called = pipeline_graph.function_ops(graph, value.func.name) & set(_PYTHON_OPS)
            if called:
                op = sorted(called)[0]
                kind = node.op.removesuffix("Dataset").removesuffix("V2").lower()
                return (
                    f"its {kind} calls {_PYTHON_OPS[op]} ({op}), which runs this process's Python; a worker "
                    "process cannot. Write it with TensorFlow ops to offload it"
                )
    return None


def state_blocker(graph: GraphDef) -> str | None:
    """Why the workers would not see the pipeline's state as the local pipeline does, or None.

    A worker builds the pipeline from its graph, where each variable and mutable table is a copy of its
    value when the pipeline was sent: one set from outside as training goes stays as it was. A single training
    process reads each epoch as a job of its own, built again from the graph, so state the pipeline carries
    from one pass to the next (a Keras random layer's seed generator, which its map writes on every call; a
    seeded shuffle's sequence of orders) starts again every epoch: every epoch would repeat the first one's
    draws and order. The training workers of a multi-worker run share one job over the pipeline repeated,
    which carries it on.

    Example:
        >>> import tensorflow as tf
        >>> print(state_blocker(pipeline_graph.serialize(tf.data.Dataset.range(8).shuffle(8, seed=1))))
        ... # doctest: +ELLIPSIS
        each epoch would be a service job of its own, ... would give every epoch the first epoch's order...
    """
    from tfopt.distribute.environment import detect_environment

    uses = pipeline_graph.variable_uses(graph)
    tables = sorted(pipeline_graph.pipeline_ops(graph) & pipeline_graph.MUTABLE_TABLES)
    if tables or any("read" in use and "write" not in use for use in uses):
        return (
            "it reads state it never sets itself (a tf.Variable set from outside as training goes, a "
            f"tf.random.Generator's state{', a mutable table: ' + ', '.join(tables) if tables else ''}), of which "
            "the workers would hold a copy as it was when the pipeline was sent"
        )
    if detect_environment().num_workers > 1:
        return None
    carried = []
    if any("write" in use for use in uses):
        carried.append(
            "a variable its functions write on every call (a Keras random layer's seed generator) would give every "
            "epoch the first epoch's random draws"
        )
    if pipeline_graph.seeded_reshuffles(graph):
        carried.append(
            "a shuffle (a Dataset.random) with a seed, its own or the global one (tf.random.set_seed, "
            "keras.utils.set_random_seed), would give every epoch the first epoch's order"
        )
    if not carried:
        return None
    return (
        "each epoch would be a service job of its own, for which the workers build the pipeline again from where "
        f"it started: {'; '.join(carried)}. Call random augmentation layers in the model instead (they run on "
        "the accelerator), leave the shuffle unseeded (no global seed either), or keep the pipeline local"
    )


def served_form(dataset: tf.data.Dataset, *, own_pipeline: bool) -> tuple[Any, str | None]:
    """The pipeline as the workers are to run it, and what that changed for training (None: nothing).

    An `assert_cardinality` at its end (tfopt's rebatch adds one) is left to the client, which asserts the length
    of what it reads back: each worker would count its own share against a whole pass's length.
    A single training process reads each epoch as a job of its own, which the workers build again from the
    graph, so a seeded shuffle would give every epoch the first one's order (`state_blocker`). tfopt's own
    pipeline (a source's, seeded by default) is served with those seeds dropped: each epoch's job draws
    fresh ones, so every epoch is reshuffled and augmented anew, as locally. A user's pipeline is served as it
    is, exact or not at all; so is any pipeline the training workers of a multi-worker run share, in one job.
    """
    from tfopt.distribute.environment import detect_environment

    if type(dataset).__name__ == "_AssertCardinalityDataset":
        dataset = dataset._input_dataset
    if not own_pipeline or detect_environment().num_workers > 1:
        return dataset, None
    fresh = pipeline_graph.unseeded(dataset)
    if isinstance(fresh, str) or fresh is dataset:
        return dataset, None
    return fresh, (
        "each epoch's job draws fresh seeds for the source's shuffle and augmentation, whose seeded sequence "
        "would start again every epoch: every epoch is reshuffled and augmented anew, in orders that differ "
        "from the local pipeline's and from run to run"
    )


def cache_files(graph: GraphDef) -> list[str]:
    """The file name of each cache in the pipeline, "" for one in memory (or of a name only the data gives).

    Example:
        >>> import tensorflow as tf
        >>> cache_files(pipeline_graph.serialize(tf.data.Dataset.range(4).cache().cache("/tmp/c")))
        ['', '/tmp/c']
    """
    import tensorflow as tf

    constants = {node.name: node for node in graph.node if node.op == "Const"}
    files = []
    for node in graph.node:
        if node.op.startswith("CacheDataset"):
            filename = constants.get(node.input[1].split(":")[0])
            files.append(tf.make_ndarray(filename.attr["value"].tensor).item().decode() if filename is not None else "")
    return files


def dynamic_sharding(graph: GraphDef) -> tuple[bool, str]:
    """Whether the dispatcher may share out the source's splits, and why (or why not).

    Example:
        >>> import tensorflow as tf
        >>> dynamic_sharding(pipeline_graph.serialize(tf.data.Dataset.range(8).shuffle(8).batch(2)))
        (True, 'the source RangeDataset splits')
    """
    producers = {node.name: node.op for node in graph.node}
    datasets = [node for node in graph.node if pipeline_graph.DATASET_OP.search(node.op)]
    sources = [
        node
        for node in datasets
        if not any(
            pipeline_graph.DATASET_OP.search(producers.get(name.lstrip("^").split(":")[0], "")) for name in node.input
        )
    ]
    for node in datasets:
        if node not in sources and node.op not in _PER_ELEMENT_OPS:
            return False, (
                f"its {node.op} would run on each worker's share of the elements, which changes what it means"
            )
    after_batch = _sees_worker_batches(graph)
    if after_batch:
        return False, after_batch
    if len(sources) != 1 or sources[0].op not in SPLITTABLE_SOURCES:
        names = ", ".join(node.op for node in sources) or "none found"
        return (
            False,
            f"its source{'s' if len(sources) > 1 else ''} ({names}) {'do' if len(sources) > 1 else 'does'} "
            "not split as one",
        )
    return True, f"the source {sources[0].op} splits"


def _sees_worker_batches(graph: GraphDef) -> str | None:
    """Why an op after a batch would see each worker's own batches (its function, or a batch of them), or None.

    Example:
        >>> import tensorflow as tf
        >>> batches = tf.data.Dataset.range(8).batch(4)
        >>> print(_sees_worker_batches(pipeline_graph.serialize(batches.map(lambda b: b - tf.reduce_min(b)))))
        its MapDataset comes after a batch, and each worker batches the elements it was handed: it would see...
        >>> print(_sees_worker_batches(pipeline_graph.serialize(batches.map(lambda b: b * 2).rebatch(2))))
        None
    """
    chain = list(pipeline_graph.output_chain(graph))[::-1]  # from the source on
    batched = False
    for node, following in zip(chain, [*chain[1:], None]):
        normalizing = (
            node.op == "MapDataset"
            and following is not None
            and following.op in _NORMALIZED_INPUT_OPS
            and _NORMALIZING_FUNCTION.fullmatch(node.attr["f"].func.name) is not None
        )
        if batched and node.op in _BATCH_SEEING and not (normalizing or _element_wise_map(graph, node)):
            return (
                f"its {node.op} comes after a batch, and each worker batches the elements it was handed: it "
                "would see other rows together than the local pipeline's batches (a per-batch statistic or "
                "padding would differ); apply it to the elements before the batch"
            )
        if node.op in _BATCHING_OPS:
            batched = True
        elif node.op == "UnbatchDataset":
            batched = False
    return None


def _element_wise_map(graph: GraphDef, node: Any) -> bool:
    """Whether `node` is a map whose function, through the functions it calls, runs element-wise ops on
    constants of one value alone (`_ELEMENT_WISE_OPS`), its captured tensors included."""
    import tensorflow as tf

    if node.op not in ("MapDataset", "ParallelMapDatasetV2"):
        return False
    producers = {other.name: other for other in graph.node}
    functions = {function.signature.name: function for function in graph.library.function}
    captured = node.input[1 : 1 + len(node.attr["Targuments"].list.type)]  # tensors the function closes over
    constants = [producers.get(name.split(":")[0]) for name in captured]
    pending, seen = [node.attr["f"].func.name], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if current not in functions:
            return False
        for inner in functions[current].node_def:
            if inner.op in functions:  # a function called by its name
                pending.append(inner.op)
            elif inner.op not in _ELEMENT_WISE_OPS:
                return False
            elif inner.op == "Const":
                constants.append(inner)
            else:
                pending += [value.func.name for value in inner.attr.values() if value.HasField("func")]
    return all(
        constant is not None
        and constant.op == "Const"
        and tf.TensorShape(constant.attr["value"].tensor.tensor_shape).num_elements() in (0, 1)
        for constant in constants
    )


def _compression(setting: str, size: int | None, size_why: str | None, *, local: bool) -> tuple[str | None, str]:
    if setting == "none":
        return None, "no compression (as set)"
    if setting == "snappy":
        return "AUTO", "Snappy compression (as set)"
    if local:
        return None, (
            "no compression: the workers share this host, where compressing would cost the cores the "
            "offload frees and loopback bandwidth is not the limit"
        )
    if size is None:
        return "AUTO", f"Snappy compression: the element size is unknown ({size_why})"
    if size >= COMPRESS_FROM_BYTES:
        return "AUTO", f"Snappy compression: {size / 2**10:.0f} KiB elements cross the network"
    return None, f"no compression: {size} B elements cost more to compress than to send"
