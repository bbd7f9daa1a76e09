"""Batches of a batched tf.data pipeline: rebatching that keeps the pipeline's length, and counting the
examples a pass holds, so that what dropping a partial batch costs can be said in numbers.

`Dataset.rebatch` leaves tf.data's cardinality unknown, which breaks `len(dataset)` and the
`steps_per_epoch=len(dataset)` of one-iterator training; XLA needs full batches (a partial one compiles
the step again), and the build says how many examples per pass that drops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf


def rebatch_counted(dataset: tf.data.Dataset, batch_size: int, *, drop_remainder: bool) -> tuple[Any, int | None]:
    """`dataset.rebatch`, keeping the length it loses, and the examples per pass in a partial last batch.

    `Dataset.rebatch` leaves tf.data's cardinality unknown, which breaks `len(dataset)` and the
    `steps_per_epoch=len(dataset)` that one-iterator training needs; where the examples of one pass are
    known (the input of the pipeline's batch op), `assert_cardinality` restores it.

    Returns:
        The rebatched dataset, and the examples of a pass that do not fill a batch (dropped where
        `drop_remainder`), or None where tf.data does not know how many examples a pass holds.
    """
    import tensorflow as tf

    examples, one_pass = examples_per_pass(dataset)
    rebatched = dataset.rebatch(batch_size, drop_remainder=drop_remainder)
    if int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        rebatched = rebatched.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    elif one_pass and examples is not None:
        length = examples // batch_size if drop_remainder else -(-examples // batch_size)
        rebatched = rebatched.apply(tf.data.experimental.assert_cardinality(length))
    return rebatched, None if examples is None else examples % batch_size


def static_batches(dataset: tf.data.Dataset, batch_size: int) -> tuple[Any, int | None]:
    """The dataset with its full batches only, each of a static shape, and how many examples per pass that drops.

    XLA compiles a step per input shape, and Keras traces the step with the batch dimension unknown, so
    a partial last batch compiles it again every epoch, often for longer than the epoch's other steps take
    (docs/recipes/xla.md). The partial batches are left out where they are, and no batch is made of others'
    examples (as `rebatch` would): a pipeline repeated after batching (`batch(8).repeat()`) would otherwise glue
    one pass's last examples to the next pass's first, and padded batches of other lengths cannot be glued.
    The length tf.data loses in the filter is kept where the examples of a pass are known.

    Args:
        dataset: A batched dataset.
        batch_size: Its batch size.

    Returns:
        The dataset with static batches (the same object where they were static already), and the
        examples dropped per pass over the data (0 where the batches were full already, None where
        tf.data does not know how many examples a pass holds).

    Example:
        >>> import tensorflow as tf
        >>> data, dropped = static_batches(tf.data.Dataset.range(20).batch(8), 8)
        >>> [len(batch) for batch in data], dropped, len(data), data.element_spec.shape
        ([8, 8], 4, 2, TensorShape([8]))
        >>> again, dropped = static_batches(tf.data.Dataset.range(20).batch(8).repeat(), 8)
        >>> [int(batch[0]) for batch in again.take(4)], dropped
        ([0, 8, 0, 8], 4)
    """
    import tensorflow as tf

    spec = dataset.element_spec
    if tf.nest.flatten(spec)[0].shape[0] is not None:
        return dataset, 0
    examples, one_pass = examples_per_pass(dataset)
    node = last_batch_op(dataset)
    batches = int(dataset.cardinality())
    remainder = None if examples is None else examples % batch_size
    full = dataset.filter(lambda *element: _batch_dimension(element) == batch_size)
    # tf.data unpacks a plain tuple into the function's arguments, and nothing else (a namedtuple stays one).
    full = full.map(lambda *element: _made_static(element if type(spec) is tuple else element[0], batch_size))
    per_pass = int(node.cardinality()) if node is not None else -1
    if batches == int(tf.data.INFINITE_CARDINALITY):
        length, dropped = batches, remainder  # each pass's partial batch, where the pipeline repeats whole passes
    elif remainder is not None and batches >= 0 and (one_pass or (per_pass > 0 and batches % per_pass == 0)):
        # Whole passes of the batch op (only ops that keep every batch lie between): one partial batch each.
        passes = 1 if one_pass else batches // per_pass
        length, dropped = batches - passes * (remainder != 0), remainder
    else:  # which batches are partial is not known (unknown examples, or a rebatch)
        return full, None
    return full.apply(tf.data.experimental.assert_cardinality(length)), dropped


def _batch_dimension(element: Any) -> Any:
    """The examples in a batch, read from its first component (a tensor, ragged or sparse)."""
    import tensorflow as tf

    first = tf.nest.flatten(element)[0]
    if isinstance(first, tf.RaggedTensor):
        return first.nrows(out_type=tf.int32)
    if isinstance(first, tf.SparseTensor):
        return tf.cast(first.dense_shape[0], tf.int32)
    return tf.shape(first)[0]


def _made_static(structure: Any, batch_size: int) -> Any:
    """The batch with the batch dimension of its dense tensors fixed (composite ones keep theirs)."""
    import tensorflow as tf

    return tf.nest.map_structure(
        lambda tensor: (
            tf.ensure_shape(tensor, [batch_size, *tensor.shape[1:]]) if isinstance(tensor, tf.Tensor) else tensor
        ),
        structure,
    )


def describe_dropped(dropped: int | None, batch_size: int) -> str:
    """What keeping batches full (static, for XLA) costs the data, for a plan's record."""
    if dropped == 0:
        return f"batches of {batch_size} are full (a static shape: the step compiles once)"
    count = f"up to {batch_size - 1}" if dropped is None else str(dropped)
    return (
        f"batches of {batch_size} kept full, so the step compiles once: the last {count} examples of each "
        "pass are dropped (a partial batch would compile the step again every epoch); shuffle the data "
        "each epoch so that other examples are dropped each time"
    )


def examples_per_pass(dataset: tf.data.Dataset) -> tuple[int | None, bool]:
    """The examples of one pass over a batched dataset (0 for an endless stream, which never ends a batch
    early; None where tf.data does not know), and whether the dataset is exactly one pass.

    A batched dataset knows its number of batches, not of examples: with a static batch dimension that
    is enough; otherwise the input of the pipeline's batch op knows.
    """
    import tensorflow as tf

    infinite = int(tf.data.INFINITE_CARDINALITY)
    batches = int(dataset.cardinality())
    static_batch = tf.nest.flatten(dataset.element_spec)[0].shape[0]
    if static_batch is not None:  # every batch is full, so the batches count the examples
        if batches == infinite:
            return 0, False
        return (batches * static_batch if batches >= 0 else None), batches >= 0
    node = last_batch_op(dataset)
    if node is not None and hasattr(node, "_batch_sizes"):  # a rebatch, which tf.data cannot count
        return _rebatched_examples_per_pass(node, batches)
    examples = int(node._input_dataset.cardinality()) if node is not None else int(tf.data.UNKNOWN_CARDINALITY)
    if examples == infinite:
        return 0, False  # repeated before batching: no batch ends early
    one_pass = node is not None and batches >= 0 and batches == int(node.cardinality())  # nothing repeats it
    return (examples if examples >= 0 else None), one_pass


def _rebatched_examples_per_pass(rebatch: Any, batches: int) -> tuple[int | None, bool]:
    """`examples_per_pass` through a rebatch keeping partial batches: its input's examples, one pass where
    the dataset has as many batches as one pass of them makes (nothing after the rebatch repeats it)."""
    from tensorflow.python.framework import tensor_util

    examples, one_pass = examples_per_pass(rebatch._input_dataset)
    size = tensor_util.constant_value(rebatch._batch_sizes)
    if not examples or size is None or size.ndim != 0:
        return examples, False
    return examples, one_pass and batches == -(-examples // int(size))


def last_batch_op(dataset: tf.data.Dataset) -> Any:
    """The pipeline's last batch or rebatch op, found through the ops that keep every batch whole (maps, prefetch,
    cache, options, shuffle, repeat) and rewritten pipelines (`tfopt.data.rewrite`: the same batches as the
    user's); None where another op comes between (a take, skip, shard, filter or concatenate: which batches it
    keeps is not known)."""
    node = dataset
    while node is not None and not hasattr(node, "_batch_size") and not hasattr(node, "_batch_sizes"):
        if hasattr(node, "same_batches_as"):
            node = node.same_batches_as
        elif type(node).__name__ in _KEEPING_EVERY_BATCH:
            node = node._input_dataset
        else:
            return None
    return node


_KEEPING_EVERY_BATCH = frozenset(
    {
        "_MapDataset",
        "_ParallelMapDataset",
        "_PrefetchDataset",
        "CacheDataset",
        "_OptionsDataset",
        "_AssertCardinalityDataset",
        "_ShuffleDataset",
        "_RepeatDataset",
        "_RestructuredDataset",  # inside Dataset.rebatch
    }
)
