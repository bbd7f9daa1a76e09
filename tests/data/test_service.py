"""tf.data service offload over 127.0.0.1: which pipelines go and how, and what comes back.

In-process servers (TensorFlow's own) check what a pipeline reads back as; `LocalCluster` checks worker
processes: their start, a worker killed mid-epoch, and that none outlives the cluster.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import tensorflow as tf

from tests.processes import alive, child_environment, kill_all, processes_with, run_waiting, wait_gone
from tfopt.data import graph as pipeline_graph
from tfopt.data.rewrite import parallelize
from tfopt.data.service import COMPRESS_FROM_BYTES, dynamic_sharding, plan_offload, python_blocker
from tfopt.data.service_client import serve
from tfopt.data.synthetic import SyntheticSource
from tfopt.errors import DataError, DistributionError


@pytest.fixture(autouse=True)
def no_global_seed():
    """The pipelines here are built as a script that sets no global seed builds them: one an earlier test of this
    process set would seed their shuffles, which the service then keeps local (`state_blocker`)."""
    tf.random.set_seed(None)


@pytest.fixture
def in_process_service():
    """A dispatcher and two workers in this process, as a cluster of two hosts would serve, for one test: kept
    for a module, they outlived its tests by the other modules the same test worker ran, and stopping them
    then took a minute. Their heartbeats are tfopt's own servers' (TensorFlow's default is seconds apart, and
    `stop()` waits out the one in progress)."""
    from tensorflow.data.experimental import service

    from tfopt.data.service_servers import HEARTBEAT_MS

    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0, protocol="grpc"))
    address = dispatcher.target.split("://")[1]
    workers = [
        service.WorkerServer(service.WorkerConfig(dispatcher_address=address, heartbeat_interval_ms=HEARTBEAT_MS))
        for _ in range(2)
    ]
    yield dispatcher.target
    for worker in workers:
        worker.stop()
    dispatcher.stop()


def batches(dataset):
    return [tuple(np.asarray(part) for part in tf.nest.flatten(batch)) for batch in dataset]


def elements(dataset):
    """Every element of every batch, as sortable tuples."""
    rows = []
    for parts in batches(dataset):
        rows.extend(zip(*(part.reshape(len(part), -1).tolist() for part in parts)))
    return sorted(tuple(map(tuple, row)) for row in rows)


def tfrecord_files(directory, files=4, per_file=25):
    paths = []
    for index in range(files):
        path = str(directory / f"part-{index}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for value in range(index * per_file, (index + 1) * per_file):
                writer.write(tf.io.serialize_tensor(tf.constant([value, value * 3], tf.int64)).numpy())
        paths.append(path)
    return paths


def parse(record):
    return tf.ensure_shape(tf.io.parse_tensor(record, tf.int64), [2])


def pipelines(tmp_path):
    """Pipelines whose source splits, written the way scripts write them; each (name, dataset, batch size)."""
    images = np.random.default_rng(0).random((90, 6, 6, 3), dtype=np.float32)
    labels = np.arange(90)
    files = tfrecord_files(tmp_path)
    return [
        ("range, map, batch", tf.data.Dataset.range(100).map(lambda i: (i, i * i)).batch(8), 8),
        (
            "slices, shuffle, random flip, batch",
            tf.data.Dataset.from_tensor_slices((images, labels))
            .shuffle(90)
            .map(lambda x, y: (tf.image.random_flip_left_right(x) * 0 + x, y), num_parallel_calls=2)
            .batch(16),
            16,
        ),
        (
            "files, interleave, parse, filter, batch",
            tf.data.Dataset.from_tensor_slices(files)
            .interleave(tf.data.TFRecordDataset, cycle_length=2)
            .map(parse)
            .filter(lambda v: v[0] % 3 != 0)
            .batch(10),
            10,
        ),
        ("TFRecord files, parse, cache, batch", tf.data.TFRecordDataset(files).map(parse).cache().batch(7), 7),
        (
            "tfopt's rewrite of range, map, batch",
            parallelize(tf.data.Dataset.range(64).map(lambda i: tf.stack([i, -i])).batch(8), prefetch_batches=2)[0],
            8,
        ),
    ]


def test_dynamic_sharding_serves_each_element_once_per_epoch_in_the_local_batches(in_process_service, tmp_path):
    for name, dataset, batch_size in pipelines(tmp_path):
        offload, why = plan_offload(dataset, dispatcher=in_process_service)
        assert offload is not None, (name, why)
        assert offload.sharding == "dynamic" and "splits" in offload.reasons[0], name
        served = serve(dataset, offload, in_process_service, batch_size=batch_size)
        local_sizes = [len(parts[0]) for parts in batches(dataset)]
        for _ in range(2):  # each epoch a pass of its own
            served_batches = batches(served)
            assert [len(parts[0]) for parts in served_batches] == local_sizes, name
            assert elements(served) == elements(dataset), name
        assert served.element_spec == dataset.element_spec, name


def test_static_batches_are_cut_on_the_client_as_the_local_pipeline_cuts_them(in_process_service):
    """XLA's static batches: the workers serve the partial batches of their shares, the client cuts full ones,
    so a pass drops what the local pipeline drops (the last 4 of 100), no more."""
    from tfopt.data.batches import static_batches

    dataset = tf.data.Dataset.range(100).map(lambda i: tf.fill([3], i)).batch(8)
    static, dropped = static_batches(dataset, 8)
    offload, _ = plan_offload(dataset, dispatcher=in_process_service)
    served = serve(
        dataset, offload, in_process_service, batch_size=8, static=True, batches_per_pass=int(static.cardinality())
    )
    assert served.element_spec.shape.as_list() == [8, 3] and int(served.cardinality()) == 12 and dropped == 4
    for _ in range(2):
        got = batches(served)
        assert len(got) == 12 and all(parts[0].shape == (8, 3) for parts in got)
        values = [value for parts in got for value in parts[0][:, 0].tolist()]
        assert len(values) == len(set(values)) == 96 and set(values) <= set(range(100))


@pytest.mark.parametrize(
    "make, op, function",
    [
        (
            lambda: tf.data.Dataset.range(6).map(lambda i: tf.py_function(lambda v: v, [i], tf.int64)),
            "EagerPyFunc",
            "py_function",
        ),
        (
            lambda: tf.data.Dataset.range(6).map(lambda i: tf.numpy_function(lambda v: v, [i], tf.int64)),
            "PyFunc",
            "numpy_function",
        ),
        (
            lambda: tf.data.Dataset.range(6).map(
                lambda i: tf.numpy_function(lambda v: v, [i], tf.int64, stateful=False)
            ),
            "PyFuncStateless",
            "numpy_function",
        ),
    ],
)
def test_a_pipeline_calling_python_stays_local_with_the_op_named(make, op, function):
    dataset = make().batch(2)
    offload, why = plan_offload(dataset, workers=2)
    assert offload is None and why.startswith("left local: its map calls") and f"{function} ({op})" in why


def test_a_generator_source_stays_local_and_names_the_fix():
    dataset = tf.data.Dataset.from_generator(lambda: iter(range(5)), output_signature=tf.TensorSpec([], tf.int64))
    offload, why = plan_offload(dataset.batch(2), workers=1)
    assert offload is None and "from_generator (GeneratorDataset)" in why and "TFRecord" in why
    assert python_blocker(pipeline_graph.serialize(tf.data.Dataset.range(3).map(lambda i: i + 1))) is None


@pytest.mark.parametrize(
    "make, op",
    [
        (lambda: tf.data.Dataset.range(100).take(50), "TakeDataset"),
        (lambda: tf.data.Dataset.range(100).skip(50), "SkipDataset"),
        (lambda: tf.data.Dataset.range(100).enumerate(), "ZipDataset"),
        (lambda: tf.data.Dataset.zip((tf.data.Dataset.range(9), tf.data.Dataset.range(9))), "ZipDataset"),
        (lambda: tf.data.Dataset.range(100).shard(2, 0), "ShardDataset"),
    ],
)
def test_ops_that_count_elements_keep_dynamic_sharding_off(make, op):
    """On TF 2.21, take(50) of a range over two workers gave 100 elements: such ops must not be split."""
    dataset = make().batch(4)
    splittable, why = dynamic_sharding(pipeline_graph.serialize(dataset))
    assert not splittable and op in why
    offload, left = plan_offload(dataset, workers=2)
    assert offload is None and "each produce the whole dataset" in left and "workers: 1" in left
    single, _ = plan_offload(dataset, workers=1)  # one worker serves the whole pipeline: exact
    assert single.sharding == "off" and "the one worker runs the whole pipeline" in single.reasons[0]


def test_what_several_workers_would_each_do_differently_stays_local_or_is_said():
    """A padded batch pads each worker's last batch to its own length; a file cache would be written by every
    worker at once; a dropped remainder is dropped once per worker."""
    padded = tf.data.Dataset.range(40).map(lambda i: tf.range(i % 5)).padded_batch(4)
    assert "PaddedBatchDatasetV2" in plan_offload(padded, workers=2)[1]
    assert plan_offload(padded, workers=1)[0].sharding == "off"
    on_file = tf.data.Dataset.range(64).cache("/tmp/tfopt-cache").batch(8)
    assert "written by every worker at once" in plan_offload(on_file, workers=2)[1]
    assert plan_offload(on_file, workers=1)[0] is not None
    dropping, _ = plan_offload(tf.data.Dataset.range(64).batch(6, drop_remainder=True), workers=2)
    assert any("each worker drops its own last partial batch" in reason for reason in dropping.reasons)


def test_a_function_after_a_batch_keeps_several_workers_off():
    """Each worker batches the splits it was handed: a map after the batch would see other rows together than
    the local pipeline's batches (on TF 2.21, per-batch centering delivered rows the local pipeline never made,
    and batches padded to their own longest text failed in the client's rebatch). One worker serves it exactly.
    A map of element-wise ops on single values (tfopt's own pipelines finish their batches so) gives each row
    the same value in any batch, and tf.data's own map before a rebatch or an unbatch changes no row."""
    rows = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    batched = tf.data.Dataset.from_tensor_slices(rows).batch(8)
    per_column = tf.constant([1.0, 2.0, 3.0, 4.0])  # a tensor closed over, as long as the batch could be
    for dataset, op in (
        (batched.map(lambda batch: batch - tf.reduce_mean(batch, 0)), "MapDataset"),
        (parallelize(batched.map(lambda batch: batch - tf.reduce_min(batch)), prefetch_batches=2)[0], "ParallelMap"),
        (batched.map(lambda batch: batch * per_column), "MapDataset"),
        (batched.map(lambda batch: batch * [1.0, 2.0, 3.0, 4.0]), "MapDataset"),
        (batched.filter(lambda batch: tf.reduce_sum(batch) > 0), "FilterDataset"),
        (batched.batch(2), "BatchDatasetV2"),
        (batched.map(lambda batch: batch - tf.reduce_mean(batch)).unbatch().batch(8), "MapDataset"),  # then tf.data's
    ):
        offload, why = plan_offload(dataset, workers=2)
        assert offload is None and f"its {op}" in why and "comes after a batch" in why, why
        assert plan_offload(dataset, dispatcher="grpc://10.0.0.5:5050")[0] is None
        assert plan_offload(dataset, workers=1)[0].sharding == "off"
    for dataset in (
        batched.map(lambda batch: tf.cast(batch, tf.float16) * 2 + 1),
        parallelize(batched.map(lambda batch: tf.maximum(batch, 0.0)), prefetch_batches=2)[0],
        batched.rebatch(4),
        batched.unbatch().map(lambda row: row - tf.reduce_mean(row)).batch(4),
        SyntheticSource("image", examples=32, image_size=(8, 8)).pipeline(batch_size=4, optimized=True, shuffle=False),
    ):
        assert plan_offload(dataset, workers=2)[0].sharding == "dynamic"


def test_the_build_decides_again_on_the_pipeline_it_serves(in_process_service, cpu_hardware):
    """A recipe of a later stage may change the pipeline after data_service decided: the build plans it again
    and keeps it local where it no longer fits, saying why in place of the recipe's decision."""
    import keras

    from tfopt.builder import build
    from tfopt.plan import make_plan
    from tfopt.recipes import DataService

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((tf.ones((32, 3)), tf.zeros((32, 2)))).batch(8)
    plan = DataService(dispatcher=in_process_service)(make_plan(model, data, hardware=cpu_hardware))
    assert plan.data_service.sharding == "dynamic" and not plan.applied[-1].skipped
    built = build(plan)
    assert built.service is None and built.plan.data_service is not None  # a dispatcher: nothing started here
    assert int(built.dataset.cardinality()) == 4 and len(elements(built.dataset)) == 32
    changed = build(plan.replace(dataset=data.take(3)))  # as a later recipe might leave it
    assert changed.plan.data_service is None and changed.dataset is changed.plan.dataset
    step = [step for step in changed.plan.applied if step.recipe == "data_service"]
    assert len(step) == 1 and step[0].skipped and "TakeDataset" in step[0].detail


def test_a_pipeline_batch_size_rebatched_is_served_with_its_length_asserted_on_the_client(
    in_process_service, cpu_hardware
):
    """batch_size's rebatch ends the pipeline with an assert_cardinality, which each worker would check against its
    own share: the workers run the pipeline without it, and the client's batches keep the pass's length."""
    import keras

    from tfopt.builder import build
    from tfopt.plan import make_plan
    from tfopt.recipes import BatchSize, DataService

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    features = np.arange(100 * 3, dtype="float32").reshape(100, 3)
    data = tf.data.Dataset.from_tensor_slices((features, np.zeros((100, 2), "float32"))).map(lambda x, y: (x * 2, y))
    plan = DataService(dispatcher=in_process_service)(make_plan(model, data.batch(8), hardware=cpu_hardware))
    built = build(BatchSize(batch_size=32)(plan))
    step = next(step for step in built.plan.applied if step.recipe == "data_service")
    assert not step.skipped and "dynamic sharding" in step.detail, step.detail
    assert step.detail.endswith("read back in the local pipeline's batches, a pass's worth per epoch")
    assert int(built.dataset.cardinality()) == 4
    assert [row[0] for row in elements(built.dataset.map(lambda x, y: x))] == [tuple(row * 2) for row in features]


@pytest.mark.slow
def test_the_pipeline_recipe_caches_nothing_in_memory_for_a_pipeline_the_service_serves(cpu_hardware):
    """The two recipes together, as a script asks for them: the pipeline recipe plans for the service (no
    cache its workers would fill anew every epoch), so the service is not refused; alone it caches."""
    import keras

    import tfopt

    def augment(features, label):
        return features * 2.0, label

    features = np.random.default_rng(0).random((128, 8)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((features, np.arange(128) % 3)).map(augment).batch(16)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    recipes = ["data_pipeline", {"data_service": {"workers": 1}}]
    with tfopt.apply(model, data, recipes, hardware=cpu_hardware, measure_speed=False) as result:
        steps = {step.recipe: step for step in result.plan.applied}
        assert not steps["data_pipeline"].skipped and "cached" not in steps["data_pipeline"].detail
        assert steps["data_pipeline"].detail.endswith(
            "no cache: data_service serves this pipeline from its workers, one job per epoch, where a cache in "
            "memory would be filled anew every epoch"
        )
        assert not steps["data_service"].skipped and result.service is not None
        assert elements(result.dataset) == elements(data)
    alone = tfopt.apply(model, data, ["data_pipeline"], hardware=cpu_hardware, measure_speed=False)
    assert "cached in memory after the first epoch" in alone.plan.applied[-1].detail


def test_state_the_workers_would_start_again_or_freeze_stays_local_with_the_reason(monkeypatch):
    """A worker builds the pipeline from its graph: a variable or mutable table is a copy of its value when sent,
    and a single training process's epochs are jobs of their own, each from where the pipeline started. A Keras
    random layer in a map or a seeded shuffle would repeat the first epoch's draws and order every epoch (seen on
    TF 2.21); an unseeded shuffle reshuffles anyway, and one job shared by several training workers carries on."""
    import json

    import keras

    flip, strength = keras.layers.RandomFlip("horizontal"), tf.Variable(1.0)
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)
    images = tf.data.Dataset.from_tensor_slices(tf.zeros((8, 2, 2, 1)))
    numbers = tf.data.Dataset.range(8)
    for dataset, reason in (
        (images.map(flip).batch(4), "a Keras random layer's seed generator) would give every epoch the first"),
        (numbers.shuffle(8, seed=1).batch(4), "a shuffle (a Dataset.random) with a seed, its own or the global"),
        (tf.data.Dataset.random(seed=2, rerandomize_each_iteration=True).take(8).batch(4), "a shuffle (a Dat"),
        (numbers.map(lambda i: tf.cast(i, tf.float32) * strength).batch(4), "it reads state it never sets itself"),
        (numbers.map(table.lookup).batch(4), "a mutable table: MutableHashTableV2), of which the workers would"),
    ):
        offload, why = plan_offload(dataset, workers=1)
        assert offload is None and reason in why, why
    assert plan_offload(numbers.shuffle(8).batch(4), workers=1)[0].sharding == "off"
    assert plan_offload(numbers.shuffle(8, seed=1, reshuffle_each_iteration=False).batch(4), workers=1)[0]
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    assert plan_offload(numbers.shuffle(8, seed=1).batch(4), dispatcher="grpc://127.0.0.1:1")[0] is not None
    frozen = plan_offload(numbers.map(lambda i: tf.cast(i, tf.float32) * strength).batch(4), workers=1)
    assert frozen[0] is None and "it reads state it never sets itself" in frozen[1]


def test_a_sources_pipeline_is_served_with_fresh_seeds_each_epoch(in_process_service, cpu_hardware):
    """tfopt's own pipelines are seeded: served as they are, every epoch's job would start the shuffle's sequence
    again. Each epoch is reshuffled, with the same examples, and the plan says the order is not the local one."""
    import keras

    import tfopt

    source = SyntheticSource("image", examples=16, image_size=(4, 4), num_classes=3)
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    recipes = [{"data_service": {"dispatcher": in_process_service}}]
    with tfopt.apply(model, source, recipes, batch_size=4, hardware=cpu_hardware, measure_speed=False) as result:
        step = next(step for step in result.plan.applied if step.recipe == "data_service")
        assert not step.skipped and "draws fresh seeds for the source's shuffle and augmentation" in step.detail
        epochs = [[float(value) for x, _ in result.dataset for value in tf.reduce_sum(x, [1, 2, 3])] for _ in range(3)]
    assert len({tuple(epoch) for epoch in epochs}) == 3 and len({tuple(sorted(epoch)) for epoch in epochs}) == 1
    assert len(epochs[0]) == 16


def test_an_in_memory_cache_stays_on_this_host_unless_other_hosts_serve_it():
    """Each epoch is a service job of its own, so a worker's cache() lasts one epoch."""
    cached = tf.data.Dataset.range(64).map(lambda i: i * 2).cache().batch(8)
    offload, why = plan_offload(cached, workers=2)
    assert offload is None and "in-memory cache (cache()) is filled anew every epoch" in why
    remote, _ = plan_offload(cached, dispatcher="grpc://10.0.0.5:5050")
    assert any("the workers redo the work it saves" in reason for reason in remote.reasons)
    on_file, _ = plan_offload(tf.data.Dataset.range(64).cache("/tmp/tfopt-cache").batch(8), workers=1)
    assert on_file is not None and not any("cache" in reason for reason in on_file.reasons)


def test_a_source_that_does_not_split_keeps_sharding_off():
    splittable, why = dynamic_sharding(pipeline_graph.serialize(tf.data.Dataset.from_tensors([1, 2]).repeat(4)))
    assert not splittable and "(TensorDataset) does not split" in why


def test_compression_by_element_size_and_place():
    small = tf.data.Dataset.range(64).map(lambda i: tf.fill([16], tf.cast(i, tf.float32))).batch(8)  # 512 B
    large = tf.data.Dataset.range(64).map(lambda i: tf.fill([64, 64, 3], tf.cast(i, tf.float32))).batch(8)
    assert COMPRESS_FROM_BYTES <= 8 * 64 * 64 * 3 * 4
    remote = "grpc://10.0.0.5:5050"
    assert plan_offload(large, workers=2)[0].compression is None  # loopback: the host's cores are the limit
    assert plan_offload(large, dispatcher=remote)[0].compression == "AUTO"
    assert plan_offload(small, dispatcher=remote)[0].compression is None
    assert plan_offload(small, dispatcher=remote, compression="snappy")[0].compression == "AUTO"
    text = tf.data.Dataset.from_tensor_slices(["a", "b"]).batch(2)
    chosen = plan_offload(text, dispatcher=remote)[0]
    assert chosen.compression == "AUTO" and "unknown" in chosen.reasons[1]
    assert plan_offload(small, dispatcher=remote)[0].batch_bytes == 8 * 16 * 4 and chosen.batch_bytes is None


def test_a_batch_that_a_map_reshapes_afterwards_is_sized_by_the_batch_size():
    """A map after the batch, or a rebatch, leaves tf.data's batch dimension open: the plan's batch size sizes
    it. (A map after the batch goes to one worker only: several would each batch rows of their own.)"""
    images = tf.data.Dataset.range(64).map(lambda i: tf.fill([64, 64, 3], tf.cast(i, tf.float32)))
    mapped = images.batch(8).map(lambda images: images / 2)
    assert plan_offload(mapped, workers=1)[0].batch_bytes is None
    assert plan_offload(mapped, workers=1, batch_size=8)[0].batch_bytes == 8 * 64 * 64 * 3 * 4
    sized = plan_offload(images.batch(16).rebatch(8), dispatcher="grpc://10.0.0.5:5050", batch_size=8)[0]
    assert sized.batch_bytes == 8 * 64 * 64 * 3 * 4 and sized.compression == "AUTO"
    assert "KiB elements cross the network" in sized.reasons[1]


def test_the_functional_form_serves_or_says_why_not(in_process_service):
    from tfopt.recipes import offload_pipeline

    dataset = tf.data.Dataset.range(40).map(lambda i: i * 7).batch(5)
    served, cluster = offload_pipeline(dataset, batch_size=5, dispatcher=in_process_service)
    assert cluster is None and elements(served) == elements(dataset)
    python = dataset.map(lambda batch: tf.py_function(lambda b: b, [batch], tf.int64))
    with pytest.raises(DataError, match=r"cannot be offloaded: its map calls py_function \(EagerPyFunc\)"):
        offload_pipeline(python, batch_size=5, workers=1)


def test_an_unreachable_dispatcher_fails_fast_with_the_address():
    from tfopt.distribute.launcher import free_ports

    dataset = tf.data.Dataset.range(8).batch(2)
    target = f"grpc://127.0.0.1:{free_ports(1)[0]}"
    offload, _ = plan_offload(dataset, dispatcher=target)
    with pytest.raises(DataError, match=f"no dispatcher answers at {target}.*data-service dispatcher"):
        serve(dataset, offload, target, batch_size=2)


def test_a_dispatcher_that_accepts_and_never_answers_fails_at_its_deadline():
    import socket

    with socket.socket() as silent:  # listens (the kernel accepts connections), never reads nor writes
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        target = f"grpc://127.0.0.1:{silent.getsockname()[1]}"
        dataset = tf.data.Dataset.range(8).batch(2)
        offload, _ = plan_offload(dataset, dispatcher=target, answer_timeout_seconds=1.5)
        started = time.monotonic()
        with pytest.raises(DataError) as raised:
            serve(dataset, offload, target, batch_size=2)
    waited = time.monotonic() - started  # the deadline, not a hang and not at once
    assert waited >= 1.5 and waited < 10, waited
    assert str(raised.value).startswith(
        f"data_service: the dispatcher at {target} accepted the connection but did not answer within 1.5 s "
        "(data_service.answer_timeout_seconds)."
    )


SILENT_DISPATCHER_RECIPE = """
model: {{name: small_cnn, filters: [4]}}
data: {{source: synthetic, kind: image, examples: 16, image_size: [8, 8], batch_size: 4}}
recipes: [{{data_service: {{dispatcher: "grpc://127.0.0.1:{port}", answer_timeout_seconds: {seconds}}}}}]
profile: {{steps: 2, warmup_steps: 1}}
"""


@pytest.mark.parametrize("ending", ["deadline", "sigterm"])
def test_a_run_waiting_for_a_silent_dispatcher_ends_by_itself_and_on_sigterm(tmp_path, ending):
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        seconds = 3 if ending == "deadline" else 600
        (tmp_path / "recipe.yaml").write_text(SILENT_DISPATCHER_RECIPE.format(port=port, seconds=seconds))
        code, err, ended_after_signal = run_waiting(
            ["-m", "tfopt.cli", "run", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "run")],
            env=child_environment(),
            sigterm_once=(lambda: _connected_to(port)) if ending == "sigterm" else None,
        )
    assert "Traceback" not in err and "may be a bug" not in err
    if ending == "deadline":
        assert code == 1, err
        assert f"the dispatcher at grpc://127.0.0.1:{port} accepted the connection but did not answer within 3 s" in err
        assert "waiting for the tf.data service dispatcher" in err  # said when the wait began
    else:
        assert code == 128 + signal.SIGTERM, err
        assert ended_after_signal < 5
        assert "interrupted (SIGTERM)" in err


def _connected_to(port):
    """Whether a process has a TCP connection open to 127.0.0.1:`port` (the run is waiting for an answer)."""
    import psutil

    return any(
        connection.raddr and connection.raddr.port == port and connection.status == psutil.CONN_ESTABLISHED
        for connection in psutil.net_connections("tcp")
    )


def test_a_training_worker_whose_chief_never_registers_fails_at_the_deadline(in_process_service, monkeypatch):
    import json

    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    dataset = tf.data.Dataset.range(96).batch(6)
    offload, _ = plan_offload(dataset, dispatcher=in_process_service, job_name="never-registered")
    offload = dataclasses.replace(offload, start_timeout_seconds=1.0)
    started = time.monotonic()
    with pytest.raises(DataError) as raised:
        serve(dataset, offload, in_process_service, batch_size=6)
    waited = time.monotonic() - started
    assert waited >= 1.0 and waited < 30, waited
    assert str(raised.value).startswith(
        f"data_service: no pipeline was registered as 'never-registered' at {in_process_service} within 1 s "
        "(data_service.start_timeout_seconds; "
    )


def test_worker_processes_that_do_not_serve_in_time_are_stopped_and_named():
    from tfopt.data.service_servers import LocalCluster

    with pytest.raises(DistributionError) as raised:  # a worker process takes seconds to import TensorFlow
        LocalCluster(1, start_timeout_seconds=0.1)
    said = re.match(
        r"data_service: the tf.data service worker process for 127\.0\.0\.1:(\d+) did not serve within 0\.1 s "
        r"\(data_service\.start_timeout_seconds: raise it on a busy host\)",
        str(raised.value),
    )
    assert said, str(raised.value)
    assert wait_gone(processes_with("data-service", "worker", "--port", said.group(1)), 10) == []


def test_two_training_workers_share_one_job(in_process_service, monkeypatch):
    """The chief registers the pipeline; the other training worker reads it by id: one stream shared out,
    not a whole pass each. An epoch is a window of that stream: the workers make the next pass's batches
    before the last ones of this pass are read, so a small dataset's epoch holds some elements twice and
    misses as many (separate jobs would give each of the first 48 elements exactly twice)."""
    import json

    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    dataset = tf.data.Dataset.range(96).map(lambda i: i * 10).batch(6)  # 16 batches: 8 per training worker
    offload, _ = plan_offload(dataset, dispatcher=in_process_service)
    served = []
    for index in (0, 1):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        served.append(serve(dataset, offload, in_process_service, batch_size=6))
    assert [int(data.cardinality()) for data in served] == [8, 8]
    chief, other = (iter(data) for data in served)
    seen = []
    for _ in range(8):  # as the two training processes would, step by step
        seen += next(chief).numpy().tolist() + next(other).numpy().tolist()
    assert len(seen) == 96 and set(seen) <= set(range(0, 960, 10))
    assert len(set(seen)) > 48 and max(seen.count(value) for value in seen) <= 2


@pytest.mark.slow
def test_local_cluster_workers_are_processes_that_serve_and_leave_nothing_behind():
    from tfopt.data.service_servers import LocalCluster

    dataset = tf.data.Dataset.range(200).map(lambda i: i * 2).batch(10)
    offload, _ = plan_offload(dataset, workers=2)
    with LocalCluster(workers=2) as cluster:
        pids = cluster.worker_pids
        assert len(pids) == 2 and all(alive(pid) for pid in pids) and os.getpid() not in pids
        served = serve(dataset, offload, cluster.target, batch_size=10)
        assert elements(served) == elements(dataset)
    assert wait_gone(pids, seconds=15) == []


@pytest.mark.slow
def test_one_worker_serves_the_local_pipeline_exactly_and_a_killed_one_replays_its_pass():
    """Sharding off: the local batches in the local order; a worker killed mid-epoch is started again and
    serves the pass from its start, so the epoch keeps its steps, with the elements read before the kill twice
    and as many from the end of the pass not at all."""
    from tfopt.data.service_servers import LocalCluster

    dataset = (
        tf.data.Dataset.range(1000)
        .map(lambda i: i + tf.cast(tf.reduce_sum(tf.random.uniform([5000])) * 0, tf.int64))
        .batch(10)
    )
    offload, _ = plan_offload(dataset, workers=1)
    assert offload.sharding == "off"
    with LocalCluster(workers=1) as cluster:
        served = serve(dataset, offload, cluster.target, batch_size=10)
        assert [batch.numpy().tolist() for batch in served] == [batch.numpy().tolist() for batch in dataset]
        seen = []
        for step, batch in enumerate(served):
            seen += batch.numpy().tolist()
            if step == 20:
                os.kill(cluster.worker_pids[0], signal.SIGKILL)
        assert step + 1 == 100 and len(seen) == 1000 and set(range(210)) <= set(seen) <= set(range(1000))
        assert cluster.restarts and 210 <= len(seen) - len(set(seen)) < 1000  # the replayed start


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_is_restarted_and_training_goes_on(caplog):
    from tfopt.data.service_servers import LocalCluster

    dataset = (
        tf.data.Dataset.range(2000)
        .map(lambda i: i + tf.cast(tf.reduce_sum(tf.random.uniform([5000])) * 0, tf.int64))
        .batch(10)
    )
    offload, _ = plan_offload(dataset, workers=2)
    with LocalCluster(workers=2) as cluster:
        served = serve(dataset, offload, cluster.target, batch_size=10)
        killed = cluster.worker_pids[0]
        seen = []
        for step, batch in enumerate(served):
            seen += batch.numpy().tolist()
            if step == 20:
                os.kill(killed, signal.SIGKILL)
        assert step + 1 == 200  # the epoch keeps its steps (a short pass is filled from the next one)
        # Missing: what the dead worker had taken and not delivered; their places go to the next pass's first
        # elements, so an element comes at most twice.
        assert set(seen) <= set(range(2000)) and max(seen.count(value) for value in set(seen)) <= 2
        assert 2000 - 200 < len(set(seen)) <= len(seen) <= 2000
        assert cluster.restarts and cluster.restarts[0] == (cluster.worker_addresses[0], -signal.SIGKILL)
        assert killed not in cluster.worker_pids and all(alive(pid) for pid in cluster.worker_pids)
    assert "exited (code -9) and is started again at the same address" in caplog.text
    assert "missing from this pass" in caplog.text


REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
OFFLOADED_RECIPE = (
    "model: {name: small_cnn, filters: [4]}\n"
    "data: {source: synthetic, kind: image, examples: EXAMPLES, image_size: [8, 8], batch_size: 4}\n"
    "recipes: [data_pipeline, {data_service: {workers: 1}}]\n"
    "profile: {steps: 3, warmup_steps: 1}\n"
    "train: {epochs: EPOCHS}\n"
)


def processes_marked(marker: str) -> list[int]:
    """The live processes started with `marker` in their environment (a command and everything it started)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit() and alive(int(entry.name)):
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def start_command(*arguments, marker: str) -> subprocess.Popen:
    environment = child_environment(TFOPT_TEST_MARKER=marker)
    return subprocess.Popen(
        [sys.executable, "-m", "tfopt.cli", *map(str, arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPOSITORY,
        env=environment,
    )


@pytest.mark.slow
def test_a_run_offloaded_to_a_local_worker_reports_what_crossed_and_leaves_no_process(tmp_path):
    """`tfopt-recipe run` with `data_service: {workers: 1}`: measured, reported and trained through a worker
    process, which is gone when the command ends."""
    marker = f"offloaded-run-{uuid.uuid4()}"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(OFFLOADED_RECIPE.replace("EXAMPLES", "32").replace("EPOCHS", "1"))
    command = start_command("run", recipe, "--out", tmp_path / "run", "--quiet", marker=marker)
    try:
        output, _ = command.communicate(timeout=540)
        assert command.returncode == 0, output[-3000:]
        assert processes_marked(marker) == []  # the worker stopped with the run
    finally:
        command.kill()
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    step = next(step for step in report["applied"] if step["recipe"] == "data_service")
    assert not step["skipped"] and "1 tf.data service worker process on this host" in step["detail"]
    after, before = report["runs"]["after"], report["runs"]["before"]
    # 4 images of 8x8x3 float32 and 4 int labels per batch, at the measured steps/s
    assert after["service_mib_per_second"] == pytest.approx(
        4 * (8 * 8 * 3 * 4 + 4) * after["steps_per_second"] / 2**20, rel=0.01
    )
    assert (
        before["service_mib_per_second"] is None
        and "from tf.data service workers (MiB/s)" in (tmp_path / "run" / "report.md").read_text()
    )
    assert json.loads((tmp_path / "run" / "training.json").read_text())["global_step"] == 8


@pytest.mark.slow
def test_sigterm_to_an_offloaded_run_stops_its_workers(tmp_path):
    marker = f"offloaded-sigterm-{uuid.uuid4()}"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(OFFLOADED_RECIPE.replace("EXAMPLES", "4000").replace("EPOCHS", "100"))
    command = start_command("run", recipe, "--out", tmp_path / "run", "--quiet", marker=marker)
    workers = []
    try:
        deadline = time.monotonic() + 300
        while not (workers and (tmp_path / "run" / "checkpoints").exists()):  # measured, training from the worker
            assert command.poll() is None and time.monotonic() < deadline, command.stdout.read()[-3000:]
            time.sleep(0.2)
            workers = [pid for pid in processes_marked(marker) if pid != command.pid]
        command.send_signal(signal.SIGTERM)
        assert command.wait(timeout=60) == 143
        assert "interrupted (SIGTERM)" in command.stdout.read()
        assert wait_gone(workers, seconds=30) == [] and processes_marked(marker) == []
    finally:
        kill_all(command, workers)


@pytest.mark.slow
def test_the_command_line_servers_serve_a_pipeline_log_it_and_stop_on_sigterm():
    """`tfopt-recipe data-service dispatcher` and `... worker`, as a pod or a Slurm task runs them."""
    from tfopt.distribute.launcher import free_ports

    marker = f"servers-{uuid.uuid4()}"
    dispatcher_port, worker_port = free_ports(2)
    dispatcher = start_command(
        "data-service", "dispatcher", "--port", dispatcher_port, "--report-every", "1s", marker=marker
    )
    worker = start_command(
        "data-service",
        "worker",
        "--dispatcher",
        f"127.0.0.1:{dispatcher_port}",
        "--port",
        worker_port,
        "--address",
        f"127.0.0.1:{worker_port}",
        "--report-every",
        "1s",
        marker=marker,
    )
    lines = {dispatcher: [], worker: []}
    try:

        def read_until(server, words):
            for line in server.stdout:
                lines[server].append(line)
                if words in line:
                    return line
            raise AssertionError("".join(lines[server])[-3000:])

        assert "dispatcher serving at grpc://" in read_until(dispatcher, "serving")
        assert f"worker serving at 127.0.0.1:{worker_port}" in read_until(worker, "serving")
        dataset = tf.data.Dataset.range(300).map(lambda i: i * 3).batch(10)
        target = f"grpc://127.0.0.1:{dispatcher_port}"
        offload, _ = plan_offload(dataset, dispatcher=target)
        assert elements(serve(dataset, offload, target, batch_size=10)) == elements(dataset)
        assert "cores busy" in read_until(dispatcher, "1 workers registered")
        assert "MiB/s over the last 1 s" in read_until(worker, "cores busy")
        for server in (worker, dispatcher):
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=60) == 0
            assert "stopped" in "".join(lines[server]) + server.stdout.read()
        assert processes_marked(marker) == []
    finally:
        for server in (worker, dispatcher):
            server.kill()
            server.wait(timeout=30)


KILLED_TRAINING = """
import tensorflow as tf

from tfopt.data.service import plan_offload
from tfopt.data.service_client import serve
from tfopt.data.service_servers import LocalCluster

dataset = tf.data.Dataset.range(10**6).map(lambda i: i * 2).batch(10)
offload, _ = plan_offload(dataset, workers=2)  # dynamic sharding: the worker asks this process for every split
cluster = LocalCluster(1)
for step, _ in enumerate(serve(dataset, offload, cluster.target, batch_size=10)):
    if step == 20:
        print(*cluster.worker_pids, flush=True)
"""


@pytest.mark.slow
def test_the_workers_of_a_training_process_killed_while_it_reads_end_within_seconds():
    """SIGKILL leaves no `close()`: the kernel sends each worker SIGTERM, and on TF 2.21 its server's stop
    then hung (holding the GIL) in pipeline threads that retried their split requests to the dead dispatcher,
    still listening 75 s later. The stop is bounded by `STOP_SECONDS`."""
    from tfopt.data.service_servers import STOP_SECONDS

    training = subprocess.Popen(
        [sys.executable, "-c", KILLED_TRAINING], stdout=subprocess.PIPE, text=True, env=child_environment()
    )
    workers = []
    try:
        workers = [int(pid) for pid in training.stdout.readline().split()]
        assert workers and all(alive(pid) for pid in workers)
        training.kill()
        training.wait(timeout=30)
        assert wait_gone(workers, seconds=STOP_SECONDS + 5) == []
    finally:
        kill_all(training, workers)


def test_a_worker_says_it_registers_and_fails_where_no_dispatcher_answers():
    """TensorFlow's registration retries for ever, silently; the command says what it waits for and fails at
    its deadline, as a training run does."""
    from tfopt.distribute.launcher import free_ports

    port = free_ports(1)[0]
    finished = subprocess.run(
        [sys.executable, "-m", "tfopt.cli", "data-service", "worker", "--dispatcher", f"127.0.0.1:{port}"]
        + ["--dispatcher-timeout", "1s"],
        capture_output=True,
        text=True,
        env=child_environment(),
        timeout=120,
    )
    assert finished.returncode == 1
    assert f"registering with the dispatcher at 127.0.0.1:{port} (waiting up to 1 s" in finished.stdout
    assert finished.stderr.strip() == (
        f"tfopt-recipe: error: data_service: no dispatcher answered at 127.0.0.1:{port} within 1 s (Connection "
        "refused). Start it (tfopt-recipe data-service dispatcher --port PORT), correct --dispatcher, or wait "
        "longer with --dispatcher-timeout."
    )


def test_a_worker_that_tensorflow_holds_registering_ends_on_sigterm():
    """A dispatcher that answers HTTP/2 and never the registration: TensorFlow retries it in C++ holding the
    GIL, where no Python handler runs, so SIGTERM takes its default action there and ends the process."""
    import socket
    import threading

    connections, registering = [], threading.Event()

    def answer_settings_only(listener):
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            connections.append(connection)
            connection.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # an empty SETTINGS frame: gRPC's first words
            greeting = b""  # the HTTP/2 preface (24 bytes), then the length of the client's SETTINGS frame
            while len(greeting) < 27 and (received := connection.recv(27 - len(greeting))):
                greeting += received
            if greeting[24:] not in (b"", b"\x00\x00\x00"):  # settings of its own: gRPC's client, not tfopt's check
                registering.set()

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        threading.Thread(target=answer_settings_only, args=(listener,), daemon=True).start()
        worker = subprocess.Popen(
            [sys.executable, "-m", "tfopt.cli", "data-service", "worker"]
            + ["--dispatcher", f"127.0.0.1:{listener.getsockname()[1]}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=child_environment(),
        )
        try:
            assert registering.wait(timeout=60)
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=5) == -signal.SIGTERM
        finally:
            worker.kill()
            worker.wait(timeout=30)
            for connection in connections:
                connection.close()


@pytest.mark.parametrize("server", [["dispatcher"], ["worker", "--dispatcher", "127.0.0.1:1"]])
def test_a_server_on_a_taken_port_names_the_port_and_the_option(server):
    import socket

    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        finished = subprocess.run(
            [sys.executable, "-m", "tfopt.cli", "data-service", *server, "--port", str(port)],
            capture_output=True,
            text=True,
            env=child_environment(),
            timeout=120,
        )
    assert finished.returncode == 1
    assert finished.stderr.strip() == (
        f"tfopt-recipe: error: Port {port} is taken (Address already in use): another process listens on it. "
        f"Choose another with --port, or stop that process (`ss -ltnp 'sport = :{port}'` shows which)."
    )


def test_the_recipe_settings_say_what_is_wrong():
    from tfopt.errors import RecipeConfigError
    from tfopt.recipes import DataService

    assert DataService().workers == 1 and DataService(dispatcher="10.0.0.5:5050").workers is None
    with pytest.raises(RecipeConfigError, match="not both") as both:
        DataService(dispatcher="grpc://10.0.0.5:5050", workers=2)
    assert both.value.setting == "dispatcher"
    with pytest.raises(RecipeConfigError, match=r"is not an address. Expected grpc://host:port") as address:
        DataService(dispatcher="data-dispatcher")
    assert address.value.setting == "dispatcher"
    with pytest.raises(RecipeConfigError, match="compression='zstd' is not valid"):
        DataService(compression="zstd")
    for setting in ("answer_timeout_seconds", "start_timeout_seconds"):
        for seconds in (0, 3601, True, "10"):
            with pytest.raises(RecipeConfigError, match=f"{setting}=.* must be a number of seconds above 0") as wait:
                DataService(**{setting: seconds})
            assert wait.value.setting == setting
