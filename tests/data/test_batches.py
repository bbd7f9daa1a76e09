"""Rebatching keeps the pipeline's length, and the examples a pass holds are counted from tf.data itself."""

import pytest
import tensorflow as tf

from tfopt.data.batches import examples_per_pass, rebatch_counted

TWENTY_BY_8 = tf.data.Dataset.range(20).batch(8)  # batches of 8, 8, 4


@pytest.mark.parametrize(
    "dataset, batch_size, drop, length, remainder",
    [
        (TWENTY_BY_8, 8, True, 2, 4),
        (TWENTY_BY_8, 4, True, 5, 0),
        (TWENTY_BY_8, 6, False, 4, 2),
        (TWENTY_BY_8.repeat(), 8, True, tf.data.INFINITE_CARDINALITY, 4),  # every pass ends in a batch of 4
        (TWENTY_BY_8.repeat(2), 8, True, tf.data.UNKNOWN_CARDINALITY, 4),  # two passes: length not asserted
        (tf.data.Dataset.range(20).repeat().batch(8), 8, True, tf.data.INFINITE_CARDINALITY, 0),
    ],
)
def test_rebatch_counted(dataset, batch_size, drop, length, remainder):
    rebatched, partial = rebatch_counted(dataset, batch_size, drop_remainder=drop)
    assert int(rebatched.cardinality()) == int(length) and partial == remainder
    if length > 0:
        sizes = [int(batch.shape[0]) for batch in rebatched]
        assert len(sizes) == length and sum(sizes) == 20 - (remainder if drop else 0)


def test_examples_per_pass_of_static_batches_is_counted_from_the_batches():
    # Dataset.rebatch hides the original batch op's count: 16 examples remain after a drop, not 20.
    full = TWENTY_BY_8.rebatch(8, drop_remainder=True).apply(tf.data.experimental.assert_cardinality(2))
    assert examples_per_pass(full) == (16, True)
    assert examples_per_pass(TWENTY_BY_8.map(lambda batch: batch + 1).prefetch(2)) == (20, True)
    assert examples_per_pass(TWENTY_BY_8.unbatch().batch(8)) == (None, False)


def test_examples_per_pass_are_counted_through_a_rebatch():
    rebatched, _ = rebatch_counted(TWENTY_BY_8, 6, drop_remainder=False)  # 6, 6, 6, 2
    assert examples_per_pass(rebatched) == (20, True)
    assert examples_per_pass(rebatched.repeat(2)) == (20, False)
    again, dropped = rebatch_counted(rebatched, 6, drop_remainder=True)
    assert dropped == 2 and len(again) == 3 and [len(batch) for batch in again] == [6, 6, 6]
