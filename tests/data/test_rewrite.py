"""The graph rewrite parallelizes opaque pipelines: same elements in the same order, parallel ops in the graph."""

import collections
import contextlib
import gc
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.processes import child_environment
from tfopt.data import graph as pipeline_graph
from tfopt.data.graph import pipeline_ops, serialize
from tfopt.data.rewrite import KNOWN_DATASET_OPS, parallelize


class InFlight:
    """Counts the calls in flight at once, and the most there ever were: parallelism, observed."""

    def __init__(self):
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    @contextlib.contextmanager
    def counted(self):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            yield
        finally:
            with self.lock:
                self.now -= 1


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
    "py_function": lambda: tf.data.Dataset.range(30).map(lambda i: tf.py_function(slow_double, [i], tf.int64)).batch(4),
    "numpy_function": lambda: tf.data.Dataset.range(20).map(
        lambda i: tf.numpy_function(lambda x: x + 1, [i], tf.int64)
    ),
    "nested structure": lambda: (
        tf.data.Dataset.range(12)
        .map(lambda i: {"image": (tf.fill([2, 2], i), tf.strings.as_string(i)), "label": i % 3})
        .batch(5)
    ),
    "zip": lambda: tf.data.Dataset.zip(
        (tf.data.Dataset.range(9).map(lambda i: i * 3), tf.data.Dataset.range(20).map(lambda i: -i))
    ).batch(2),
    "interleave": lambda: (
        tf.data.Dataset.range(6)
        .interleave(lambda i: tf.data.Dataset.range(i).map(lambda j: j * 10 + i), cycle_length=3)
        .map(lambda x: x + 1)
    ),
    "filter": lambda: tf.data.Dataset.range(40).map(lambda i: i * 7 % 11).filter(lambda x: x > 4).batch(3),
    "cache": lambda: tf.data.Dataset.range(15).map(lambda i: i**2).cache().map(lambda x: x - 1),
    "shuffle with seed": lambda: tf.data.Dataset.range(25).map(lambda i: i * 2).shuffle(25, seed=7).batch(4),
    "from_generator": lambda: tf.data.Dataset.from_generator(
        lambda: iter(range(8)), output_signature=tf.TensorSpec([], tf.int64)
    ).map(lambda i: i + 100),
    "stateless random": lambda: tf.data.Dataset.range(10).map(
        lambda i: tf.random.stateless_uniform([3], seed=tf.stack([i, 1]))
    ),
    "padded batch": lambda: tf.data.Dataset.range(7).map(tf.range).padded_batch(3),
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
    assert any(
        "map 1 'lambda' (RandomUniform)" in note and "parallel_random_maps=False keeps the exact draw order" in note
        for note in notes
    )


@pytest.mark.parametrize(
    "with_random_layer, inside",
    [(False, False), (True, False), (False, True)],
    ids=["alone", "beside a random layer's seed", "inside an interleave"],
)
def test_a_pipeline_reading_a_variable_set_from_outside_is_left_as_it_was(with_random_layer, inside):
    """A curriculum: a callback raises the augmentation's strength as training goes. A rebuilt graph would hold a
    copy of the variable with today's value: the pipeline must go on reading the user's own, also where the map
    writes another variable (a Keras random layer's seed), which the copy may carry on."""
    strength = tf.Variable(1.0)
    flip = keras.layers.RandomFlip("horizontal", seed=1)

    def scaled(i):
        value = tf.cast(i, tf.float32) * strength
        return flip(tf.fill([1, 2, 1], value))[0, 0, 0] if with_random_layer else value

    data = tf.data.Dataset.range(4)
    if inside:
        data = data.interleave(lambda i: tf.data.Dataset.from_tensors(i).map(scaled), cycle_length=1).batch(2)
    else:
        data = data.map(scaled).batch(2)
    rewritten, notes = parallelize(data, prefetch_batches=1)
    assert notes[0].startswith("maps and batches left as they were: it reads a tf.Variable it never assigns")
    strength.assign(5.0)
    assert [list(batch.numpy()) for batch in rewritten] == [[0.0, 5.0], [10.0, 15.0]]


def test_a_pipeline_looking_up_a_mutable_table_is_left_as_it_was():
    """Ids a user inserts while training must reach the pipeline: a rebuilt graph would hold today's contents."""
    seen = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
    seen.insert(tf.constant([1], tf.int64), tf.constant([10], tf.int64))
    rewritten, notes = parallelize(tf.data.Dataset.range(3).map(seen.lookup).batch(3), prefetch_batches=1)
    assert notes[0].startswith("maps and batches left as they were: it looks up a mutable table (MutableHashTableV2)")
    seen.insert(tf.constant([2], tf.int64), tf.constant([20], tf.int64))
    assert [list(batch.numpy()) for batch in rewritten] == [[-1, 10, 20]]


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
    assert any(
        "a Python function with mutable state shared between calls must opt out with parallel_python_maps=False" in note
        for note in notes
    )
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


@pytest.mark.parametrize(
    "build, reason",
    [
        (
            lambda _: tf.data.Dataset.range(3).map(lambda i: i).apply(tf.data.experimental.copy_to_device("/cpu:0")),
            "its graph cannot be serialized (FailedPreconditionError: Failed to serialize the input pipeline graph: "
            "GeneratorDatasetOp::Dataset does not support serialization)",
        ),
        (
            lambda directory: tf.data.Dataset.range(3).map(lambda i: i).snapshot(str(directory / "snapshot")),
            "it uses SnapshotDatasetV2, which tfopt has not verified",
        ),
    ],
)
def test_unrewritable_pipeline_is_left_as_it_was_with_the_reason(build, reason, tmp_path):
    dataset = build(tmp_path)
    result, notes = rewrite(dataset)
    assert_left_as_it_was(dataset, result, notes, reason)


def assert_left_as_it_was(dataset, result, notes, reason):
    """Maps and batches as they were, the reason said, and only the bounded prefetch added at the end."""
    assert notes == [notes[0], "ends with a prefetch of 2 elements"]
    assert notes[0].startswith(f"maps and batches left as they were: {reason}")
    assert type(result).__name__ == "_PrefetchDataset" and result._input_dataset is dataset
    assert_same_elements(dataset, result)


def test_an_unrewritable_pipeline_ending_in_a_prefetch_is_returned_itself(tmp_path):
    dataset = tf.data.Dataset.range(3).map(lambda i: i).snapshot(str(tmp_path / "snapshot")).prefetch(1)
    result, notes = rewrite(dataset)
    assert result is dataset and len(notes) == 1 and "SnapshotDatasetV2" in notes[0]


def test_idempotent():
    once, _ = rewrite(PIPELINES["zip"]())
    twice, notes = rewrite(once)
    assert twice is once
    assert notes == [
        "nothing left to parallelize: the pipeline's maps and batches already run in parallel and "
        "it ends with a prefetch"
    ]


def test_a_pipeline_ending_in_a_prefetch_gets_no_second_one():
    dataset = tf.data.Dataset.range(4).map(lambda i: i).prefetch(3).with_options(tf.data.Options())
    rewritten, notes = rewrite(dataset)
    assert top_level_ops(rewritten)["PrefetchDataset"] == 1
    assert not any("prefetch of" in note for note in notes)


def test_parallel_calls_overlap():
    """The rewritten py_function map runs calls concurrently: more than one is in flight at once."""
    calls = InFlight()

    def tracked(x):
        with calls.counted():
            time.sleep(0.01)
        return x

    options = tf.data.Options()
    options.autotune.enabled = False  # a fixed parallelism (the core count), not what autotuning tried first
    dataset = tf.data.Dataset.range(40).map(lambda i: tf.py_function(tracked, [i], tf.int64)).with_options(options)
    rewritten, _ = rewrite(dataset)
    assert [int(x) for x in rewritten] == list(range(40))
    assert calls.most >= 2


def fake_serialized(monkeypatch, value):
    """DatasetToGraphV2 returning `value`, as protobuf or a TensorFlow change could make it."""
    monkeypatch.setattr(tf.raw_ops, "DatasetToGraphV2", lambda **_: tf.constant(value))


@pytest.mark.parametrize(
    "serialized, reason",
    [
        (
            b"\xff\xff\xff",
            "its graph cannot be serialized (DecodeError: Error parsing message with type "
            "'tensorflow.GraphDef': Wire format was corrupt)",
        ),
        # What protobuf makes of a GraphDef over 2 GiB (measured with a 2.1 GiB array).
        (b"", "its graph is over protobuf's 2 GiB limit"),
    ],
)
def test_a_graph_python_cannot_parse_leaves_the_pipeline_as_it_was(monkeypatch, serialized, reason):
    dataset = PIPELINES["map and batch"]()
    fake_serialized(monkeypatch, serialized)
    result, notes = rewrite(dataset)
    monkeypatch.undo()  # the elements are compared with TensorFlow's own serialization back
    assert_left_as_it_was(dataset, result, notes, reason)


def test_a_graph_without_an_output_leaves_the_pipeline_as_it_was(monkeypatch):
    """What an empty serialization parsed to before it was refused: a GraphDef with no _Retval."""
    dataset = PIPELINES["map and batch"]()
    monkeypatch.setattr(pipeline_graph, "read", lambda _: (tf.compat.v1.GraphDef(), None))
    result, notes = rewrite(dataset)
    assert_left_as_it_was(
        dataset, result, notes, "tfopt could not rewrite its graph (RuntimeError: generator raised StopIteration)"
    )


def test_a_failing_rebuild_leaves_the_pipeline_as_it_was(monkeypatch):
    def refuse(**_):
        raise RuntimeError("refused")

    dataset = PIPELINES["map and batch"]()
    monkeypatch.setattr(tf.raw_ops, "DatasetFromGraph", refuse)
    result, notes = rewrite(dataset)
    assert_left_as_it_was(dataset, result, notes, "its rewritten graph could not be rebuilt (RuntimeError: refused)")


def arrays_pipeline(rows):
    """from_tensor_slices over a float32 array of `rows` KiB rows, mapped and batched."""
    array = np.arange(rows * 256, dtype=np.float32).reshape(rows, 256)
    return tf.data.Dataset.from_tensor_slices(array).map(lambda row: row * 2.0).batch(64)


def test_arrays_within_the_limit_are_rewritten_element_by_element():
    rewritten, _ = rewrite(arrays_pipeline(16 * 1024))  # 16 MiB in the graph
    assert top_level_ops(rewritten)["ParallelMapDatasetV2"] == 1
    assert_same_elements(arrays_pipeline(16 * 1024), rewritten)


def test_arrays_over_the_limit_are_left_before_anything_is_serialized(monkeypatch):
    monkeypatch.setattr(pipeline_graph, "MAX_GRAPH_BYTES", 2**20)
    serialized = []
    real = tf.raw_ops.DatasetToGraphV2
    monkeypatch.setattr(tf.raw_ops, "DatasetToGraphV2", lambda **kwargs: serialized.append(1) or real(**kwargs))
    dataset = arrays_pipeline(2 * 1024)  # 2 MiB
    result, notes = rewrite(dataset)
    assert not serialized
    assert_left_as_it_was(
        dataset,
        result,
        notes,
        "its graph holds 2 MiB of in-memory data (arrays passed to "
        "from_tensor_slices or captured by its functions are part of it), more than the 1 MiB tfopt "
        "copies to rewrite a pipeline; pass num_parallel_calls=tf.data.AUTOTUNE to your own maps "
        "instead",
    )


def test_data_the_pipeline_objects_do_not_show_is_bounded_by_the_graph_size(monkeypatch):
    monkeypatch.setattr(pipeline_graph, "MAX_GRAPH_BYTES", 2**20)
    table = np.arange(512 * 1024, dtype=np.float32)  # 2 MiB, a constant inside the map function

    dataset = tf.data.Dataset.range(4).map(lambda i: tf.gather(tf.constant(table), i))
    result, notes = rewrite(dataset)
    assert_left_as_it_was(dataset, result, notes, "its graph holds 2 MiB (arrays passed to")


def final_buffer_size(dataset):
    graph = serialize(dataset)
    prefetch = next(node for node in pipeline_graph.output_chain(graph) if node.op != "OptionsDataset")
    size = next(node for node in graph.node if node.name == prefetch.input[1].split(":")[0])
    return prefetch.op, int(tf.make_ndarray(size.attr["value"].tensor))


def test_a_final_autotune_prefetch_is_bounded_like_the_one_tfopt_adds():
    build = lambda: tf.data.Dataset.range(20).batch(4).prefetch(tf.data.AUTOTUNE)  # noqa: E731
    rewritten, notes = rewrite(build())
    assert final_buffer_size(rewritten) == ("PrefetchDataset", 2)
    assert "its final prefetch(AUTOTUNE) now holds 2 elements" in notes
    assert_same_elements(build(), rewritten)
    assert rewrite(rewritten)[0] is rewritten


def test_without_a_size_the_final_prefetch_is_autotuned_within_the_budget():
    kept, notes = parallelize(tf.data.Dataset.range(4).prefetch(tf.data.AUTOTUNE), prefetch_batches=None)
    assert final_buffer_size(kept) == ("PrefetchDataset", tf.data.AUTOTUNE)
    assert (
        "its final prefetch(AUTOTUNE) stays: the elements' size is unknown, so tf.data sizes it within the "
        "autotune RAM budget" in notes
    )
    added, notes = parallelize(tf.data.Dataset.range(4).map(lambda i: i), prefetch_batches=None)
    assert final_buffer_size(added) == ("PrefetchDataset", tf.data.AUTOTUNE)
    assert (
        "ends with a prefetch(AUTOTUNE), sized by tf.data within the autotune RAM budget, since the elements' "
        "size is unknown" in notes
    )


def keras_augmented():
    """Keras augmentation in a map, as the Keras guides show it; a new seeded layer per pipeline. Made on the
    CPU, as tfopt's note says to on a GPU host (test_a_layer_whose_seed_lives_on_another_device_is_named)."""
    with tf.device("/cpu:0"):
        flip = keras.layers.RandomFlip("horizontal", seed=1)
    images = np.arange(16 * 4 * 4 * 3, dtype=np.float32).reshape(16, 4, 4, 3)
    return tf.data.Dataset.from_tensor_slices(images).map(lambda x: flip(x, training=True)).batch(4)


def test_a_keras_random_layer_map_stays_sequential_with_the_reason():
    rewritten, notes = rewrite(keras_augmented())
    ops = top_level_ops(rewritten)
    assert ops["MapDataset"] == 1 and ops["ParallelBatchDataset"] == 1
    assert (
        "kept sequential: map 1 'lambda' (stateful AssignVariableOp: it writes a variable, as a Keras random "
        "layer's seed generator does on every call, and parallel calls could read the same seed)"
    ) in notes
    assert_same_elements(keras_augmented(), rewritten)
    images = np.arange(16 * 4 * 4 * 3, dtype=np.float32).reshape(16, 4, 4, 3)
    flipped = np.concatenate([batch.numpy() for batch in rewritten])
    assert 0 < sum(np.array_equal(image, np.flip(original, axis=1)) for image, original in zip(flipped, images)) < 16


ON_ANOTHER_DEVICE = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np
from tfopt.data.rewrite import parallelize
with tf.device("/cpu:1"):  # where a GPU host puts it: on GPU:0
    flip = keras.layers.RandomFlip("horizontal", seed=1)
images = np.arange(4 * 4 * 4 * 3, dtype=np.float32).reshape(4, 4, 4, 3)
dataset = tf.data.Dataset.from_tensor_slices(images).map(lambda x: flip(x, training=True)).batch(2)
result, notes = parallelize(dataset, prefetch_batches=2)
print(sum(int(batch.shape[0]) for batch in result))
print(notes[0])
"""


def test_a_layer_whose_seed_lives_on_another_device_is_named():
    """On a GPU host a Keras layer made outside tf.data keeps its seed generator on GPU:0, and tf.data cannot
    serialize a graph using it (seen on an H100): faked here by a second logical CPU, in a fresh process."""
    completed = subprocess.run(
        [sys.executable, "-c", ON_ANOTHER_DEVICE], capture_output=True, text=True, timeout=120, env=child_environment()
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    examples, note = completed.stdout.strip().splitlines()[-2:]
    assert examples == "4"  # the pipeline as it was, with a prefetch after it
    assert note == (
        "maps and batches left as they were: its graph cannot be serialized: a function of it uses "
        "seed_generator/seed_generator_state/0 on CPU:1, and tf.data writes graphs on the CPU (a Keras "
        "preprocessing layer made on a GPU host keeps its seed generator there); make it under "
        "`with tf.device('/cpu:0'):`"
    )


def test_a_generator_is_called_one_element_at_a_time_while_the_maps_after_it_run_in_parallel():
    generating, mapping = InFlight(), InFlight()

    def generate():
        for index in range(24):
            with generating.counted():
                time.sleep(0.002)
            yield index

    def slow_square(x):
        with mapping.counted():
            time.sleep(0.01)
        return x * x

    options = tf.data.Options()
    options.autotune.enabled = False  # a fixed parallelism (the core count), not what autotuning tried first

    def build():
        generated = tf.data.Dataset.from_generator(generate, output_signature=tf.TensorSpec([], tf.int64))
        return generated.map(lambda i: tf.py_function(slow_square, [i], tf.int64)).with_options(options)

    rewritten, _ = rewrite(build())
    assert [int(x) for x in rewritten] == [index * index for index in range(24)]
    assert generating.most == 1 and mapping.most >= 2


def same(*parts):
    return parts if len(parts) > 1 else parts[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A TFRecord file, a text file and a binary file of fixed-length records."""
    folder = tmp_path_factory.mktemp("records")
    with tf.io.TFRecordWriter(str(folder / "a.tfrecord")) as writer:
        for index in range(6):
            writer.write(f"record {index}".encode())
    (folder / "a.txt").write_text("first\nsecond\nthird\n")
    (folder / "a.bin").write_bytes(bytes(range(24)))
    return folder


R = tf.data.Dataset.range
# One pipeline per known op, built as tf.data's Python API builds it (TF 2.21), seeded where it draws.
OP_PIPELINES = {
    "RangeDataset": lambda f: R(5),
    "TensorDataset": lambda f: tf.data.Dataset.from_tensors([1, 2, 3]),
    "TensorSliceDataset": lambda f: tf.data.Dataset.from_tensor_slices({"x": [[1, 2], [3, 4]], "y": ["a", "b"]}),
    "TFRecordDataset": lambda f: tf.data.TFRecordDataset(str(f / "a.tfrecord")),
    "TextLineDataset": lambda f: tf.data.TextLineDataset(str(f / "a.txt")),
    "FixedLengthRecordDatasetV2": lambda f: tf.data.FixedLengthRecordDataset(str(f / "a.bin"), 4),
    "RandomDataset": lambda f: tf.data.Dataset.random(seed=3).take(5),
    # tfopt's own pipelines draw their augmentation seeds from it (tfopt.data.pipeline).
    "RandomDatasetV2": lambda f: tf.data.Dataset.random(seed=3, rerandomize_each_iteration=True).take(5),
    "GeneratorDataset": lambda f: tf.data.Dataset.from_generator(
        lambda: iter(range(5)), output_signature=tf.TensorSpec([], tf.int64)
    ),
    "MapDataset": lambda f: R(5).map(lambda i: i * 3),
    "ParallelMapDatasetV2": lambda f: R(5).map(lambda i: i * 3, num_parallel_calls=2, deterministic=True),
    "FilterDataset": lambda f: R(9).filter(lambda i: i % 3 > 0),
    "FlatMapDataset": lambda f: R(4).flat_map(R),
    "InterleaveDataset": lambda f: R(4).interleave(R, cycle_length=2),
    # tfopt's TFRecordSource reads its shards with it.
    "ParallelInterleaveDatasetV4": lambda f: R(4).interleave(
        R, cycle_length=2, num_parallel_calls=2, deterministic=True
    ),
    "BatchDatasetV2": lambda f: R(7).batch(3),
    "ParallelBatchDataset": lambda f: R(7).batch(3, num_parallel_calls=2, deterministic=True),
    "PaddedBatchDatasetV2": lambda f: R(5).map(tf.range).padded_batch(2),
    "MapAndBatchDataset": lambda f: R(7).apply(tf.data.experimental.map_and_batch(lambda i: i + 1, 3)),
    "UnbatchDataset": lambda f: R(7).batch(3).unbatch(),
    "ShuffleDatasetV3": lambda f: R(9).shuffle(9, seed=4),
    "ShuffleAndRepeatDataset": lambda f: R(5).apply(tf.data.experimental.shuffle_and_repeat(5, count=2, seed=4)),
    "RepeatDataset": lambda f: R(3).repeat(2),
    "CacheDatasetV2": lambda f: R(4).map(lambda i: i * 2).cache(),
    "TakeDataset": lambda f: R(9).take(4),
    "SkipDataset": lambda f: R(9).skip(4),
    "ZipDataset": lambda f: tf.data.Dataset.zip((R(3), R(5).map(lambda i: -i))),
    "ConcatenateDataset": lambda f: R(3).concatenate(R(10, 12)),
    "PrefetchDataset": lambda f: R(5).prefetch(2),
    "OptionsDataset": lambda f: R(5).with_options(tf.data.Options()),
    "DirectedInterleaveDataset": lambda f: tf.data.Dataset.sample_from_datasets([R(4), R(10, 14)], seed=5),
    "ShardDataset": lambda f: R(9).shard(2, 1),
    "RebatchDatasetV2": lambda f: R(8).batch(4).rebatch(2),
    "AssertCardinalityDataset": lambda f: (
        R(4).filter(lambda i: i >= 0).apply(tf.data.experimental.assert_cardinality(4))
    ),
    "WindowDataset": lambda f: R(7).window(3, shift=2).flat_map(lambda window: window.batch(3)),
    "ScanDataset": lambda f: R(5).scan(tf.constant(0, tf.int64), lambda total, i: (total + i, total + i)),
    "GroupByWindowDataset": lambda f: R(10).group_by_window(
        lambda i: i % 2, lambda key, window: window.batch(5), window_size=5
    ),
    "IgnoreErrorsDataset": lambda f: (
        R(4)
        .map(lambda i: tf.debugging.check_numerics(1.0 / tf.cast(i, tf.float32), "division by zero"))
        .ignore_errors()
    ),
    "TakeWhileDataset": lambda f: R(9).take_while(lambda i: i < 4),
    "UniqueDataset": lambda f: tf.data.Dataset.from_tensor_slices([3, 1, 3, 2, 1]).unique(),
}


def test_the_known_ops_are_exactly_the_tested_ones():
    assert set(OP_PIPELINES) == KNOWN_DATASET_OPS


@pytest.mark.parametrize("op", sorted(OP_PIPELINES))
def test_every_known_op_survives_the_round_trip_element_by_element(op, files):
    build = lambda: OP_PIPELINES[op](files).map(same)  # noqa: E731  a map to rewrite, so the graph is rebuilt
    assert op in pipeline_ops(serialize(build()))
    rewritten, notes = rewrite(build())
    assert top_level_ops(rewritten)["ParallelMapDatasetV2"] >= 1, notes
    assert rewritten.element_spec == build().element_spec
    assert_same_elements(build(), rewritten)


def test_a_pipeline_ending_with_repeat_is_prefetched_within_each_pass():
    """A pass draws its shuffle's seeds when it opens, from a generator every iterator of the pipeline shares: a
    prefetch after the repeat opened the next pass ahead of training, and the next iterator (a second fit) then
    started at other seeds than the user's pipeline gives plain Keras."""

    def build():
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False  # no read-ahead of tf.data's own either
        return tf.data.Dataset.range(10).shuffle(10, seed=1).batch(5).repeat().with_options(options)

    def two_fits(dataset):
        """Two iterators, each reading one pass (two batches), as two fit calls do."""
        seen = []
        for _ in range(2):
            iterator = iter(dataset)
            seen += [next(iterator).numpy().tolist() for _ in range(2)]
            time.sleep(0.2)  # time for any read-ahead
        return seen

    rewritten, notes = rewrite(build())
    chain = [node.op for node in pipeline_graph.output_chain(serialize(rewritten)) if node.op != "OptionsDataset"]
    assert chain[:2] == ["RepeatDataset", "PrefetchDataset"]
    assert "ends with a prefetch of 2 elements, inside its final repeat(): no pass is read ahead of training" in notes
    assert two_fits(rewritten) == two_fits(build())
    again, notes = rewrite(rewritten)  # one prefetch inside: the user's own, or tfopt's
    assert again is rewritten and "its prefetch inside its final repeat() stays" in " ".join(notes)
