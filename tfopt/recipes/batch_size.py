"""Batch size: find the one giving the most examples per second within a memory bound, and use it.

The largest batch that fits is often not the fastest: on CPUs throughput flattens or drops once a
batch's activations leave the caches, and on GPUs it flattens once the device is busy. So
`find_batch_size` times short training trials (a few steps each) at powers of two, stops growing at the
memory bound (a GPU's ResourceExhaustedError or peak allocator memory; on CPUs the peak RSS against a RAM
budget) or when two sizes in a row are no faster, then tries 3/4 and 3/2 of the best. Before each trial
it predicts the trial's memory from the previous ones and skips it if it would break the budget, so the
search does not get the host killed for running out of memory.

A Plan's dataset is already batched: it is rebatched with `Dataset.rebatch`, which splits and merges
batches without unbatching them element by element. Trials rebatch the *repeated* dataset with
`drop_remainder=True`, so every timed batch is full even when the dataset holds fewer examples.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from tfopt.data.batches import rebatch_counted
from tfopt.errors import MeasurementError, RecipeConfigError
from tfopt.plan import Plan, first_inputs
from tfopt.recipes.base import Recipe, Stage
from tfopt.recipes.learning_rate import check_rule, scale_learning_rate
from tfopt.training.batch_search import BatchSizeSearch, Trial, search_batch_sizes

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

_log = logging.getLogger("tfopt")


def find_batch_size(
    plan: Plan,
    *,
    min_batch_size: int = 8,
    max_batch_size: int = 1024,
    memory_budget_bytes: int | None = None,
    trial_steps: int = 3,
    warmup_steps: int = 1,
    refine: bool = True,
    dividing: int | None = None,
) -> BatchSizeSearch:
    """Times short training trials and returns the table; `.best_batch_size` is the fastest within memory.

    Args:
        plan: The plan to search for (its recipes so far apply: dtype policy, XLA, strategy).
        min_batch_size: The first size tried.
        max_batch_size: The largest size tried; also capped at the dataset's size where it is known.
        memory_budget_bytes: The peak a trial may reach: GPU allocator memory (default 90% of the
            smallest GPU's memory, or of the limit `tfopt.runtime` gave the allocator) when the model
            trains on a GPU, else the process' RSS (default: what it holds now plus 80% of the RAM
            available when the search starts).
        trial_steps: Timed steps per trial (after `warmup_steps` untimed ones).
        warmup_steps: Untimed steps per trial: tracing and pipeline warm-up.
        refine: Also try 3/4 and 3/2 of the best power of two.

    Returns:
        The trial table.

    Raises:
        RecipeConfigError: The bounds are out of range.
        MeasurementError: The trial at the plan's own batch size failed for a reason other than memory (at
            another size such a failure ends the search there, as running out of memory does).

    Example:
        >>> search = find_batch_size(plan, max_batch_size=256)  # doctest: +SKIP
        >>> print(search.to_markdown())  # doctest: +SKIP
    """
    from tfopt.training.peak_memory import gpu_memory_in_use_bytes, host_rss_bytes, track_peak_memory

    _check_bounds(min_batch_size, max_batch_size, trial_steps, warmup_steps)
    max_batch_size = min(max_batch_size, _examples_upper_bound(plan) or max_batch_size)
    model = _trial_model(plan)
    # The memory that fills up is where the trial model lives: a plan that says "CPU" while TensorFlow
    # places the model on a GPU anyway must still be bounded by the GPU's allocator, not host RSS.
    gpu_count = len(plan.hardware.gpus) or int(_lives_on_gpu(model))
    if gpu_count:
        kind = "GPU memory"
        budget = memory_budget_bytes or _gpu_budget(plan)
        baseline = gpu_memory_in_use_bytes(gpu_count)
    else:
        import psutil

        kind = "host RSS"
        baseline = host_rss_bytes()
        budget = memory_budget_bytes or int(baseline + 0.8 * psutil.virtual_memory().available)

    def run_trial(batch_size: int) -> Trial:
        with track_peak_memory(gpu_count) as peak:
            try:
                times = _time_trial(model, plan, batch_size, trial_steps, warmup_steps)
            except MeasurementError as error:
                # A size the model cannot take (one whose input or stateful layer fixes the batch) bounds the
                # search as running out of memory does; failing at the size the user trains with is theirs.
                if not _is_out_of_memory(error) and batch_size == plan.batch_size:
                    raise
                _log.info("batch size %d: %s", batch_size, error)
                times, failure = None, "out_of_memory" if _is_out_of_memory(error) else "failed"
            finally:
                gc.collect()  # frees the trial's tensors (and an out-of-memory step's) before the next trial
        if times is None:
            return Trial(batch_size, failure, peak_memory_bytes=peak.peak_bytes)
        status = "over_budget" if budget is not None and peak.peak_bytes > budget else "ok"
        _log.info(
            "batch size %d: %.1f examples/s, peak %s %d bytes (%s)",
            batch_size,
            times.examples_per_second,
            kind,
            peak.peak_bytes,
            status,
        )
        return Trial(batch_size, status, times.examples_per_second, times.median_seconds, peak.peak_bytes)

    trials = search_batch_sizes(
        run_trial,
        min_batch_size=min_batch_size,
        max_batch_size=max_batch_size,
        memory_budget_bytes=budget,
        baseline_bytes=baseline,
        refine=refine,
        dividing=dividing,
    )
    return BatchSizeSearch(trials=tuple(trials), memory_kind=kind, memory_budget_bytes=budget)


def rebatch(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """Functional form: the same examples in batches of `batch_size` (remainder batches kept as before).

    Example:
        >>> import tensorflow as tf
        >>> data = tf.data.Dataset.range(10).batch(3)
        >>> [len(batch) for batch in rebatch(data, 4)], len(rebatch(data, 4))
        ([4, 4, 2], 3)
    """
    import tensorflow as tf

    static_batch = tf.nest.flatten(dataset.element_spec)[0].shape[0]
    # A static batch dimension means the pipeline drops remainders (XLA needs it); keep doing so.
    return rebatch_counted(dataset, batch_size, drop_remainder=static_batch is not None)[0]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSize(Recipe):
    """Trains with the fastest batch size that fits (found by timed trials), or a given one.

    Args:
        batch_size: "auto" to search, or a number of examples per step.
        min_batch_size: Smallest size the search tries.
        max_batch_size: Largest size the search tries.
        dividing: Only sizes that divide this number (beside grad_accum's effective_batch_size, which the
            batch must divide, the chain sets it), or None for any.
        memory_budget_bytes: The peak memory a trial may reach (see `find_batch_size`), or None for the default.
        trial_steps: Timed steps per trial.
        scale_learning_rate: "none", "linear" or "sqrt": scale the learning rate with the batch.

    Example:
        >>> BatchSize(batch_size=64, scale_learning_rate="sqrt").batch_size
        64
    """

    name: ClassVar[str] = "batch_size"
    stage: ClassVar[Stage] = Stage.BATCH  # times the step as mixed_precision and xla made it

    batch_size: int | str = "auto"
    min_batch_size: int = 8
    max_batch_size: int = 1024
    dividing: int | None = None
    memory_budget_bytes: int | None = None
    trial_steps: int = 3
    scale_learning_rate: str = "none"

    def __post_init__(self) -> None:
        if self.batch_size != "auto" and (
            not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1
        ):
            raise RecipeConfigError(
                f"batch_size: batch_size={self.batch_size!r} is not a batch size. Expected "
                "'auto' or a positive integer.",
                setting="batch_size",
            )
        _check_bounds(self.min_batch_size, self.max_batch_size, self.trial_steps, 1)
        if self.dividing is not None and (
            not isinstance(self.dividing, int) or isinstance(self.dividing, bool) or self.dividing < 1
        ):
            raise RecipeConfigError(
                f"batch_size: dividing={self.dividing!r}. Expected a positive integer that the batch sizes tried "
                "must divide, or None for any.",
                setting="dividing",
            )
        if self.memory_budget_bytes is not None and (
            not isinstance(self.memory_budget_bytes, int) or self.memory_budget_bytes <= 0
        ):
            raise RecipeConfigError(
                f"batch_size: memory_budget_bytes={self.memory_budget_bytes!r}. Expected a "
                "positive integer number of bytes, or None for the default.",
                setting="memory_budget_bytes",
            )
        check_rule(self.name, self.scale_learning_rate)

    @property
    def needs_trials(self) -> bool:
        return self.batch_size == "auto"

    def beside(self, others: Sequence[Recipe]) -> Recipe:
        """Searching beside grad_accum with an effective batch: only sizes that divide it, up to half of it,
        so that each update accumulates 2 micro-batches or more (the search would otherwise find a size
        that grad_accum then refuses)."""
        effective = [getattr(other, "effective_batch_size", None) for other in others if other.name == "grad_accum"]
        if not (self.needs_trials and effective and effective[0] and effective[0] >= 2):
            return self
        largest = max(size for size in range(1, effective[0] // 2 + 1) if effective[0] % size == 0)
        return dataclasses.replace(
            self,
            max_batch_size=min(self.max_batch_size, largest),
            min_batch_size=min(self.min_batch_size, largest),
            dividing=effective[0],
        )

    def measured(self, plan: Plan) -> Recipe:
        """With batch_size "auto": searches (`find_batch_size`) and returns the recipe for the size found."""
        if not self.needs_trials:
            return self
        cannot = _cannot_rebatch(plan.dataset)
        if cannot:  # no trial could run: the size stays, and the plan says why
            return KeptBatchSize(requested=self, why=cannot)
        examples = _examples_upper_bound(plan)
        if examples is not None and examples < self.min_batch_size:
            return KeptBatchSize(
                requested=self,
                why=f"the data holds {examples} examples, fewer than min_batch_size={self.min_batch_size}: no size "
                "to try (lower min_batch_size to search below it)",
            )
        search = find_batch_size(
            plan,
            min_batch_size=self.min_batch_size,
            max_batch_size=self.max_batch_size,
            memory_budget_bytes=self.memory_budget_bytes,
            trial_steps=self.trial_steps,
            dividing=self.dividing,
        )
        return SearchedBatchSize(requested=self, search=search)

    def planned(self, plan: Plan) -> Plan | None:
        """The batch and learning rate a given size sets, for the checks after it (grad_accum's effective batch),
        without rebatching the data or reading a batch of it; None for "auto", whose size the search finds."""
        if self.needs_trials:
            return None
        size, rule = self.batch_size, self.scale_learning_rate
        compile_config, _ = scale_learning_rate(
            plan.compile_config, old_batch_size=plan.batch_size, new_batch_size=size, rule=rule
        )
        return plan.replace(batch_size=size, compile_config=compile_config)

    def __call__(self, plan: Plan) -> Plan:
        if self.needs_trials:
            raise RecipeConfigError(
                "batch_size: batch_size='auto' is chosen by timed trials, which a recipe call never runs: pass "
                "the recipe to tfopt.apply (it runs them), or call BatchSize().measured(plan) for the recipe "
                "with the size found, or give batch_size a number.",
                setting="batch_size",
            )
        return _resized(plan, self.batch_size, self.scale_learning_rate, "requested")


@dataclasses.dataclass(frozen=True)
class KeptBatchSize(Recipe):
    """`BatchSize(batch_size="auto")` where no trial can run: the batch stays as it is, and the plan says why.

    Attributes:
        requested: The recipe as the user gave it (its config is this recipe's config).
        why: What keeps the search from running.
    """

    name: ClassVar[str] = "batch_size"
    stage: ClassVar[Stage] = Stage.BATCH

    requested: BatchSize
    why: str

    def __call__(self, plan: Plan) -> Plan:
        return plan.record(self.name, f"left out: {self.why}", skipped=True)

    def get_config(self) -> dict[str, Any]:
        return self.requested.get_config()


@dataclasses.dataclass(frozen=True)
class SearchedBatchSize(Recipe):
    """`BatchSize(batch_size="auto")` once its trials ran: applies the fastest size and records the table.

    Attributes:
        requested: The recipe as the user gave it (its config is this recipe's config).
        search: The trials `find_batch_size` timed.
    """

    name: ClassVar[str] = "batch_size"
    stage: ClassVar[Stage] = Stage.BATCH

    requested: BatchSize
    search: BatchSizeSearch

    def __call__(self, plan: Plan) -> Plan:
        table = ", ".join(
            f"{t.batch_size}: {t.examples_per_second:.0f}/s" if t.status == "ok" else f"{t.batch_size}: {t.status}"
            for t in self.search.trials
        )
        if not any(trial.status == "ok" for trial in self.search.trials) and any(
            trial.status == "failed" for trial in self.search.trials
        ):
            return plan.record(
                self.name,
                f"left out: training failed at every size tried ({table}; the log has each error), as it does "
                "where the model fixes its batch (an Input(batch_size=...), a stateful layer)",
                skipped=True,
            )
        reason = f"fastest of {len(self.search.trials)} trials within the {self.search.memory_kind} bound ({table})"
        return _resized(plan, self.search.best_batch_size, self.requested.scale_learning_rate, reason)

    def get_config(self) -> dict[str, Any]:
        return self.requested.get_config()


def _resized(plan: Plan, batch_size: int, scale_rule: str, reason: str) -> Plan:
    """The plan training with batches of `batch_size`, its learning rate scaled by `scale_rule`."""
    cannot = _cannot_rebatch(plan.dataset)
    if cannot:
        return plan.record(BatchSize.name, f"left out: {cannot}", skipped=True)
    if batch_size == plan.batch_size:
        return plan.record(BatchSize.name, f"kept batch {batch_size}: {reason}", skipped=True)
    dataset = rebatch(plan.dataset, batch_size)
    compile_config, lr_detail = scale_learning_rate(
        plan.compile_config, old_batch_size=plan.batch_size, new_batch_size=batch_size, rule=scale_rule
    )
    sample_inputs = first_inputs(dataset)
    return plan.replace(
        dataset=dataset, batch_size=batch_size, compile_config=compile_config, sample_inputs=sample_inputs
    ).record(BatchSize.name, f"batch {plan.batch_size} -> {batch_size}: {reason}; {lr_detail}")


def _cannot_rebatch(dataset: tf.data.Dataset) -> str | None:
    """Why the dataset's batches cannot be split and merged into batches of another size, or None."""
    import tensorflow as tf

    shapes = [spec.shape for spec in tf.nest.flatten(dataset.element_spec) if isinstance(spec, tf.TensorSpec)]
    open_shapes = [shape for shape in shapes if None in shape[1:]]
    if open_shapes:
        return (
            f"its batches' declared shape {open_shapes[0].as_list()} is open beyond the batch dimension, so batches "
            "of two shapes may meet, which cannot be merged (a padded_batch pads each to its own longest element): "
            "give your padded_batch the size you want, or where every batch has the same shape, say it "
            "(`tf.ensure_shape` in a map)"
        )
    return None


def _trial_model(plan: Plan) -> keras.Model:
    """One throwaway build of the plan for all trials: only the batch differs between them, and Keras
    retraces its train step for each new batch shape, so rebuilding would only add time."""
    from tfopt.builder import build

    return build(plan.replace(data_service=None)).model  # the trials read the local pipeline


def _time_trial(model: keras.Model, plan: Plan, batch_size: int, steps: int, warmup_steps: int) -> Any:
    from tfopt.profiling.timing import time_training_steps

    data = plan.dataset.repeat().rebatch(batch_size, drop_remainder=True)
    return time_training_steps(model, data, steps=steps, warmup_steps=warmup_steps, batch_size=batch_size)


def _is_out_of_memory(error: BaseException) -> bool:
    import tensorflow as tf

    while error is not None:
        if isinstance(error, tf.errors.ResourceExhaustedError):
            return True
        error = error.__cause__
    return False


def _examples_upper_bound(plan: Plan) -> int | None:
    import tensorflow as tf

    batches = int(plan.dataset.cardinality())
    if batches in (int(tf.data.INFINITE_CARDINALITY), int(tf.data.UNKNOWN_CARDINALITY)):
        return None
    return batches * plan.batch_size


def _lives_on_gpu(model: keras.Model) -> bool:
    variables = model.trainable_variables
    return bool(variables) and ":GPU:" in variables[0].value.device


def _gpu_budget(plan: Plan) -> int | None:
    """90% of the smallest GPU's memory: the limit its allocator was given (`tfopt.runtime`'s limit_bytes)
    where one is set, which is all this process may use, else the device's total from the hardware."""
    limits = _allocator_limits_bytes()
    known = limits or [gpu.memory_bytes for gpu in plan.hardware.gpus if gpu.memory_bytes]
    return int(0.9 * min(known)) if known else None


def _allocator_limits_bytes() -> list[int]:
    """The memory limits set on this process' GPUs with a logical device configuration, in bytes."""
    import tensorflow as tf

    limits = []
    for gpu in tf.config.list_physical_devices("GPU"):
        limits += [
            config.memory_limit * 2**20
            for config in tf.config.get_logical_device_configuration(gpu) or []
            if config.memory_limit
        ]  # in MiB
    return limits


def _check_bounds(min_batch_size: Any, max_batch_size: Any, trial_steps: Any, warmup_steps: Any) -> None:
    min_valid = isinstance(min_batch_size, int) and min_batch_size >= 1
    if not min_valid or not isinstance(max_batch_size, int) or min_batch_size > max_batch_size:
        # A valid min_batch_size above max_batch_size is blamed on the cap: the bound users set is the
        # one memory imposes, and a cap below the default min_batch_size is the usual way to get here.
        raise RecipeConfigError(
            f"batch_size: min_batch_size={min_batch_size!r}, max_batch_size={max_batch_size!r}. "
            "Expected integers with 1 <= min_batch_size <= max_batch_size.",
            setting="max_batch_size" if min_valid else "min_batch_size",
        )
    trial_steps_valid = isinstance(trial_steps, int) and trial_steps >= 2
    if not trial_steps_valid or not isinstance(warmup_steps, int) or warmup_steps < 1:
        raise RecipeConfigError(
            f"batch_size: trial_steps={trial_steps!r}, warmup_steps={warmup_steps!r}. Expected "
            "trial_steps >= 2 (a median needs several) and warmup_steps >= 1 (tracing).",
            setting="warmup_steps" if trial_steps_valid else "trial_steps",
        )
