"""Assembles the naive and the optimized `tf.data` pipeline from one source's stages.

Every source reduces to the same stages: cheap undecoded *records* (file paths, serialized examples,
array rows), a deterministic, expensive `decode`, an optional random `augment` of a batch of decoded
examples, and a cheap element-wise `finish` (e.g. uint8 -> float32 in [0, 1]). This module orders
those stages twice:

* naive, as a newcomer writes it: shuffle, `map(decode)`, `batch`, `map(augment)`, `map(finish)`,
  with no parallelism, no cache and no prefetch;
* optimized, as the tf.data performance guide teaches: parallel maps (AUTOTUNE), `cache()` after the
  decode and before random augmentation when the decoded data fits the RAM budget (`ram_budget`), augmentation and
  `finish` vectorized after `batch` and fused by XLA into one pass over the batch, and a prefetch
  bounded by bytes, because an AUTOTUNE prefetch can grow until it exhausts host memory (TF Model
  Garden pins 32 batches for this reason).

Augmentation runs on whole batches (the guide's "vectorized mapping"): after the decode is cached, the
per-element work is what is left to compete with training for the CPU, and a per-element map pays a function
call and a dozen small copies per image (docs/recipes/data_pipeline.md measures both). Its stateless random
ops take one seed per batch from `tf.data.Dataset.random(rerandomize_each_iteration=True)`, zipped in at the
same position in both pipelines: the augmentation differs per epoch, yet both pipelines yield identical
elements, which is what lets the tests compare them element by element.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf

from tfopt.data.ram_budget import prefetch_batches, ram_budget_bytes
from tfopt.data.source import PipelineRequest

logger = logging.getLogger("tfopt")


def assemble(
    records: tf.data.Dataset,
    *,
    decode: Callable,
    finish: Callable,
    augment: Callable | None,
    request: PipelineRequest,
    num_examples: int,
    decoded_example_bytes: int,
    output_example_bytes: int,
    record_shuffle_buffer: int | None = None,
    sharded_by_source: bool = False,
    cache_allowed: bool = True,
) -> tf.data.Dataset:
    """Builds the naive or optimized pipeline over already-sharded records.

    Args:
        records: Undecoded records of this worker's shard, in a deterministic order.
        decode: `record -> (x, y)`, deterministic; the expensive step worth caching after.
        finish: `(x, y) -> (x, y)` on a batch, element-wise and deterministic, giving the same values with
            or without XLA (it is fused with `augment` in the optimized pipeline).
        augment: `(x, y, seed) -> (x, y)` on a batch of decoded examples, with stateless random ops
            seeded by the `[2]` int64 `seed`, compilable by XLA and giving the same values with or
            without it (integer arithmetic does); None for no augmentation.
        request: What the caller of `DataSource.pipeline` asked for: batch size, naive or optimized,
            shuffling (differently in each epoch) and its seed (also the augmentation's), drop_remainder.
        num_examples: Number of records in this shard (sizes the shuffle buffer and the cache).
        decoded_example_bytes: Bytes of one decoded example (what the cache holds).
        output_example_bytes: Bytes of one finished example (what prefetch holds).
        record_shuffle_buffer: Shuffle buffer over records; None for a full shuffle of `num_examples`.
        sharded_by_source: The source already split the data between workers, so tf.distribute must
            not auto-shard it a second time.
        cache_allowed: False when the records already are in memory (a cache would only copy them).

    Returns:
        The batched `tf.data.Dataset`.
    """
    record_buffer = max(1, num_examples if record_shuffle_buffer is None else record_shuffle_buffer)
    if not request.optimized:
        dataset = records
        if request.shuffle:
            dataset = dataset.shuffle(record_buffer, seed=request.seed, reshuffle_each_iteration=True)
        dataset = dataset.map(decode)
        dataset = dataset.batch(request.batch_size, drop_remainder=request.drop_remainder)
        dataset = _augment_and_finish(dataset, augment, finish, request.seed, optimized=False)
        return _with_options(dataset, request, budget_bytes=0, sharded_by_source=sharded_by_source)

    budget_bytes = ram_budget_bytes() if request.ram_budget_bytes is None else request.ram_budget_bytes
    cache_bytes = num_examples * decoded_example_bytes
    cache = cache_allowed and request.cache and cache_bytes <= budget_bytes
    dataset = records
    if request.shuffle and not cache:
        dataset = dataset.shuffle(record_buffer, seed=request.seed, reshuffle_each_iteration=True)
    dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    if cache:
        dataset = dataset.cache()
        if request.shuffle:
            budget_examples = budget_bytes // max(decoded_example_bytes, 1)
            dataset = dataset.shuffle(
                max(1, min(num_examples, budget_examples)), seed=request.seed, reshuffle_each_iteration=True
            )
    dataset = dataset.batch(request.batch_size, drop_remainder=request.drop_remainder)
    dataset = _augment_and_finish(dataset, augment, finish, request.seed, optimized=True)
    buffer_batches = prefetch_batches(request.batch_size * output_example_bytes, budget_bytes)
    dataset = dataset.prefetch(buffer_batches)
    logger.debug(
        "optimized pipeline: cache=%s (%d bytes decoded), prefetch=%d batches", cache, cache_bytes, buffer_batches
    )
    return _with_options(dataset, request, budget_bytes=budget_bytes, sharded_by_source=sharded_by_source)


def _augment_and_finish(batches, augment, finish, seed, *, optimized):
    """Maps `augment` (if any) then `finish` over batches; optimized: in parallel, fused by XLA.

    XLA turns the augmentation's gathers, masks and casts into one loop over the batch instead of a
    dozen full copies (docs/recipes/data_pipeline.md has the cost of both). tf.data always runs on
    the host CPU, so this is XLA:CPU on every machine, whatever accelerator trains the model.
    """
    calls = tf.data.AUTOTUNE if optimized else None
    if augment is None:
        return batches.map(finish, num_parallel_calls=calls)
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)

    def augment_and_finish(batch, batch_seed):
        return finish(*augment(*batch, tf.stack([batch_seed, tf.constant(seed, tf.int64)])))

    if optimized:
        augment_and_finish = tf.function(augment_and_finish, jit_compile=True)
    return tf.data.Dataset.zip((batches, seeds)).map(augment_and_finish, num_parallel_calls=calls)


def _with_options(dataset, request, *, budget_bytes, sharded_by_source):
    options = tf.data.Options()
    if request.optimized:
        options.autotune.enabled = True
        options.autotune.ram_budget = budget_bytes
        options.deterministic = request.deterministic
    if sharded_by_source:
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)
