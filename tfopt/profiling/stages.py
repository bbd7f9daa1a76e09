"""The input pipeline stage by stage: each tf.data transformation's work, parallelism and bound, from a capture.

tf.data writes one host event per `GetNext` of every iterator (`Iterator::Root::Prefetch::Map`), with the
iterator's `id`, its consumer's `parent_id`, its dataset's `name` (`MapDataset:3`, or the `name=` given to
the transformation) and what AUTOTUNE set (`parallelism`, `buffer_limit`). Events of one dataset (all its
iterators: one per epoch, one per interleaved file) make one stage. Per stage:

- work: the thread time spent producing its elements, its inputs' time excluded. A synchronous stage
  (`Map`, `Batch`, a source) works inside its own `GetNext`, on its consumer's thread: its events' time
  minus the time of the input `GetNext`s nested in them. An asynchronous stage (`ParallelMapV2`,
  `MapAndBatch`, `Prefetch`, `ParallelInterleaveV4`) works on background threads, and its `GetNext` only
  waits on its buffer: its work is the run time of the functions it launched (each
  `InstantiatedCapturedFunction::RunAsync` joined by its `id` to the executor events of that run), a launch
  belonging to the stage whose input the launching thread read just before it.
- work per batch: its work per element (per function run for a buffered map) times the elements of one
  batch at its place (the batch sizes of the batching stages it feeds), not its work over the batches the
  root handed on: the capture's edges cut batches, and on a GPU the profiler's slow start lets the buffers
  fill with batches made before it. A pipeline with no batch size in the trace divides by the root's calls.
- bound: the stage's work per batch over the elements it works on at once (its parallelism, at most the
  host's cores) is the least time it needs per batch; the stage with the longest bound limits the
  pipeline's throughput, and the ratio to the next one says by how much.

What a capture cannot say: stages that overlap share the cores, so a bound is a floor, not a forecast; a
Python function holds the GIL and runs one at a time whatever its parallelism; and on a CPU-only machine
training's own ops compete for the same cores.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfopt.profiling.trace import load_xspace, merge_intervals

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf.xplane_pb2 import XPlane

ASYNC_KINDS = frozenset(
    {
        "Prefetch",
        "ParallelMap",
        "ParallelMapV2",
        "MapAndBatch",
        "ParallelInterleave",
        "ParallelInterleaveV2",
        "ParallelInterleaveV3",
        "ParallelInterleaveV4",
        "LegacyParallelInterleave",
        "ParallelBatch",
        "ParseExample",
        "DataService",
        "ParallelFilter",
    }
)
"""Iterators whose `GetNext` waits on a buffer that background threads fill (xprof's list, and the newer
versions of the same datasets)."""

MAP_KINDS = frozenset({"Map", "ParallelMap", "ParallelMapV2", "MapAndBatch", "ParseExample"})
FILE_SOURCE_KINDS = frozenset({"TFRecord", "TextLine", "FixedLengthRecord", "SSTable", "Directed"})
INTERLEAVE_KINDS = frozenset({"Interleave", "FlatMap"})
PYTHON_SOURCE_KINDS = frozenset({"Generator", "FromGenerator"})
# Kinds that only pass elements on (buffers, epochs, options): listed, never named as the bottleneck.
PASS_THROUGH_KINDS = frozenset(
    {
        "Root",
        "Model",
        "Prefetch",
        "ForeverRepeat",
        "FiniteRepeat",
        "Repeat",
        "Options",
        "MaxIntraOpParallelism",
        "PrivateThreadPool",
        "ModelDataset",
        "FiniteTake",
        "Take",
        "Skip",
        "FiniteSkip",
    }
)

_ITERATOR_PREFIX = "Iterator::"
_FUNCTION_LAUNCH = "InstantiatedCapturedFunction::RunAsync"
_FUNCTION_RUN = "ExecutorState::Process"
# The host is the limit when spreading all stages' work over every core takes this share of the bound.
HOST_LIMIT_FRACTION = 0.8
# A pipeline whose slowest stage needs less than this share of the training step per batch keeps up.
KEEPS_UP_FRACTION = 0.5


@dataclasses.dataclass(frozen=True)
class Stage:
    """One transformation of the pipeline, as the capture saw it.

    Attributes:
        name: The dataset's name in the trace: `MapDataset:3`, `fused(MapDataset:3,BatchDatasetV2:4)`
            after tf.data fused two, or the `name=` the user gave the transformation.
        kind: The iterator's kind: `Map`, `ParallelMapV2`, `MapAndBatch`, `TensorSlice`, `Prefetch`, ...
        label: What the tables show: the kind with the function's name where it is known
            (`map slow_augment`), else with the dataset's name.
        depth: Its distance from the pipeline's root (0); the source is deepest.
        calls: Its `GetNext` calls in the capture (elements or batches it handed on).
        function_calls: The function runs it launched on background threads.
        work_seconds: Thread time producing its elements, inputs excluded, over the whole capture.
        wait_seconds: For a buffered (asynchronous) stage, how long its consumers waited on its buffer.
        parallelism: Elements it works on at once: what AUTOTUNE last set, the user's number, 1 for a
            synchronous stage; None for stages that only buffer.
        autotuned: Whether AUTOTUNE chose the parallelism (None where the trace does not say).
        buffer: Its buffer's size where it has one (prefetch's `buffer_limit`, shuffle's `buffer_size`).
        concurrency: For a stage running functions on background threads, how many ran at once on average
            while any ran.
        work_per_batch_seconds: Its work per batch the pipeline handed to training.
        bound_seconds_per_batch: Work per batch over the elements it can work on at once: its parallelism,
            capped at the host's cores unless the trace shows more ran at once (functions that sleep or
            wait on I/O need no core). The least time it needs per batch.
    """

    name: str
    kind: str
    label: str
    depth: int
    calls: int
    function_calls: int
    work_seconds: float
    wait_seconds: float
    parallelism: int | None
    autotuned: bool | None
    buffer: int | None
    concurrency: float | None
    work_per_batch_seconds: float
    bound_seconds_per_batch: float

    @property
    def seconds_per_element(self) -> float | None:
        """Work per element it produced (per function run for a buffered map), None without calls."""
        count = self.function_calls or self.calls
        return self.work_seconds / count if count else None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "seconds_per_element": self.seconds_per_element}


@dataclasses.dataclass(frozen=True)
class PipelineStages:
    """The stages of the pipeline that fed training, the one bounding its throughput, and its fix.

    Attributes:
        stages: Every stage, the longest bound first; stages that only pass elements on (prefetch,
            repeat) after the others.
        batches: Batches the pipeline's root handed to training in the capture.
        cpu_count: The cores the bounds were computed for.
        bottleneck: The stage with the longest bound (None when no stage worked measurably).
        margin: The bottleneck's bound over the next stage's (how much faster the bottleneck must get
            before another stage limits); None with one working stage.
        host_limited: Whether all stages' work spread over every core comes close to the bottleneck's
            bound: parallelism cannot help, the host's cores are the limit.
        recipe: The tfopt recipe that addresses the bottleneck, None where none does.
        fix: What to do, in one or two sentences with the numbers.
        notes: What the capture could not tell.
    """

    stages: tuple[Stage, ...]
    batches: int
    cpu_count: int
    bottleneck: Stage | None
    margin: float | None
    host_limited: bool
    recipe: str | None
    fix: str
    notes: tuple[str, ...] = ()

    @property
    def total_work_per_batch_seconds(self) -> float:
        return sum(stage.work_per_batch_seconds for stage in self.stages)

    def share(self, stage: Stage) -> float:
        """A stage's share of the pipeline's work, 0..1."""
        total = self.total_work_per_batch_seconds
        return stage.work_per_batch_seconds / total if total else 0.0

    def top_line(self) -> str:
        """One line for a terminal or a log: the bounding stage, its numbers and the fix."""
        if self.bottleneck is None:
            return self.fix
        stage = self.bottleneck
        return (
            f"slowest input stage: {stage.label} ({_milliseconds(stage.bound_seconds_per_batch)} per batch at "
            f"parallelism {stage.parallelism or 1}, {self.share(stage):.0%} of the pipeline's work) -> "
            f"{self.recipe or 'no recipe'}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "cpu_count": self.cpu_count,
            "bottleneck": self.bottleneck.label if self.bottleneck else None,
            "margin": self.margin,
            "host_limited": self.host_limited,
            "recipe": self.recipe,
            "fix": self.fix,
            "notes": list(self.notes),
            "stages": [{**stage.to_dict(), "share": self.share(stage)} for stage in self.stages],
        }


def pipeline_stages(
    xplane: str | Path, *, cpu_count: int, dataset: tf.data.Dataset | None = None, step_seconds: float | None = None
) -> PipelineStages | None:
    """The stage table of the busiest input pipeline in a capture.

    Args:
        xplane: The capture's `.xplane.pb`.
        cpu_count: The cores of the host the capture ran on (parallelism beyond them does not help).
        dataset: The tf.data pipeline that was captured, where at hand: its graph names each map's function.
        step_seconds: The mean wall training step: a pipeline whose slowest stage needs well under it per
            batch keeps up, and gets no recipe.

    Returns:
        The stages, or None when the capture holds no tf.data iterator events (data fed from NumPy arrays
        through Keras' own adapter still runs through tf.data; a capture without any has no input pipeline).
    """
    events = _read_iterator_events(xplane)
    roots = [name for name in events.roots if events.calls.get(name)]
    if not roots:
        return None
    root = max(roots, key=lambda name: events.calls[name])
    members = _descendants(root, events.parents)
    batches = events.calls[root]
    sized = any("batch_size" in events.parameters[name] for name in members)
    functions = _function_names(dataset) if dataset is not None else {}
    stages = []
    for name in members:
        kind = events.kinds[name]
        work = events.function_seconds[name] if kind in ASYNC_KINDS else events.self_seconds[name]
        parameters = events.parameters[name]
        parallelism = _parallelism(kind, parameters)
        busy = sum(high - low for low, high in merge_intervals(events.function_intervals[name])) / 1e12
        concurrency = work / busy if kind in ASYNC_KINDS and busy > 0 else None
        # At most the cores for work that needs a core; more where the trace shows more ran at once (a
        # function that sleeps or waits on I/O).
        at_once = max(min(parallelism or 1, max(cpu_count, 1)), min(concurrency or 0.0, parallelism or 1))
        runs = events.function_calls[name] or events.calls[name]
        per_run = _runs_per_batch(name, events, root) if sized and runs else None
        per_batch = work / runs * per_run if per_run else work / batches
        stages.append(
            Stage(
                name=name,
                kind=kind,
                label=_label(kind, name, functions),
                depth=_depth(name, events.parents, root),
                calls=events.calls[name],
                function_calls=events.function_calls[name],
                work_seconds=work,
                wait_seconds=events.self_seconds[name] if kind in ASYNC_KINDS else 0.0,
                parallelism=parallelism,
                autotuned=_flag(parameters.get("autotune")),
                buffer=_buffer(parameters),
                concurrency=concurrency,
                work_per_batch_seconds=per_batch,
                bound_seconds_per_batch=per_batch / at_once,
            )
        )
    stages = _numbered_maps(stages)
    # Stages that work first, the longest bound first; those that only pass elements on (buffers, epochs) last.
    stages.sort(key=lambda stage: (stage.kind in PASS_THROUGH_KINDS, -stage.bound_seconds_per_batch, stage.depth))
    return _conclude(tuple(stages), batches, cpu_count, step_seconds)


# tf.data's own dataset names (`MapDataset:3`, `fused(ParallelMapDatasetV2:4,BatchDatasetV2:5)`), not a `name=`.
_DEFAULT_NAME = re.compile(r"\w+Dataset(V\d+)?:\d+|fused\(.*\)")


def _numbered_maps(stages: list[Stage]) -> list[Stage]:
    """The maps that neither a graph nor a `name=` names, labelled by their place among the pipeline's maps
    counted from the source, as the user's code has them (`map #2 of 3 from the source (MapDataset:3)`): a
    trace holds the datasets' names, never the functions'. tf.data's own fusions count as one map each."""
    maps = sorted((stage for stage in stages if stage.kind in MAP_KINDS), key=lambda stage: -stage.depth)
    places = {
        stage.name: ", the only map" if len(maps) == 1 else f" #{place} of {len(maps)} from the source"
        for place, stage in enumerate(maps, start=1)
    }
    return [
        dataclasses.replace(
            stage, label=f"{_KIND_WORDS.get(stage.kind, stage.kind)}{places[stage.name]} ({stage.name})"
        )
        if stage.name in places and stage.label.endswith(f"({stage.name})") and _DEFAULT_NAME.fullmatch(stage.name)
        else stage
        for stage in stages
    ]


def _conclude(stages: tuple[Stage, ...], batches: int, cpu_count: int, step_seconds: float | None) -> PipelineStages:
    candidates = [stage for stage in stages if stage.kind not in PASS_THROUGH_KINDS and stage.work_seconds > 0]
    notes = [
        (
            "Bounds are floors: stages running at once share the cores, and a Python function (py_function, "
            "numpy_function) runs one call at a time under the GIL whatever its parallelism."
        )
    ]
    if not candidates:
        return PipelineStages(
            stages,
            batches,
            cpu_count,
            None,
            None,
            False,
            None,
            "No stage of the input pipeline did measurable work in the capture.",
            tuple(notes),
        )
    bottleneck = candidates[0]
    following = candidates[1] if len(candidates) > 1 else None
    margin = (
        bottleneck.bound_seconds_per_batch / following.bound_seconds_per_batch
        if following is not None and following.bound_seconds_per_batch > 0
        else None
    )
    spread = sum(stage.work_per_batch_seconds for stage in stages) / max(cpu_count, 1)
    # Work that ran more at once than there are cores waited, not computed: the cores are not its limit.
    host_limited = (
        spread >= HOST_LIMIT_FRACTION * bottleneck.bound_seconds_per_batch
        and (bottleneck.concurrency or 1.0) <= cpu_count * 1.1
    )
    if step_seconds and bottleneck.bound_seconds_per_batch < KEEPS_UP_FRACTION * step_seconds:
        recipe, fix = (
            None,
            (
                f"The pipeline keeps up: its slowest stage, {bottleneck.label}, needs "
                f"{_milliseconds(bottleneck.bound_seconds_per_batch)} per batch against a "
                f"{_milliseconds(step_seconds)} training step."
            ),
        )
    else:
        recipe, fix = _fix(bottleneck, cpu_count, host_limited, spread)
    return PipelineStages(stages, batches, cpu_count, bottleneck, margin, host_limited, recipe, fix, tuple(notes))


def _fix(stage: Stage, cpu_count: int, host_limited: bool, spread_seconds: float) -> tuple[str | None, str]:
    """The recipe and the advice for the bounding stage."""
    at_once = stage.parallelism or 1
    bound = f"{stage.label} needs {_milliseconds(stage.bound_seconds_per_batch)} per batch"
    host = (
        f"All stages' work spread over the {cpu_count} cores takes {_milliseconds(spread_seconds)} per batch: "
        "the host is the limit. Beyond it: move preprocessing to more CPUs (data_service: tf.data service "
        "workers on other hosts, or on this host's spare cores), cache the stage's output where it is the "
        "same every epoch, convert decoded data to TFRecord once (tfrecord), or a host with more cores."
    )
    if stage.kind in MAP_KINDS and at_once < cpu_count and not host_limited:
        return "data_pipeline", (
            f"{bound} running {at_once} element(s) at a time on {cpu_count} cores: the graph "
            "rewrite (data_pipeline) runs it with num_parallel_calls=AUTOTUNE."
        )
    if stage.kind in FILE_SOURCE_KINDS or stage.kind in INTERLEAVE_KINDS:
        return "tfrecord", (
            f"{bound} reading its input: large TFRecord shards read in parallel "
            "(interleave with num_parallel_calls) replace many small sequential reads."
        )
    if stage.kind in PYTHON_SOURCE_KINDS:
        return "tfrecord", (
            f"{bound} in a Python generator, one element at a time under the GIL: convert its "
            "output to TFRecord files once and read those instead."
        )
    if stage.concurrency is not None and stage.concurrency > cpu_count * 1.1:
        return None, (
            f"{bound} with {stage.concurrency:.0f} calls running at once on {cpu_count} cores: its calls "
            "wait (I/O, a sleep, a remote call) more than they compute. More calls at once (num_parallel_calls "
            "above the core count, with a private thread pool that large), caching its output, or faster "
            "storage shorten it."
        )
    if host_limited or at_once >= cpu_count:
        # Already parallel with every core busy: only other CPUs can take the work.
        return "data_service", f"{bound} at parallelism {at_once}. {host}"
    if stage.kind in ("Batch", "BatchV2", "BatchDatasetV2", "PaddedBatch", "PaddedBatchV2"):
        return "data_pipeline", (
            f"{bound} assembling batches: the graph rewrite fuses the map before it with the "
            "batch and runs it in parallel."
        )
    return "data_pipeline", f"{bound}: parallel, prefetched stages (data_pipeline) let it run ahead of training."


@dataclasses.dataclass
class _IteratorEvents:
    calls: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    self_seconds: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    function_seconds: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    function_intervals: dict[str, list[tuple[int, int]]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    function_calls: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    kinds: dict[str, str] = dataclasses.field(default_factory=dict)
    parents: dict[str, str] = dataclasses.field(default_factory=dict)  # stage -> its consumer's stage
    parameters: dict[str, dict[str, Any]] = dataclasses.field(default_factory=lambda: defaultdict(dict))
    roots: set[str] = dataclasses.field(default_factory=set)


def _read_iterator_events(xplane: str | Path) -> _IteratorEvents:
    result = _IteratorEvents()
    for plane in load_xspace(xplane).planes:
        if not plane.name.startswith("/host:"):
            continue
        stat_names = {key: metadata.name for key, metadata in plane.stat_metadata.items()}
        iterator_stage: dict[int, str] = {}  # iterator id -> stage (dataset name)
        iterator_parent: dict[int, int] = {}
        launches: list[tuple[int, int | None]] = []  # (function run id, the launching iterator's id)
        runs: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for line in plane.lines:
            stack: list[tuple[int, str, list[int], int]] = []  # open iterator events: end, stage, times, id
            last_outer: int | None = None  # the last iterator event this thread called from outside any other
            for event in sorted(line.events, key=lambda event: event.offset_ps):
                name = plane.event_metadata[event.metadata_id].name
                start = line.timestamp_ns * 1000 + event.offset_ps
                end = start + event.duration_ps
                if name.startswith(_ITERATOR_PREFIX):
                    stats = _stats(event, plane, stat_names)
                    if "id" not in stats:
                        continue
                    iterator_id = stats["id"]
                    stage = str(stats.get("name") or name)
                    iterator_stage[iterator_id] = stage
                    if "parent_id" in stats:
                        iterator_parent[iterator_id] = stats["parent_id"]
                    if name.count("::") == 1:  # `Iterator::Root` wraps the last dataset, under the same name
                        result.roots.add(stage)
                        continue
                    kind = re.sub(r"\[\d+\]$", "", name.rsplit("::", 1)[-1])
                    result.kinds[stage] = kind
                    result.calls[stage] += 1
                    # the last value of each, but not "unavailable" (AUTOTUNE has not set it yet)
                    result.parameters[stage].update(
                        {
                            key: value
                            for key, value in stats.items()
                            if key not in ("id", "parent_id", "name") and value != "unavailable"
                        }
                    )
                    while stack and stack[-1][0] <= start:
                        _close(stack.pop(), result)
                    if stack:
                        stack[-1][2].append(event.duration_ps)
                    else:
                        last_outer = iterator_id
                    stack.append((end, stage, [event.duration_ps], iterator_id))
                elif name == _FUNCTION_LAUNCH:
                    while stack and stack[-1][0] <= start:
                        _close(stack.pop(), result)
                    stats = _stats(event, plane, stat_names)
                    # Inside an iterator's GetNext, the launch is that iterator's; outside, it is by the runner
                    # thread of the iterator whose input it has just read.
                    launcher = stack[-1][3] if stack else iterator_parent.get(last_outer) if last_outer else None
                    if "id" in stats:
                        launches.append((stats["id"], launcher))
                elif name == _FUNCTION_RUN:
                    stats = _stats(event, plane, stat_names)
                    if "id" in stats:
                        runs[stats["id"]].append((start, end))
            while stack:
                _close(stack.pop(), result)
        for iterator_id, parent_id in iterator_parent.items():
            if parent_id in iterator_stage:
                result.parents[iterator_stage[iterator_id]] = iterator_stage[parent_id]
        for run_id, launcher_id in launches:
            launcher = iterator_stage.get(launcher_id) if launcher_id is not None else None
            if launcher is None or run_id not in runs:
                continue
            run = merge_intervals(runs[run_id])
            result.function_seconds[launcher] += sum(high - low for low, high in run) / 1e12
            result.function_intervals[launcher] += run
            result.function_calls[launcher] += 1
    return result


def _close(entry: tuple[int, str, list[int], int], result: _IteratorEvents) -> None:
    """Adds a finished iterator event's self time: its duration less its nested input events'."""
    _, stage, durations, _ = entry
    result.self_seconds[stage] += max(0, durations[0] - sum(durations[1:])) / 1e12


def _stats(event: Any, plane: XPlane, stat_names: Mapping[int, str]) -> dict[str, Any]:
    values = {}
    for stat in event.stats:
        field = stat.WhichOneof("value")
        if field == "ref_value":
            values[stat_names.get(stat.metadata_id, "")] = stat_names.get(stat.ref_value, "")
        elif field is not None:
            values[stat_names.get(stat.metadata_id, "")] = getattr(stat, field)
    return values


def _descendants(root: str, parents: Mapping[str, str]) -> list[str]:
    children: dict[str, list[str]] = defaultdict(list)
    for child, parent in parents.items():
        if child != parent:
            children[parent].append(child)
    found, todo = [], [root]
    while todo:
        stage = todo.pop()
        if stage not in found:
            found.append(stage)
            todo.extend(children[stage])
    return found


def _runs_per_batch(stage: str, events: _IteratorEvents, root: str) -> int | None:
    """How many of the stage's elements (or function runs, for a stage that runs one per element) make one
    batch handed to training: the batch sizes of the batching stages from it to the root, multiplied. A
    batching stage's own size counts where its work is per element (`MapAndBatch`), not per batch. None where
    the way to the root passes a stage that changes the count otherwise (unbatch, rebatch, filter, flat_map)
    or says no readable batch size."""
    runs, current, seen = 1, stage, set()
    while current not in seen:
        seen.add(current)
        if current != stage and events.kinds.get(current) in _COUNT_CHANGING_KINDS:
            return None
        size = events.parameters[current].get("batch_size")
        if size is not None and (current != stage or events.function_calls[stage]):
            if not str(size).isdigit():
                return None
            runs *= max(1, int(size))
        if current == root or current not in events.parents:
            break
        current = events.parents[current]
    return runs


# Stages between a stage and the root whose elements are not its elements one for one (batching aside): an
# interleave's input is a file list, and its per-file pipelines are its children too.
_COUNT_CHANGING_KINDS = frozenset(
    {
        "Unbatch",
        "Rebatch",
        "RebatchV2",
        "Filter",
        "FlatMap",
        "Interleave",
        "ParallelInterleave",
        "ParallelInterleaveV2",
        "ParallelInterleaveV3",
        "ParallelInterleaveV4",
        "LegacyParallelInterleave",
    }
)


def _depth(stage: str, parents: Mapping[str, str], root: str) -> int:
    depth = 0
    while stage != root and stage in parents and depth < 64:
        stage, depth = parents[stage], depth + 1
    return depth


def _parallelism(kind: str, parameters: Mapping[str, Any]) -> int | None:
    value = parameters.get("parallelism")
    if isinstance(value, int) or str(value).isdigit():  # a number (or a string of one)
        return max(1, int(value))
    if kind in ASYNC_KINDS or kind in PASS_THROUGH_KINDS:
        return None
    return 1


def _buffer(parameters: Mapping[str, Any]) -> int | None:
    for key in ("buffer_limit", "buffer_size"):
        if key in parameters:
            return int(parameters[key])
    return None


def _flag(value: Any) -> bool | None:
    return None if value is None else str(value).lower() == "true"


def _label(kind: str, name: str, functions: Mapping[str, str]) -> str:
    """`map slow_augment` where the dataset's graph names the function, `map (MapDataset:3)` otherwise; a
    fused stage names the functions of its parts (`map+batch cheap_flip`)."""
    parts = name[len("fused(") : -1].split(",") if name.startswith("fused(") and name.endswith(")") else [name]
    words = [functions[part] for part in parts if part in functions]
    if words:
        return f"{_KIND_WORDS.get(kind, kind)} {' + '.join(words)}"
    return f"{_KIND_WORDS.get(kind, kind)} ({name})"


_KIND_WORDS = {
    "Map": "map",
    "ParallelMap": "parallel map",
    "ParallelMapV2": "parallel map",
    "MapAndBatch": "map+batch",
    "TensorSlice": "source: tensor slices",
    "Prefetch": "prefetch",
    "Shuffle": "shuffle",
    "BatchV2": "batch",
    "Batch": "batch",
    "PaddedBatch": "padded batch",
    "PaddedBatchV2": "padded batch",
    "Cache": "cache",
    "MemoryCache": "cache",
    "ParallelInterleaveV4": "parallel interleave",
    "Interleave": "interleave",
    "FlatMap": "flat map",
    "TFRecord": "source: TFRecord",
    "Generator": "source: Python generator",
    "Filter": "filter",
    "ForeverRepeat": "repeat",
    "FiniteRepeat": "repeat",
    "Root": "root",
    "Range": "source: range",
    "ParallelBatch": "parallel batch",
}


def _function_names(dataset: tf.data.Dataset) -> dict[str, str]:
    """Dataset name in the trace -> the function it runs (`slow_augment`), from the pipeline's graph."""
    import tensorflow as tf
    from tensorflow.core.framework import dataset_metadata_pb2

    graph = tf.compat.v1.GraphDef()
    try:
        graph.ParseFromString(dataset._as_serialized_graph().numpy())
    except Exception:  # noqa: BLE001 - a dataset that cannot serialise keeps the trace's names
        return {}
    names = {}
    for node in graph.node:
        if "metadata" not in node.attr or "f" not in node.attr or not node.attr["metadata"].s:
            continue
        metadata = dataset_metadata_pb2.Metadata()
        metadata.ParseFromString(node.attr["metadata"].s)
        function = node.attr["f"].func.name
        if metadata.name and function:
            names[metadata.name.decode() if isinstance(metadata.name, bytes) else metadata.name] = _readable(function)
    return names


def _readable(function: str) -> str:
    """`__inference_Dataset_map_slow_augment_21` -> `slow_augment`; `<lambda>` traces read `lambda`."""
    name = re.sub(r"^__inference_", "", function)
    name = re.sub(r"^Dataset_(map|filter|flat_map|interleave|parallel_interleave)_", "", name)
    name = re.sub(r"_\d+$", "", name)
    return "lambda" if name == "<lambda>" or name.startswith("_lambda") else name


def _milliseconds(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"
