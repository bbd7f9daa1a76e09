"""The tuned pipeline yields exactly the same elements; cache only where valid; options really set."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import make_cnn, make_images
from tfopt.errors import RecipeConfigError
from tfopt.plan import make_plan
from tfopt.recipes.data_pipeline import DataPipeline, tune_pipeline

BUDGET = 2**30


def elements(dataset):
    return [tuple(np.asarray(part) for part in element) for element in dataset.as_numpy_iterator()]


def assert_same_elements(first, second):
    a, b = elements(first), elements(second)
    assert len(a) == len(b)
    for left, right in zip(a, b):
        for x, y in zip(left, right):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


def decoded_pipeline():
    """A map-heavy pipeline, the kind the recipe parallelizes."""
    data = tf.data.Dataset.range(40)
    data = data.map(lambda i: (tf.fill([4], tf.cast(i, tf.float32)) * 2.0, i % 3))
    return data.batch(6)


def test_same_elements_in_the_same_order():
    pipeline = decoded_pipeline()
    tuned = tune_pipeline(pipeline, ram_budget_bytes=BUDGET)
    assert_same_elements(pipeline, tuned)
    # A cached pipeline replays the same elements in the second epoch.
    assert_same_elements(pipeline, tuned)


def test_options_are_set():
    options = tune_pipeline(decoded_pipeline(), ram_budget_bytes=BUDGET, deterministic=False).options()
    assert options.autotune.enabled is True
    assert options.autotune.ram_budget == BUDGET
    assert options.experimental_optimization.map_parallelization is True
    assert options.experimental_optimization.parallel_batch is True
    assert options.deterministic is False


def test_the_options_of_the_users_own_pipeline_are_kept_and_said(cpu_hardware):
    own = tf.data.Options()
    own.deterministic = False
    own.autotune.ram_budget = 2**24
    own.threading.private_threadpool_size = 2
    plan = make_plan(make_cnn(), make_images().with_options(own), hardware=cpu_hardware)
    tuned = DataPipeline()(plan)  # deterministic and a quarter of the RAM by default
    options = tuned.dataset.options()
    assert options.deterministic is False and options.autotune.ram_budget == 2**24
    assert options.threading.private_threadpool_size == 2 and options.autotune.enabled is True
    detail = tuned.applied[-1].detail
    assert "within 16 MiB of RAM (the budget your pipeline options set)" in detail
    assert "non-deterministic order (as your pipeline options set it)" in detail
    plain = DataPipeline()(make_plan(make_cnn(), make_images(), hardware=cpu_hardware))
    assert plain.dataset.options().deterministic is True and "your pipeline options" not in plain.applied[-1].detail


def test_non_deterministic_keeps_the_multiset():
    pipeline = decoded_pipeline().unbatch()
    tuned = tune_pipeline(pipeline, deterministic=False, ram_budget_bytes=BUDGET)
    key = lambda element: (float(element[0][0]), int(element[1]))  # noqa: E731
    assert sorted(map(key, elements(pipeline))) == sorted(map(key, elements(tuned)))


def recorded(dataset, **settings):
    plan = make_plan(make_cnn(), dataset, hardware=_hardware())
    return DataPipeline(**settings)(plan)


def _hardware():
    from tests.conftest import FAKE_HARDWARE

    return FAKE_HARDWARE["cpu_bf16"]


def has_cache(dataset):
    from tfopt.data.graph import pipeline_ops, serialize

    return any("Cache" in op for op in pipeline_ops(serialize(dataset)))


def test_deterministic_finite_pipeline_is_cached():
    plan = recorded(make_images())
    assert has_cache(plan.dataset)
    assert "cached in memory" in plan.applied[-1].detail


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: make_images().map(lambda x, y: (tf.image.random_flip_left_right(x), y)), "random op"),
        (lambda: make_images().unbatch().shuffle(16).batch(8), "shuffle"),
        (lambda: make_images().map(lambda x, y: (tf.py_function(lambda a: a, [x], tf.float32), y)), "py_function"),
        # Random ops whose names lack "Random" are caught by being stateful.
        (
            lambda: make_images().map(lambda x, y: (x + tf.random.truncated_normal([12, 12, 3]), y)),
            "stateful op TruncatedNormal",
        ),
        (
            lambda: make_images().map(
                lambda x, y: (x, tf.cast(tf.random.categorical([[0.5, 0.5]], 1)[0, 0], tf.int32))
            ),
            "stateful op Multinomial",
        ),
    ],
)
def test_cache_refused_where_it_would_change_later_epochs(make, reason):
    plan = recorded(make())
    assert not has_cache(plan.dataset)
    assert f"no cache: the pipeline contains {reason}" in plan.applied[-1].detail or reason in plan.applied[-1].detail


def test_lookup_tables_do_not_block_a_cache_and_the_users_own_cache_is_recognised():
    """An adapted StringLookup in the pipeline (keras-io captcha OCR's char_to_num) reads a table filled once:
    the same ids every epoch, so the decode before it is worth caching. A pipeline with its own cache() gets
    no second one, and the reason says so (not 'stateful op HashTableV2')."""
    lookup = keras.layers.StringLookup(vocabulary=["a", "b", "c"])
    words = tf.data.Dataset.from_tensor_slices((tf.constant([["a"], ["c"], ["b"], ["a"]]), tf.zeros(4)))
    plan = recorded(words.map(lambda x, y: (lookup(x), y)).batch(2))
    assert has_cache(plan.dataset) and "cached in memory" in plan.applied[-1].detail
    assert [list(x.numpy().ravel()) for x, _ in plan.dataset] == [[1, 3], [2, 1]]
    own = recorded(make_images().cache())
    detail = own.applied[-1].detail
    assert "no cache added: the pipeline has your own cache()" in detail and "stateful" not in detail


def test_an_assert_in_a_map_does_not_block_a_cache_but_a_random_op_under_a_condition_does():
    """`tf.debugging.assert_*` comes in an `If` (registered stateful): the same elements every epoch, so cached.
    What runs under a condition is judged by its own ops."""

    def checked(x, y):
        tf.debugging.assert_less(tf.reduce_max(x), 1e9)
        return x, y

    rng = np.random.default_rng(0)
    examples = tf.data.Dataset.from_tensor_slices(
        (rng.random((16, 12, 12, 3), dtype=np.float32), rng.integers(0, 3, 16).astype("int32"))
    )
    plan = recorded(examples.map(checked).batch(8))
    assert has_cache(plan.dataset) and "cached in memory" in plan.applied[-1].detail

    def sometimes_noisy(x, y):
        return tf.cond(tf.reduce_max(x) > 0.5, lambda: x + tf.random.truncated_normal(tf.shape(x)), lambda: x), y

    plan = recorded(examples.map(sometimes_noisy).batch(8))
    assert not has_cache(plan.dataset) and "stateful op TruncatedNormal" in plan.applied[-1].detail


def test_refusal_names_the_fix_for_what_it_found():
    detail = recorded(make_images().unbatch().shuffle(16).batch(8)).applied[-1].detail
    assert "put your .cache() before .shuffle()" in detail and "augmentation" not in detail


def test_cache_refused_for_infinite_pipeline():
    plan = recorded(make_images().repeat())
    assert not has_cache(plan.dataset) and "repeats forever" in plan.applied[-1].detail


def test_cache_refused_over_budget():
    plan = recorded(make_images(), ram_budget_fraction=1e-9)
    assert not has_cache(plan.dataset) and "exceeds the RAM budget" in plan.applied[-1].detail


def test_file_cache_and_none(tmp_path):
    prefix = str(tmp_path / "cache")
    plan = recorded(make_images(), cache=prefix)
    assert_same_elements(make_images(), plan.dataset)
    assert list(tmp_path.glob("cache*")), "the on-disk cache was not written"
    assert not has_cache(recorded(make_images(), cache="none").dataset)


def test_a_file_cache_locked_by_a_run_stopped_while_writing_it_is_refused_up_front(tmp_path):
    prefix = str(tmp_path / "cache")
    (tmp_path / "cache_0.lockfile").write_text("")  # what tf.data leaves when its writer is killed
    with pytest.raises(RecipeConfigError, match=r"cache file .* is locked .*cache_0\.lockfile.*delete .*cache_\*"):
        recorded(make_images(), cache=prefix)


def test_file_cache_in_missing_directory_fails_early(tmp_path):
    plan = make_plan(make_cnn(), make_images(), hardware=_hardware())
    with pytest.raises(RecipeConfigError, match="does not exist"):
        DataPipeline(cache=str(tmp_path / "missing" / "cache")).check(plan)


def test_original_dataset_untouched():
    original = make_images()
    options_before = original.options()
    recorded(original)
    assert original.options() == options_before
    assert not has_cache(original)


def graph_ops(dataset):
    from tfopt.data.graph import serialize

    return [node.op for node in serialize(dataset).node]


def py_function_pipeline():
    images = np.random.default_rng(0).random((32, 12, 12, 3), dtype=np.float32)
    data = tf.data.Dataset.from_tensor_slices((images, np.arange(32, dtype=np.int32) % 3))
    return data.map(lambda x, y: (tf.py_function(lambda a: a * 2.0, [x], tf.float32), y)).batch(8)


def test_py_function_map_is_parallelized_with_the_same_elements():
    pipeline = py_function_pipeline()
    plan = recorded(pipeline)
    ops = graph_ops(plan.dataset)
    assert "MapDataset" not in ops and ops.count("ParallelMapDatasetV2") == 1 and "ParallelBatchDataset" in ops
    detail = plan.applied[-1].detail
    assert "parallel map (AUTOTUNE calls, order kept): map 1 'lambda'" in detail
    assert "parallel_python_maps=False" in detail
    first, second = ([tf.nest.map_structure(np.asarray, e) for e in d] for d in (py_function_pipeline(), plan.dataset))
    assert len(first) == len(second) == 4
    for (x1, y1), (x2, y2) in zip(first, second):
        np.testing.assert_array_equal(x1.reshape(len(y1), 12, 12, 3), x2.reshape(len(y2), 12, 12, 3))
        np.testing.assert_array_equal(y1, y2)


def test_python_maps_opt_out():
    plan = recorded(py_function_pipeline(), parallel_python_maps=False)
    assert graph_ops(plan.dataset).count("MapDataset") == 1
    assert "kept sequential: map 1 'lambda' (Python function, parallel_python_maps=False)" in plan.applied[-1].detail


def test_the_users_own_opt_outs_of_parallel_maps_and_batches_are_kept():
    own = tf.data.Options()
    own.experimental_optimization.map_parallelization = False
    own.experimental_optimization.parallel_batch = False
    plan = recorded(py_function_pipeline().with_options(own))
    ops = graph_ops(plan.dataset)
    assert ops.count("MapDataset") == 1 and ops.count("BatchDatasetV2") == 1
    assert "ParallelMapDatasetV2" not in ops and "ParallelBatchDataset" not in ops
    options = plan.dataset.options().experimental_optimization
    assert options.map_parallelization is False and options.parallel_batch is False
    detail = plan.applied[-1].detail
    assert "maps kept sequential: your pipeline options set map_parallelization=False" in detail
    assert "batches kept sequential: your pipeline options set parallel_batch=False" in detail
    assert_same_elements(py_function_pipeline(), plan.dataset)


@pytest.mark.parametrize("theirs", [True, False], ids=["pipeline options", "recipe setting"])
def test_a_relaxed_order_is_said_as_relaxed(theirs):
    own = tf.data.Options()
    own.deterministic = False
    pipeline = py_function_pipeline().with_options(own) if theirs else py_function_pipeline()
    plan = recorded(pipeline, deterministic=theirs)
    detail = plan.applied[-1].detail
    assert "order kept" not in detail and plan.dataset.options().deterministic is False
    assert "parallel map (AUTOTUNE calls, order relaxed (deterministic=False))" in detail
    assert "1 batch made parallel (order relaxed" in detail


def test_tuning_twice_changes_nothing():
    once = tune_pipeline(py_function_pipeline(), ram_budget_bytes=BUDGET)
    twice = tune_pipeline(once, ram_budget_bytes=BUDGET)
    assert twice is once


def test_unrewritable_pipeline_is_left_with_the_reason():
    pipeline = make_images().apply(tf.data.experimental.copy_to_device("/cpu:0"))
    plan = recorded(pipeline)
    assert "maps and batches left as they were: its graph cannot be serialized" in plan.applied[-1].detail
    assert_same_elements(make_images(), plan.dataset)


@pytest.mark.parametrize("setting", ["parallel_random_maps", "parallel_python_maps", "deterministic"])
def test_settings_must_be_booleans(setting):
    with pytest.raises(RecipeConfigError, match=f"{setting}='no' must be true or false"):
        DataPipeline(**{setting: "no"})


@pytest.fixture
def source_plan(tmp_path):
    """A plan whose data comes from a tfopt.data source (24 tiny JPEGs), so the recipe rebuilds it."""
    from tfopt.data import ImageFolderSource, generate_shapes
    from tfopt.hardware import Hardware

    source = ImageFolderSource(
        generate_shapes(tmp_path / "shapes", images_per_class=6, image_size=16), image_size=(12, 12)
    )
    dataset = source.pipeline(batch_size=8, optimized=False, shuffle=False)
    return make_plan(make_cnn(num_classes=5), dataset, hardware=Hardware(), source=source)


def test_a_source_pipeline_takes_the_recipes_budget_order_and_cache_settings(source_plan):
    from tfopt.data.ram_budget import ram_budget_bytes

    tuned = DataPipeline(ram_budget_fraction=0.1, deterministic=False)(source_plan)
    options = tuned.dataset.options()
    assert options.deterministic is False
    assert abs(options.autotune.ram_budget - ram_budget_bytes(0.1)) < ram_budget_bytes(0.1) * 0.2
    assert has_cache(tuned.dataset) and "non-deterministic order" in tuned.applied[-1].detail
    uncached = DataPipeline(cache="none")(source_plan)
    assert not has_cache(uncached.dataset) and uncached.dataset.options().deterministic is not False
    assert "no cache" in uncached.applied[-1].detail


def test_a_cache_setting_a_source_cannot_honour_is_refused(source_plan, tmp_path):
    for cache in ("memory", str(tmp_path / "cache")):
        with pytest.raises(RecipeConfigError, match=r"does not apply to a tfopt.data source"):
            DataPipeline(cache=cache).check(source_plan)


def test_an_empty_pipeline_is_tuned():
    """tune_pipeline's: a plan refuses an empty dataset earlier, in make_plan."""
    tuned = tune_pipeline(
        tf.data.Dataset.range(0).map(lambda i: (tf.zeros([12, 12, 3]), i)).batch(8), ram_budget_bytes=BUDGET
    )
    assert list(tuned) == [] and "ParallelMapDatasetV2" in graph_ops(tuned)


def failing_first_element():
    """A pipeline whose first element fails, as a missing file does: the error belongs to iteration."""
    return tf.data.Dataset.from_tensor_slices(["missing-file.jpg", "missing-too.jpg"]).map(tf.io.read_file)


def test_a_pipeline_whose_first_element_fails_is_tuned_and_fails_as_it_did():
    tuned = tune_pipeline(failing_first_element(), ram_budget_bytes=BUDGET)
    with pytest.raises(tf.errors.NotFoundError, match=r"missing-file.jpg"):
        list(tuned)


def test_tuning_reads_no_element():
    """Reading one would run the Python function, and move a reshuffling shuffle on by an epoch."""
    calls = []

    def record(x):
        calls.append(int(x))
        return x

    build = lambda: tf.data.Dataset.range(10).map(lambda i: tf.py_function(record, [i], tf.int64))  # noqa: E731
    tuned = tune_pipeline(build(), ram_budget_bytes=BUDGET)
    assert calls == []
    assert [int(x) for x in tuned] == list(range(10))
    shuffled = lambda: tf.data.Dataset.range(10).shuffle(10, seed=7).batch(5)  # noqa: E731
    assert_same_elements(shuffled(), tune_pipeline(shuffled(), ram_budget_bytes=BUDGET))  # the same first epoch


@pytest.mark.parametrize(
    "dataset, expected",
    [
        # The batch dimension tf.data leaves open is bounded by the batch size.
        (lambda: make_images(count=20, image_size=12, batch_size=8), (8 * (12 * 12 * 3 * 4 + 4), None)),
        (lambda: make_images().unbatch().shuffle(4).prefetch(2), (12 * 12 * 3 * 4 + 4, None)),
        (
            lambda: tf.data.Dataset.range(9).batch(4).map(lambda x: tf.concat([x, x], 0)),
            (None, "element part 1 has shape (None,), which is not static"),
        ),
        (
            lambda: tf.data.Dataset.range(5).map(tf.range).padded_batch(2),
            (None, "element part 1 has shape (None, None), which is not static"),
        ),
        (
            lambda: tf.data.Dataset.from_tensors(["a", "b"]),
            (None, "element part 1 is a tf.string tensor, whose size only its data tells"),
        ),
        (
            lambda: tf.data.Dataset.range(5).map(tf.range).ragged_batch(2),
            (None, "element part 1 is a RaggedTensorSpec, whose size only its data tells"),
        ),
    ],
)
def test_element_sizes_come_from_static_shapes(dataset, expected):
    from tfopt.data.graph import element_bytes, serialize

    assert element_bytes(dataset().element_spec, serialize(dataset())) == expected


def final_buffer_size(dataset):
    from tfopt.data.graph import output_chain, serialize

    graph = serialize(dataset)
    prefetch = next(node for node in output_chain(graph) if node.op != "OptionsDataset")
    size = next(node for node in graph.node if node.name == prefetch.input[1].split(":")[0])
    return int(tf.make_ndarray(size.attr["value"].tensor))


def test_the_final_prefetch_holds_the_budgets_share_of_elements_the_users_autotune_one_too():
    from tfopt.data.ram_budget import prefetch_batches

    budget = 1_400_000  # its prefetch share, 8%, holds 8 batches of 8 12x12 images
    expected = prefetch_batches(8 * (12 * 12 * 3 * 4 + 4), budget)
    assert expected == 8
    for pipeline in (make_images(), make_images().prefetch(tf.data.AUTOTUNE)):
        tuned = tune_pipeline(pipeline, ram_budget_bytes=budget)
        assert final_buffer_size(tuned) == expected
        assert_same_elements(make_images(), tuned)


def test_unknown_sizes_are_said_and_leave_sizing_to_tf_data():
    plan = recorded(make_images().map(lambda x, y: (tf.py_function(lambda a: a, [x], tf.float32), y)))
    detail = plan.applied[-1].detail
    assert "the elements' size is unknown without reading one: element part 1 has an unknown rank" in detail
    assert "ends with a prefetch(AUTOTUNE), sized by tf.data within the autotune RAM budget" in detail
    assert final_buffer_size(plan.dataset) == tf.data.AUTOTUNE


def test_a_pipeline_over_the_graph_limit_is_left_as_it_was_with_the_reason(monkeypatch):
    from tfopt.data import graph

    monkeypatch.setattr(graph, "MAX_GRAPH_BYTES", 16 * 1024)
    plan = recorded(make_images())  # 32 images of 12x12x3 float32 and their labels: 54 KiB
    detail = plan.applied[-1].detail
    assert "no cache: tfopt cannot read the pipeline's graph to check it" in detail
    assert (
        "maps and batches left as they were: its graph holds 54 KiB of in-memory data (arrays passed to "
        "from_tensor_slices or captured by its functions are part of it), more than the 16 KiB tfopt copies" in detail
    )
    assert_same_elements(make_images(), plan.dataset)
