"""The graph rewrite parallelizes opaque pipelines: same elements in the same order, parallel ops in the graph."""

import collections
import gc
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from tfopt.data.graph import serialize
from tfopt.data.rewrite import KNOWN_DATASET_OPS, parallelize


def rewrite(dataset, **settings):
    return parallelize(dataset, prefetch_batches=2, **settings)


def top_level_ops(dataset):
    """How many times each dataset op appears at the top level of the pipeline's graph."""
    return collections.Counter(node.op for node in serialize(dataset).node if "Dataset" in node.op)


def elements(dataset):
    return [[np.asarray(part) for part in tf.nest.flatten(element)] for element in dataset]


def assert_same_elements(first, second):
    a, b = elements(first), elements(second)
    assert len(a) == len(b) > 0
    for index, (left, right) in enumerate(zip(a, b)):
        assert len(left) == len(right)
        for x, y in zip(left, right):
            assert x.dtype == y.dtype and x.shape == y.shape, f"element {index}"
            np.testing.assert_array_equal(x, y, err_msg=f"element {index}")


def slow_double(x):
    # Later elements finish first, so parallel calls complete out of order: order must still be kept.
    time.sleep(0.002 * (5 - int(x) % 5))
    return x * 2


PIPELINES = {
    "map and batch": lambda: tf.data.Dataset.range(50).map(lambda i: tf.cast(i, tf.float32) * 1.5).batch(7),
    "py_function": lambda: tf.data.Dataset.range(30).map(
        lambda i: tf.py_function(slow_double, [i], tf.int64)).batch(4),
    "numpy_function": lambda: tf.data.Dataset.range(20).map(
        lambda i: tf.numpy_function(lambda x: x + 1, [i], tf.int64)),
    "nested structure": lambda: tf.data.Dataset.range(12).map(
        lambda i: {"image": (tf.fill([2, 2], i), tf.strings.as_string(i)), "label": i % 3}).batch(5),
    "zip": lambda: tf.data.Dataset.zip((tf.data.Dataset.range(9).map(lambda i: i * 3),
                                        tf.data.Dataset.range(20).map(lambda i: -i))).batch(2),
    "interleave": lambda: tf.data.Dataset.range(6).interleave(
        lambda i: tf.data.Dataset.range(i).map(lambda j: j * 10 + i), cycle_length=3).map(lambda x: x + 1),
    "filter": lambda: tf.data.Dataset.range(40).map(lambda i: i * 7 % 11).filter(lambda x: x > 4).batch(3),
    "cache": lambda: tf.data.Dataset.range(15).map(lambda i: i ** 2).cache().map(lambda x: x - 1),
    "shuffle with seed": lambda: tf.data.Dataset.range(25).map(lambda i: i * 2).shuffle(25, seed=7).batch(4),
    "from_generator": lambda: tf.data.Dataset.from_generator(
        lambda: iter(range(8)), output_signature=tf.TensorSpec([], tf.int64)).map(lambda i: i + 100),
    "stateless random": lambda: tf.data.Dataset.range(10).map(
        lambda i: tf.random.stateless_uniform([3], seed=tf.stack([i, 1]))),
    "padded batch": lambda: tf.data.Dataset.range(7).map(lambda i: tf.range(i)).padded_batch(3),
}


@pytest.mark.parametrize("name", PIPELINES)
def test_same_elements_in_the_same_order_with_parallel_maps(name):
    build = PIPELINES[name]
    before = top_level_ops(build())
    rewritten, notes = rewrite(build())
    after = top_level_ops(rewritten)
    assert after["MapDataset"] == 0
    assert after["ParallelMapDatasetV2"] == before["MapDataset"] + before["ParallelMapDatasetV2"] > 0
    assert after["ParallelBatchDataset"] == before["BatchDatasetV2"]
    assert after["PrefetchDataset"] == before["PrefetchDataset"] + 1
    assert rewritten.element_spec == build().element_spec
    assert int(rewritten.cardinality()) == int(build().cardinality())
    assert_same_elements(build(), rewritten)
    assert any(note.startswith("parallel map (AUTOTUNE calls, order kept)") for note in notes)


def test_every_epoch_of_a_reshuffled_pipeline_is_the_same():
    build = PIPELINES["shuffle with seed"]
    original, (rewritten, _) = build(), rewrite(build())
    for _ in range(3):  # each epoch reshuffles: the seed generator's sequence must be the same
        assert_same_elements(original, rewritten)


def test_parallel_maps_really_run_autotuned_and_ordered():
    rewritten, _ = rewrite(PIPELINES["py_function"]())
    node = next(node for node in serialize(rewritten).node if node.op == "ParallelMapDatasetV2")
    calls = next(n for n in serialize(rewritten).node if n.name == node.input[-1])
    assert tf.make_ndarray(calls.attr["value"].tensor) == tf.data.AUTOTUNE
    assert node.attr["deterministic"].s == b"default" and rewritten.options().deterministic in (None, True)


def random_pipeline():
    return tf.data.Dataset.range(200).map(lambda i: (i, tf.random.uniform([], seed=5)))


def draws(dataset):
    """The draw each element got, in element order (the elements themselves stay in order)."""
    pairs = [(int(i), float(draw)) for i, draw in dataset]
    assert [i for i, _ in pairs] == list(range(200))
    return np.array([draw for _, draw in pairs])


def test_random_map_keeps_its_draws_and_names_the_setting():
    tf.random.set_seed(1)
    expected = draws(random_pipeline())
    tf.random.set_seed(1)
    rewritten, notes = rewrite(random_pipeline())
    assert top_level_ops(rewritten)["ParallelMapDatasetV2"] == 1
    # The same draws from the same kernel, possibly handed to other elements.
    np.testing.assert_array_equal(np.sort(draws(rewritten)), np.sort(expected))
    assert any("map 1 'lambda' (RandomUniform)" in note and "parallel_random_maps=False keeps the exact draw "
               "order" in note for note in notes)


def test_exact_draw_order_with_parallel_random_maps_off():
    tf.random.set_seed(1)
    expected = draws(random_pipeline().map(lambda i, draw: (i, draw * 1.0)))
    tf.random.set_seed(1)
    rewritten, notes = rewrite(random_pipeline().map(lambda i, draw: (i, draw * 1.0)), parallel_random_maps=False)
    ops = top_level_ops(rewritten)
    assert ops["MapDataset"] == 1 and ops["ParallelMapDatasetV2"] == 1  # only the deterministic map
    np.testing.assert_array_equal(draws(rewritten), expected)
    assert "kept sequential: map 1 'lambda' (random ops, parallel_random_maps=False)" in notes


def test_python_map_note_and_opt_out_for_shared_state():
    seen = []

    def count(x):
        seen.append(int(x))  # shared mutable state: the order of calls matters
        return np.int64(len(seen))

    build = lambda: tf.data.Dataset.range(10).map(lambda i: tf.numpy_function(count, [i], tf.int64))  # noqa: E731
    _, notes = rewrite(build())
    assert any("a Python function with mutable state shared between calls must opt out with "
               "parallel_python_maps=False" in note for note in notes)
    kept, notes = rewrite(build(), parallel_python_maps=False)
    assert top_level_ops(kept)["MapDataset"] == 1
    assert [int(x) for x in kept] == list(range(1, 11))
    assert seen == list(range(10))


def test_py_function_resolves_after_the_original_is_gone():
    rewritten, _ = rewrite(PIPELINES["py_function"]())
    gc.collect()
    assert_same_elements(PIPELINES["py_function"](), rewritten)


def test_map_with_other_state_stays_sequential_with_the_reason():
    queue = tf.queue.FIFOQueue(4, tf.int64)
    dataset = tf.data.Dataset.range(3).map(lambda i: i + tf.cast(queue.size(), tf.int64)).map(lambda x: x * 2)
    rewritten, notes = rewrite(dataset)
    assert top_level_ops(rewritten)["MapDataset"] == 1
    assert "kept sequential: map 1 'lambda' (stateful QueueSizeV2)" in notes
    assert [int(x) for x in rewritten] == [0, 2, 4]


def test_synchronous_map_stays_sequential():
    rewritten, notes = rewrite(tf.data.Dataset.range(3).map(lambda i: i + 1, synchronous=True))
    assert top_level_ops(rewritten)["MapDataset"] == 1 and "(synchronous=True)" in notes[-2]


@pytest.mark.parametrize("build, reason", [
    (lambda: tf.data.Dataset.range(3).map(lambda i: i).apply(tf.data.experimental.copy_to_device("/cpu:0")),
     "its graph cannot be serialized (Failed to serialize the input pipeline graph: GeneratorDatasetOp::Dataset "
     "does not support serialization)"),
    (lambda: tf.data.Dataset.range(3).map(lambda i: i).snapshot("unused-path"),
     "it uses SnapshotDatasetV2, which tfopt has not verified"),
])
def test_unrewritable_pipeline_is_left_as_it_was_with_the_reason(build, reason):
    dataset = build()
    result, notes = rewrite(dataset)
    assert result is dataset
    assert len(notes) == 1 and notes[0].startswith(f"pipeline left as it was: {reason}")


def test_idempotent():
    once, _ = rewrite(PIPELINES["zip"]())
    twice, notes = rewrite(once)
    assert twice is once
    assert notes == ["nothing left to parallelize: the pipeline's maps and batches already run in parallel and "
                     "it ends with a prefetch"]


def test_a_pipeline_ending_in_a_prefetch_gets_no_second_one():
    dataset = tf.data.Dataset.range(4).map(lambda i: i).prefetch(3).with_options(tf.data.Options())
    rewritten, notes = rewrite(dataset)
    assert top_level_ops(rewritten)["PrefetchDataset"] == 1
    assert not any("prefetch of" in note for note in notes)


def test_parallel_calls_overlap():
    """The rewritten py_function map runs calls concurrently: more than one is in flight at once."""
    lock, running, peak = threading.Lock(), [0], [0]

    def tracked(x):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return x

    options = tf.data.Options()
    options.autotune.enabled = False  # a fixed parallelism (the core count), not what autotuning tried first
    dataset = tf.data.Dataset.range(40).map(lambda i: tf.py_function(tracked, [i], tf.int64)).with_options(options)
    rewritten, _ = rewrite(dataset)
    assert [int(x) for x in rewritten] == list(range(40))
    assert peak[0] >= 2


def test_known_ops_are_registered():
    assert not [op for op in KNOWN_DATASET_OPS if op_def_registry.get(op) is None]
