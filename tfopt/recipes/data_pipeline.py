"""tf.data tuning: keep the accelerator fed without changing a single element.

For a dataset tfopt knows the source of (`tfopt.data` sources), the source builds its own optimized
pipeline (parallel interleave and decode, cache after decode and before augmentation). For any other
`tf.data.Dataset` this recipe tunes what is there:

- its graph is rewritten (`tfopt.data.rewrite`): sequential maps run in parallel (AUTOTUNE, order
  kept), batches are made in parallel, and the pipeline ends with a prefetch bounded by the RAM
  budget. `tf.data.Options` alone cannot do this: TF's `map_parallelization` skips stateful maps,
  and py_function, numpy_function and every random op are stateful (docs/recipes/data_pipeline.md
  measures the tf.data guide's py_function case after Options alone).
  Maps with random ops and maps calling Python are parallelized by default, with an opt-out each.
- `tf.data.Options`: autotuning within an explicit RAM budget, and (optionally) non-deterministic order.
- a cache at the end of the pipeline, but only where that is valid: the pipeline has no random op or
  shuffle (a cache would freeze augmentation and order), no py_function (tfopt cannot see inside),
  is finite, and fits the RAM budget.

It reads no element of the pipeline: the sizes that the prefetch and the cache are checked against come
from the static shapes of `element_spec` (`tfopt.data.graph.element_bytes`). Reading one would run the
user's py_function and move a reshuffling shuffle on by an epoch; an empty pipeline, or one whose first
element fails, is tuned like any other. Where the sizes are not static, the notes say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from tfopt.errors import RecipeConfigError
from tfopt.plan import Plan
from tfopt.recipes.base import Recipe, Stage

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.core.framework.graph_pb2 import GraphDef

CACHE_CHOICES = ("auto", "memory", "none")
# Op-name fragments that make a pipeline's output differ between epochs, or that hide what it does.
# What makes a pipeline's output differ between epochs, so that a cache of it would freeze one epoch, and
# what the user can do instead.
_NOT_CACHEABLE = {
    "Random": ("random op", "cache before the random maps yourself"),
    "Shuffle": ("shuffle", "put your .cache() before .shuffle()"),
    "PyFunc": ("py_function", "cache before it yourself if its function always returns the same"),
}
# Registered as stateful, yet they return the same for the same input every epoch: lookup tables that are
# created and filled once (adapted StringLookup, TextVectorization, IntegerLookup) and read.
_DETERMINISTIC_STATEFUL_OPS = frozenset(
    {
        "HashTableV2",
        "AnonymousHashTable",
        "InitializeTableV2",
        "InitializeTableFromTextFileV2",
        "LookupTableFindV2",
        "LookupTableSizeV2",
        "LookupTableImportV2",
        "Assert",
        "NoOp",
    }
)


def tune_pipeline(
    dataset: tf.data.Dataset,
    *,
    cache: str = "auto",
    deterministic: bool = True,
    ram_budget_bytes: int | None = None,
    parallel_random_maps: bool = True,
    parallel_python_maps: bool = True,
) -> tf.data.Dataset:
    """Functional form: the same elements, delivered faster.

    Args:
        dataset: A `tf.data.Dataset`.
        cache: "auto" (cache in memory where valid and within the budget), "memory" (cache in memory
            where valid, whatever the size), "none", or a file path prefix for an on-disk cache.
        deterministic: Keep element order. False lets parallel stages deliver out of order (faster).
        ram_budget_bytes: RAM that autotuned buffers, an automatic cache and the prefetch may use;
            `tfopt.data.ram_budget`'s default share of the available memory when None.
        parallel_random_maps: Run maps whose only state is random ops in parallel: the draws keep their
            distribution, not their assignment to elements. False keeps the exact draw order.
        parallel_python_maps: Run maps calling py_function/numpy_function in parallel. False for a
            Python function with mutable state shared between calls.

    Returns:
        The tuned dataset.

    Example:
        >>> import tensorflow as tf
        >>> data = tf.data.Dataset.range(6).map(lambda i: i * 2).batch(2)
        >>> [batch.numpy().tolist() for batch in tune_pipeline(data)]
        [[0, 2], [4, 6], [8, 10]]
    """
    if ram_budget_bytes is None:
        from tfopt.data.ram_budget import ram_budget_bytes as default_budget

        ram_budget_bytes = default_budget()
    tuned, _ = _tune(
        dataset,
        cache=cache,
        deterministic=deterministic,
        ram_budget_bytes=ram_budget_bytes,
        parallel_random_maps=parallel_random_maps,
        parallel_python_maps=parallel_python_maps,
    )
    return tuned


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataPipeline(Recipe):
    """Tunes the tf.data pipeline: parallel stages, autotuning within a RAM budget, valid caching, prefetch.

    Args:
        cache: "auto", "memory", "none" or a file path prefix (see `tune_pipeline`).
        deterministic: Keep element order.
        ram_budget_fraction: Share of the available host RAM that autotuned buffers, the cache and the
            prefetch may use, in (0, 0.9]; a tfopt source's own optimized pipeline uses it too.
        parallel_random_maps: Parallelize maps whose only state is random ops; false keeps the exact draws.
        parallel_python_maps: Parallelize maps calling Python; false for Python functions with shared state.

    Example:
        >>> DataPipeline(cache="none").get_config()  # doctest: +NORMALIZE_WHITESPACE
        {'cache': 'none', 'deterministic': True, 'ram_budget_fraction': 0.25, 'parallel_random_maps': True,
         'parallel_python_maps': True}
    """

    name: ClassVar[str] = "data_pipeline"
    stage: ClassVar[Stage] = Stage.DATA

    cache: str = "auto"
    deterministic: bool = True
    ram_budget_fraction: float = 0.25
    parallel_random_maps: bool = True
    parallel_python_maps: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.cache, str) or not self.cache:
            raise RecipeConfigError(
                f"data_pipeline: cache={self.cache!r} is not valid. Expected one of "
                f"{', '.join(map(repr, CACHE_CHOICES))} or a file path prefix.",
                setting="cache",
            )
        for setting in ("deterministic", "parallel_random_maps", "parallel_python_maps"):
            if not isinstance(getattr(self, setting), bool):
                raise RecipeConfigError(
                    f"data_pipeline: {setting}={getattr(self, setting)!r} must be true or false.", setting=setting
                )
        if (
            isinstance(self.ram_budget_fraction, bool)
            or not isinstance(self.ram_budget_fraction, (int, float))
            or not 0 < self.ram_budget_fraction <= 0.9
        ):
            raise RecipeConfigError(
                f"data_pipeline: ram_budget_fraction={self.ram_budget_fraction!r} is out of "
                "range. Expected a number in (0, 0.9], e.g. 0.25 for a quarter of the RAM.",
                setting="ram_budget_fraction",
            )

    def check_for_source(self) -> None:
        if self.cache not in ("auto", "none"):
            raise RecipeConfigError(
                f"data_pipeline: cache={self.cache!r} does not apply to a tfopt.data source, whose optimized "
                "pipeline caches the decoded examples where they fit the RAM budget. Use cache: auto (or none "
                "to never cache), or pass a tf.data.Dataset to have its end cached as asked.",
                setting="cache",
            )

    def check(self, plan: Plan) -> None:
        from pathlib import Path

        if plan.source is not None:
            self.check_for_source()
        if self.cache not in CACHE_CHOICES and not Path(self.cache).parent.is_dir():
            raise RecipeConfigError(
                f"data_pipeline: cache={self.cache!r} is a file path whose directory "
                f"{str(Path(self.cache).parent)!r} does not exist. Create it first.",
                setting="cache",
            )

    def __call__(self, plan: Plan) -> Plan:
        from tfopt.data.ram_budget import ram_budget_bytes

        budget = ram_budget_bytes(self.ram_budget_fraction)
        if plan.source is not None:
            dataset = plan.source.pipeline(
                batch_size=plan.batch_size,
                optimized=True,
                ram_budget_bytes=budget,
                cache=self.cache == "auto",
                deterministic=self.deterministic,
            )
            return plan.replace(dataset=dataset).record(
                self.name,
                f"rebuilt from the source ({plan.source.describe()}) as an optimized pipeline: "
                f"{'cache after decode where it fits, ' if self.cache == 'auto' else 'no cache, '}"
                f"autotune within {budget / 2**30:.1f} GiB of RAM, "
                f"{'deterministic' if self.deterministic else 'non-deterministic'} order",
            )
        dataset, notes = _tune(
            plan.dataset,
            cache=self.cache,
            deterministic=self.deterministic,
            ram_budget_bytes=budget,
            parallel_random_maps=self.parallel_random_maps,
            parallel_python_maps=self.parallel_python_maps,
        )
        return plan.replace(dataset=dataset).record(self.name, "; ".join(notes))

    def beside(self, others: Sequence[Recipe]) -> Recipe:
        if self.cache == "auto" and any(other.name == "data_service" for other in others):
            return ServedDataPipeline(requested=self)
        return self


@dataclasses.dataclass(frozen=True)
class ServedDataPipeline(Recipe):
    """`DataPipeline(cache="auto")` in a chain with `data_service`: tuned the same, with no in-memory cache.
    The service runs the pipeline on its workers in one job per epoch, so a cache there would be made anew
    every epoch, and the service recipe would keep the pipeline local rather than redo that work.

    Attributes:
        requested: The recipe as the user gave it (its config is this recipe's config).
    """

    name: ClassVar[str] = "data_pipeline"
    stage: ClassVar[Stage] = Stage.DATA

    requested: DataPipeline

    def check(self, plan: Plan) -> None:
        self.requested.check(plan)

    def __call__(self, plan: Plan) -> Plan:
        tuned = dataclasses.replace(self.requested, cache="none")(plan)
        return tuned.amend(
            self.name,
            "no cache: data_service serves this pipeline from its workers, one job per epoch, where a cache in "
            "memory would be filled anew every epoch",
        )

    def get_config(self) -> dict[str, Any]:
        return self.requested.get_config()


def _tune(
    dataset: tf.data.Dataset,
    *,
    cache: str,
    deterministic: bool,
    ram_budget_bytes: int,
    parallel_random_maps: bool,
    parallel_python_maps: bool,
) -> tuple[Any, list[str]]:
    """Cache where valid, then rewrite for parallelism (which adds the final prefetch), then options (the RAM
    budget and the order the user's own pipeline options set are theirs).

    Applied to its own output it changes nothing: the rewrite returns a pipeline with nothing left to
    parallelize as it is, the cache is refused on a pipeline that holds one, and options already set
    are not set again.
    """
    import tensorflow as tf

    from tfopt.data import graph as pipeline_graph
    from tfopt.data.ram_budget import prefetch_batches
    from tfopt.data.rewrite import parallelize
    from tfopt.training.peak_memory import describe_bytes

    # What the user's own options set is kept, and said: a memory cap (which bounds the cache and the prefetch
    # too), an order they let go of.
    own = dataset.options()
    budget_is_theirs, order_is_theirs = own.autotune.ram_budget is not None, own.deterministic is not None
    ram_budget_bytes = own.autotune.ram_budget if budget_is_theirs else ram_budget_bytes
    deterministic = own.deterministic if order_is_theirs else deterministic
    if not deterministic and not order_is_theirs:  # the rewrite's parallel stages follow the pipeline's order
        relaxed = tf.data.Options()
        relaxed.deterministic = False
        dataset = dataset.with_options(relaxed)
    graph, _ = pipeline_graph.read(dataset)  # where it cannot be read, the rewrite below says why
    element_bytes, unsized = pipeline_graph.element_bytes(dataset.element_spec, graph)
    notes = []
    if element_bytes is None:
        notes.append(f"the elements' size is unknown without reading one: {unsized}")
    if cache != "none":
        dataset, note = _cache_where_valid(dataset, graph, cache, ram_budget_bytes, element_bytes)
        notes.append(note)
    prefetch = None if element_bytes is None else prefetch_batches(element_bytes, ram_budget_bytes)
    dataset, rewrite_notes = parallelize(
        dataset,
        prefetch_batches=prefetch,
        parallel_random_maps=parallel_random_maps,
        parallel_python_maps=parallel_python_maps,
    )
    notes.extend(rewrite_notes)
    options = tf.data.Options()
    options.autotune.enabled = True
    options.autotune.ram_budget = ram_budget_bytes
    # tf.data's own rewrites, each unless the user's options turned it off (which the rewrite above kept too).
    options.experimental_optimization.map_parallelization = (
        own.experimental_optimization.map_parallelization is not False
    )
    options.experimental_optimization.parallel_batch = own.experimental_optimization.parallel_batch is not False
    options.deterministic = deterministic
    if dataset.options().merge(options) != dataset.options():
        dataset = dataset.with_options(options)
    notes.append(
        f"autotune within {describe_bytes(ram_budget_bytes)} of RAM"
        f"{' (the budget your pipeline options set)' if budget_is_theirs else ''}, "
        f"{'deterministic' if deterministic else 'non-deterministic'} order"
        f"{' (as your pipeline options set it)' if order_is_theirs else ''}"
    )
    return dataset, notes


def _cache_where_valid(
    dataset: tf.data.Dataset, graph: GraphDef, cache: str, ram_budget_bytes: int, element_bytes: int | None
) -> tuple[Any, str]:
    import tensorflow as tf

    from tfopt.data import graph as pipeline_graph

    if graph is None:
        return dataset, "no cache: tfopt cannot read the pipeline's graph to check it"
    ops = pipeline_graph.pipeline_ops(graph)
    if any("CacheDataset" in op for op in ops):
        return dataset, "no cache added: the pipeline has your own cache()"
    found = [(label, fix) for fragment, (label, fix) in _NOT_CACHEABLE.items() if any(fragment in op for op in ops)]
    found += [
        (f"stateful op {op}", "cache before it yourself where it returns the same each epoch")
        for op in sorted(_stateful_ops(ops))
    ]
    if found:
        return dataset, (
            f"no cache: the pipeline contains {', '.join(label for label, _ in found)}, so caching its "
            f"output would change what later epochs see ({'; '.join(dict.fromkeys(f for _, f in found))})"
        )
    count = int(dataset.cardinality())
    if count == tf.data.INFINITE_CARDINALITY:
        return dataset, "no cache: the pipeline repeats forever (put .repeat() after the cache)"
    if cache != "auto":
        target = "" if cache == "memory" else cache
        if target:
            _check_not_locked(target)
        return dataset.cache(target), f"cached in {'memory' if cache == 'memory' else cache!r} as requested"
    if count == tf.data.UNKNOWN_CARDINALITY:
        return dataset, "no cache: the pipeline's length is unknown, so its size cannot be checked against the budget"
    if element_bytes is None:
        return dataset, "no cache: the elements' size is unknown, so the cache cannot be checked against the budget"
    size_bytes = count * element_bytes
    if size_bytes > ram_budget_bytes:
        return dataset, (
            f"no cache: the data ({size_bytes / 2**30:.2f} GiB) exceeds the RAM budget "
            f"({ram_budget_bytes / 2**30:.2f} GiB)"
        )
    return dataset.cache(), f"cached in memory after the first epoch ({size_bytes / 2**20:.1f} MiB)"


def _check_not_locked(target: str) -> None:
    """Refuses a cache file that tf.data holds locked: a run writing it, or one stopped while it did (the lock
    outlives the process), would fail this one in the middle of its first epoch with TensorFlow's own words."""
    import glob

    locks = sorted(glob.glob(glob.escape(target) + "_*.lockfile"))
    if locks:
        raise RecipeConfigError(
            f"data_pipeline: the cache file {target!r} is locked ({locks[0]}): another run is writing it now, or "
            f"one was stopped while writing it. If none is running, delete {target}_* (and {target}.index, if "
            "there) and run again; or name another cache path.",
            setting="cache",
        )


def _stateful_ops(ops: set[str]) -> set[str]:
    """Ops whose output can differ between runs (e.g. TruncatedNormal, Multinomial): caching would freeze it.

    Stricter than `tfopt.data.graph.stateful_kinds`, which asks whether call order matters: a variable
    read gives the same value to parallel calls, yet a cache would freeze a value that later epochs
    should see change. Dataset sources and function plumbing are registered as stateful too, but they
    replay the same data; calls and control flow (the `If` a `tf.debugging.assert_*` comes in) are as stateful
    as the ops they run, which are among `ops`.
    """
    from tensorflow.python.framework import op_def_registry

    from tfopt.data.graph import CALL_OPS

    return {
        op
        for op in ops
        if "Dataset" not in op
        and op not in ("_Arg", "_Retval")
        and op not in CALL_OPS
        and op not in _DETERMINISTIC_STATEFUL_OPS
        and not any(fragment in op for fragment in _NOT_CACHEABLE)
        and (definition := op_def_registry.get(op)) is not None
        and definition.is_stateful
    }
