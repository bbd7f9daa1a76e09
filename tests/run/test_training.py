"""tfopt.run.training under tfopt.Monitor: windows sized to the run, numbered on through a resume, kept
through a failure, written by the chief alone."""

from __future__ import annotations

import json
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.errors import TfoptError
from tfopt.hardware import Hardware
from tfopt.profiling.monitor import MIN_WINDOW_STEPS
from tfopt.run.training import WINDOWS_PER_RUN, _monitor, train_model


def built(fail_from_batch=None):
    """A tiny model and a stream of 4-feature batches of 8, as `tfopt.builder.build` returns them; batch
    `fail_from_batch` fails as a broken disk would."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    features = np.random.default_rng(0).random((64, 4), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((features, features[:, :1])).batch(8)
    if fail_from_batch is not None:

        def check(index):
            if index >= fail_from_batch:
                raise OSError("the disk went away")
            return index

        def load(index, batch):
            with tf.control_dependencies([tf.numpy_function(check, [index], tf.int64)]):
                return tf.nest.map_structure(tf.identity, batch)

        dataset = tf.data.Dataset.zip(tf.data.Dataset.range(10_000), dataset.repeat()).map(load)
    return SimpleNamespace(
        model=model,
        dataset=dataset,
        strategy=tf.distribute.get_strategy(),
        plan=SimpleNamespace(strategy="default", hardware=Hardware(), micro_batches=1),
    )


def recipe(epochs, steps_per_epoch):
    return SimpleNamespace(
        train=SimpleNamespace(epochs=epochs, steps_per_epoch=steps_per_epoch, checkpoint_every_steps=100)
    )


def windows_in(path):
    return [line for line in map(json.loads, path.read_text().splitlines()) if line["kind"] == "window"]


@pytest.mark.parametrize(
    "epochs, steps_per_epoch, every_steps",
    [
        (30, 10, 300 // WINDOWS_PER_RUN),  # long enough: about 20 windows
        (2, 2, MIN_WINDOW_STEPS),  # 4 steps: never windows of one step
        (3, None, MIN_WINDOW_STEPS),  # one pass per epoch over the 8 batches: 24 steps
    ],
)
def test_windows_are_sized_to_the_run_with_a_floor(epochs, steps_per_epoch, every_steps):
    monitor = _monitor(built(), recipe(epochs, steps_per_epoch).train, None)
    assert monitor.every_steps == every_steps and monitor.logdir is None


def test_a_run_of_many_short_epochs_gets_its_windows(tmp_path):
    record = train_model(built(), recipe(25, 2), tmp_path, [], tensorboard_dir=tmp_path / "tensorboard")
    # 50 steps in epochs of 2: windows of 3 steps span the epochs' ends, after the untimed first step.
    assert [(window["step"], window["steps"]) for window in record["monitor"]] == [(1 + 3 * n, 3) for n in range(1, 17)]
    written = windows_in(tmp_path / "tensorboard" / "train" / "monitor.jsonl")
    assert [window["step"] for window in written] == [window["step"] for window in record["monitor"]]


def test_a_resumed_run_numbers_its_windows_on(tmp_path):
    first = train_model(built(), recipe(2, 6), tmp_path, [], tensorboard_dir=tmp_path / "tensorboard")
    resumed = train_model(built(), recipe(4, 6), tmp_path, [], tensorboard_dir=tmp_path / "tensorboard")
    assert resumed["resumed_from_step"] == 12
    # training.json keeps both attempts' windows: steps 4, 7, 10, then from 13 (untimed) on: 16, 19, 22.
    assert [window["step"] for window in first["monitor"]] == [4, 7, 10]
    assert [window["step"] for window in resumed["monitor"]] == [4, 7, 10, 16, 19, 22]
    saved = json.loads((tmp_path / "training.json").read_text())
    assert [window["step"] for window in saved["monitor"]] == [4, 7, 10, 16, 19, 22]


def test_a_failed_training_says_where_its_windows_are(tmp_path):
    model_and_data = built(fail_from_batch=20)
    with pytest.raises(TfoptError, match="the disk went away") as error:
        train_model(model_and_data, recipe(5, 10), tmp_path, [], tensorboard_dir=tmp_path / "tensorboard")
    path = tmp_path / "tensorboard" / "train" / "monitor.jsonl"
    windows = windows_in(path)
    # Step 21's batch failed: the windows to step 19 (of 3 steps, after the untimed first) were kept.
    assert [window["step"] for window in windows] == [4, 7, 10, 13, 16, 19]
    assert str(error.value).endswith(f"The 6 tfopt.Monitor window(s) recorded before it, to step 19, are in {path}.")
    assert not hasattr(model_and_data.model.train_function, "tfopt_original")


def test_only_the_chief_writes_the_monitor_files(tmp_path):
    record = train_model(built(), recipe(2, 6), tmp_path, [], tensorboard_dir=tmp_path / "tensorboard", chief=False)
    assert [window["step"] for window in record["monitor"]] == [4, 7, 10]
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "training.json").exists()


def test_a_run_resumed_after_a_failure_writes_each_steps_window_once(tmp_path):
    """The failed attempt's windows past its last checkpoint (its second epoch's end, step 20) are of steps the
    resumed one trains again: monitor.jsonl, like training.json, keeps only the new ones."""
    path = tmp_path / "tensorboard" / "train" / "monitor.jsonl"
    with pytest.raises(TfoptError, match="the disk went away"):
        train_model(built(fail_from_batch=27), recipe(3, 10), tmp_path, [], tensorboard_dir=tmp_path / "tensorboard")
    assert [window["step"] for window in windows_in(path)][-2:] == [22, 25]
    resumed = train_model(built(), recipe(3, 10), tmp_path, [], tensorboard_dir=tmp_path / "tensorboard")
    assert resumed["resumed_from_step"] == 20
    steps = [window["step"] for window in windows_in(path)]
    assert steps == [window["step"] for window in resumed["monitor"]] == sorted(set(steps))
    assert steps[-3:] == [24, 27, 30] and 22 not in steps


def test_a_record_a_kill_cut_short_neither_joins_the_next_nor_stops_the_resume(tmp_path):
    from tfopt.profiling.monitor import _RecordWriter
    from tfopt.run.training import _keep_records_to

    path = tmp_path / "monitor.jsonl"
    path.write_text('{"kind": "window", "step": 4}\n{"kind": "window", "st')
    writer = _RecordWriter(tmp_path)
    writer.write({"kind": "start", "step": 6})  # the resumed attempt's first record, before the trim
    writer.close()
    _keep_records_to(path, 6)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [4, 6]
