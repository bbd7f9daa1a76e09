"""The input pipeline stage by stage, read from captures Keras' own TensorBoard callback makes here (a planted
slow map among cheap ones, before and after tfopt's rewrite), and from the real GPU captures."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.data.rewrite import parallelize
from tfopt.profiling.analyze import find_xplane
from tfopt.profiling.stages import pipeline_stages

SLEEP_SECONDS = 0.01
BATCH = 16


def slow_augment(image, label):
    def sleep(array):
        time.sleep(SLEEP_SECONDS)  # a slow decode in Python
        return array

    image = tf.numpy_function(sleep, [image], tf.float32)
    return tf.ensure_shape(image, [8]), label


def to_float(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


def cheap_flip(image, label):
    return tf.reverse(image, [0]), label


def planted_pipeline() -> tf.data.Dataset:
    """A sequential map sleeping 10 ms per element between two cheap parallel maps."""
    images = np.random.default_rng(0).integers(0, 255, (256, 8), dtype=np.uint8)
    labels = np.random.default_rng(1).random((256, 1), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(256, seed=0)
    dataset = dataset.map(to_float, num_parallel_calls=tf.data.AUTOTUNE).map(slow_augment)
    return dataset.map(cheap_flip, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)


class _Pauses(keras.callbacks.Callback):
    def __init__(self, seconds_after_batch: dict[int, float]):
        super().__init__()
        self.seconds_after_batch = seconds_after_batch

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds_after_batch.get(batch, 0.0))


def keras_capture(dataset: tf.data.Dataset, logdir: Path, *, pauses: dict[int, float] | None = None) -> Path:
    """Trains a tiny model with Keras' TensorBoard callback profiling batches 3 to 5, as users do, pausing
    after the batches `pauses` names (the capture's profiler starts before batch 3)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    callback = keras.callbacks.TensorBoard(log_dir=str(logdir), profile_batch=(3, 5), write_graph=False)
    callbacks = [_Pauses(pauses or {}), callback]
    model.fit(dataset.repeat(), steps_per_epoch=7, epochs=1, verbose=0, callbacks=callbacks)
    return find_xplane(logdir)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    dataset = planted_pipeline()
    return dataset, keras_capture(dataset, tmp_path_factory.mktemp("planted"))


@pytest.mark.slow
def test_the_planted_slow_map_is_named_first_with_its_time_and_parallelism(planted):
    dataset, xplane = planted
    table = pipeline_stages(xplane, cpu_count=os.cpu_count(), dataset=dataset)
    slow = table.bottleneck
    assert table.stages[0] is slow and slow.label == "map slow_augment"
    assert slow.kind == "Map" and slow.parallelism == 1 and slow.autotuned is None
    # Each element sleeps 10 ms (a loaded machine wakes it late: 48 ms seen); a batch's elements together, 160.
    assert SLEEP_SECONDS <= slow.seconds_per_element < BATCH / 2 * SLEEP_SECONDS
    assert slow.work_per_batch_seconds == pytest.approx(slow.seconds_per_element * BATCH, rel=0.35)
    assert table.share(slow) > 0.9 and table.margin > 10
    assert table.recipe == "data_pipeline" and "num_parallel_calls=AUTOTUNE" in table.fix
    # tf.data fused the cheap map with the batch after it; both keep their functions' names
    assert {"parallel map to_float", "map+batch cheap_flip"} <= {stage.label for stage in table.stages}
    cheap = next(stage for stage in table.stages if stage.label == "parallel map to_float")
    assert cheap.autotuned is True and cheap.parallelism >= 1 and cheap.function_calls > 0
    assert cheap.seconds_per_element < SLEEP_SECONDS / 5


def test_work_per_batch_holds_where_the_buffer_filled_before_the_capture(tmp_path):
    """On a GPU the profiler starts slowly and the buffers fill meanwhile: the root hands on batches made
    before the capture, and the slow map works in it for later ones. Its work per batch is its work per
    element times the batch, whatever share of its batches the capture holds."""
    dataset = planted_pipeline().prefetch(4)
    # The buffer fills before the capture; in it, the map makes two batches' elements while training pauses.
    pauses = {1: 6 * BATCH * SLEEP_SECONDS, 4: 2 * BATCH * SLEEP_SECONDS}
    xplane = keras_capture(dataset, tmp_path, pauses=pauses)
    table = pipeline_stages(xplane, cpu_count=2, dataset=dataset)
    slow = table.bottleneck
    assert slow.label == "map slow_augment"
    assert slow.calls < 3 * BATCH  # the capture holds fewer of its elements than of the batches handed on
    assert slow.work_per_batch_seconds == pytest.approx(slow.seconds_per_element * BATCH)
    assert slow.work_per_batch_seconds >= BATCH * SLEEP_SECONDS


@pytest.mark.slow
def test_without_the_dataset_the_stage_is_named_by_the_trace(planted):
    _, xplane = planted
    table = pipeline_stages(xplane, cpu_count=2)
    # The trace holds no function names: the map is found by its place among the three, from the source.
    assert table.bottleneck.kind == "Map" and table.bottleneck.label.startswith(
        "map #2 of 3 from the source (MapDataset:"
    )
    assert "slowest input stage: map #2 of 3 from the source (MapDataset:" in table.top_line()


@pytest.mark.slow
def test_after_tfopts_rewrite_the_slow_map_runs_in_parallel(tmp_path):
    rewritten, notes = parallelize(planted_pipeline(), prefetch_batches=2)
    assert any(note.startswith("parallel map") for note in notes)
    table = pipeline_stages(keras_capture(rewritten, tmp_path), cpu_count=os.cpu_count(), dataset=rewritten)
    slow = next(stage for stage in table.stages if "slow_augment" in stage.label)
    assert slow.kind in ("ParallelMapV2", "MapAndBatch") and slow.parallelism >= 2 and slow.autotuned
    assert table.bottleneck is slow and slow.function_calls > 0
    # at the core count: a parallel map cannot go faster on this host, and the fix says what is left
    assert table.host_limited and table.recipe == "data_service" and "the host is the limit" in table.fix


@pytest.mark.slow
def test_a_diagnosis_read_from_a_keras_capture_names_the_slow_map_by_its_place(planted):
    """As a user meets it: three maps in their script, a capture by Keras' TensorBoard callback read with
    `tfopt.diagnose(logdir)`, which has no dataset at hand. The slow map is the second of the three."""
    import tfopt

    _, xplane = planted
    diagnosis = tfopt.diagnose(xplane)
    finding = next(finding for finding in diagnosis.findings if finding.recipe == "data_pipeline")
    assert "map #2 of 3 from the source (MapDataset:" in str(finding), str(finding)


def test_a_pipeline_that_keeps_up_gets_no_recipe(planted):
    _, xplane = planted
    table = pipeline_stages(xplane, cpu_count=2, step_seconds=100.0)
    assert table.recipe is None and table.fix.startswith("The pipeline keeps up")


@pytest.mark.parametrize("case", ["slow_map_serial", "slow_map_parallel"])
def test_gpu_captures_with_a_planted_stage(unpack_capture, case):
    """H200 captures by Keras' TensorBoard callback (tests/fixtures/gpu-planted): a map sleeping 10 ms per
    element, sequential, then made parallel."""
    logdir = unpack_capture("gpu-planted", case)
    truth = json.loads((logdir / "case.json").read_text())
    assert truth["device"] == "NVIDIA H200" and truth["planted"] == {"stage": "slow_augment"}
    table = pipeline_stages(find_xplane(logdir), cpu_count=16)
    slow = table.bottleneck
    assert table.stages[0] is slow and table.share(slow) > 0.95
    assert 0.95 * SLEEP_SECONDS <= slow.seconds_per_element < 1.5 * SLEEP_SECONDS
    if case == "slow_map_serial":
        assert slow.kind == "Map" and slow.parallelism == 1 and table.recipe == "data_pipeline"
        assert slow.bound_seconds_per_batch == pytest.approx(32 * slow.seconds_per_element, rel=0.1)
    else:  # AUTOTUNE gave it all 16 cores: the host is the limit
        assert slow.kind == "ParallelMapV2" and slow.parallelism == 16 and slow.autotuned
        assert table.host_limited and table.recipe == "data_service"


def test_the_h100_starved_capture_names_its_python_map(unpack_capture):
    logdir = unpack_capture("gpu-h100", "starved_pyfunc")
    table = pipeline_stages(find_xplane(logdir), cpu_count=16)
    slow = table.bottleneck
    # map(py_function sleeping 20 ms) fused by tf.data with the batch of 16 that follows it
    assert slow.kind == "MapAndBatch" and slow.name.startswith("fused(MapDataset") and slow.parallelism == 1
    assert slow.bound_seconds_per_batch == pytest.approx(16 * 0.020, rel=0.1)
    assert table.recipe == "data_pipeline"
