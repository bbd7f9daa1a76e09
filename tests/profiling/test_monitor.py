"""tfopt.Monitor on a tiny model and generated data: windows, syncs, outputs, alerts, CPU and strategy."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import FAKE_HARDWARE
from tests.processes import child_environment
from tfopt.errors import RecipeConfigError
from tfopt.hardware import Hardware
from tfopt.profiling import monitor as monitor_module
from tfopt.profiling.alerts import AlertRules
from tfopt.profiling.metrics import CPU_NOTE
from tfopt.profiling.monitor import Monitor
from tfopt.profiling.peak_flops import peak_flops_per_second, precision_in_use
from tfopt.profiling.timing import read_loss

HERE = Path(__file__).resolve().parent
BATCH = 32
FEATURES = 16
KEYS = {"tfopt/steps_per_second", "tfopt/examples_per_second", "tfopt/input_wait_percent"}


def make_model(width=16, hidden=1, optimizer=None, **compile_kwargs):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            *[keras.layers.Dense(width, activation="relu") for _ in range(hidden)],
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.01), loss="mse", **compile_kwargs)
    return model


def finite_dataset(batches, *, last=BATCH, drop_remainder=False):
    """`batches` batches of BATCH examples, the last one of `last`: a length Keras knows."""
    features = np.random.default_rng(0).random(((batches - 1) * BATCH + last, FEATURES), dtype=np.float32)
    return tf.data.Dataset.from_tensor_slices((features, features[:, :1])).batch(BATCH, drop_remainder=drop_remainder)


class TracedTrainStep(keras.Sequential):
    """Counts the traces of its train step."""

    traces = 0

    def train_step(self, data):
        type(self).traces += 1
        return super().train_step(data)


def steady_dataset():
    features = np.random.default_rng(0).random((256, FEATURES), dtype=np.float32)
    return tf.data.Dataset.from_tensor_slices((features, features[:, :1])).batch(BATCH).cache().repeat().prefetch(8)


def generated_dataset(*, slow_from_batch=None, sleep_seconds=0.05, fail_from_batch=None):
    """Batches generated from their index by graph ops; from batch `slow_from_batch` on each one takes
    `sleep_seconds` in Python, and batch `fail_from_batch` fails as a broken disk would."""

    def load(index):
        if fail_from_batch is not None and index >= fail_from_batch:
            raise OSError("the disk went away")
        time.sleep(sleep_seconds)
        return index

    first_in_python = min(index for index in (slow_from_batch, fail_from_batch) if index is not None)

    def batch(index):
        # Python only from then on: the steady part's batches need not wait for Python's lock.
        index = tf.cond(index >= first_in_python, lambda: tf.numpy_function(load, [index], tf.int64), lambda: index)
        features = tf.random.stateless_uniform((BATCH, FEATURES), seed=tf.stack([index, index * 0]))
        return features, features[:, :1]

    return tf.data.Dataset.range(10_000).map(batch).prefetch(8)


class CountingSync:
    def __init__(self):
        self.calls = 0

    def __call__(self, logs):
        self.calls += 1
        read_loss(logs)


class SteppedClock(keras.callbacks.Callback):
    """The Monitor's `time.perf_counter`, faked: 1 s per training step, 100 s for each validation and each
    epoch's end, so a window's seconds say exactly which time it counted."""

    def __init__(self):
        super().__init__()
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def on_train_batch_begin(self, batch, logs=None):
        self.now += 1.0

    def on_test_end(self, logs=None):
        self.now += 100.0

    def on_epoch_end(self, epoch, logs=None):
        self.now += 100.0


class FailAtStep(keras.callbacks.Callback):
    """Another callback that raises after a training step, outside the Monitor's wrapper."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.step:
            raise RuntimeError("a callback failed")


def jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def scalars(logdir):
    """Every scalar in the event files under `logdir`: {tag: [(step, value), ...]}."""
    found = {}
    for path in Path(logdir).glob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                if not value.tag.startswith("tfopt/"):
                    continue  # Keras' TensorBoard writes its model config there too
                found.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return {tag: sorted(values) for tag, values in found.items()}


def test_windows_scalars_logs_and_jsonl(tmp_path):
    sync = CountingSync()
    # Alerts need 5 windows in a row, more than this run has: on a loaded machine the steady dataset can read as
    # starved (an input_wait alert line), which is not what this test checks.
    monitor = Monitor(logdir=tmp_path, every_steps=5, alert_windows=5, sync=sync, hardware=Hardware())
    csv = tmp_path / "log.csv"
    model = make_model()
    history = model.fit(
        steady_dataset(),
        epochs=1,
        steps_per_epoch=21,
        verbose=0,
        callbacks=[monitor, keras.callbacks.CSVLogger(str(csv))],
    )
    windows = monitor.records_of("window")
    # Step 1 (tracing) is never timed: windows close at steps 6, 11, 16, 21, one sync each plus the start.
    assert [window["step"] for window in windows] == [6, 11, 16, 21]
    assert sync.calls == len(windows) + 1
    for window in windows:
        assert window["steps"] == 5
        assert window["steps_per_second"] == pytest.approx(5 / window["seconds"])
        assert window["examples_per_second"] == pytest.approx(BATCH * window["steps_per_second"])
        assert 0 <= window["input_wait_percent"] < 100
    written = scalars(tmp_path)
    for name in ("steps_per_second", "examples_per_second", "input_wait_percent"):
        assert [step for step, _ in written[f"tfopt/{name}"]] == [w["step"] for w in windows]
        assert [value for _, value in written[f"tfopt/{name}"]] == pytest.approx([w[name] for w in windows], rel=1e-6)
    # The epoch's logs carry the mean of its windows: History, the progress bar and CSVLogger show them.
    assert set(history.history) >= KEYS
    mean_rate = np.mean([window["examples_per_second"] for window in windows])
    assert history.history["tfopt/examples_per_second"][0] == pytest.approx(mean_rate)
    assert set(csv.read_text().splitlines()[0].split(",")) >= KEYS
    lines = jsonl(tmp_path / "monitor.jsonl")
    assert [line["kind"] for line in lines] == ["start"] + ["window"] * 4
    assert lines[1]["examples_per_second"] == pytest.approx(windows[0]["examples_per_second"])
    assert not hasattr(model.train_function, "tfopt_original")  # fit's own train function is back


def test_epochs_before_the_first_window_carry_nan_so_every_column_is_kept(tmp_path):
    csv = tmp_path / "log.csv"
    history = make_model().fit(
        steady_dataset(),
        epochs=4,
        steps_per_epoch=3,
        verbose=0,
        callbacks=[Monitor(every_steps=5, hardware=Hardware()), keras.callbacks.CSVLogger(str(csv))],
    )
    rates = history.history["tfopt/examples_per_second"]
    assert len(rates) == len(history.history["loss"]) == 4
    assert np.isnan(rates[0]) and not np.isnan(rates[-1])  # the first window closes at step 6, in epoch 2
    assert set(csv.read_text().splitlines()[0].split(",")) >= KEYS


def test_monitor_does_not_change_training():
    plain, monitored = make_model(), make_model()
    plain.fit(steady_dataset(), epochs=2, steps_per_epoch=6, verbose=0)
    monitored.fit(steady_dataset(), epochs=2, steps_per_epoch=6, verbose=0, callbacks=[Monitor(every_steps=2)])
    for got, want in zip(monitored.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


class PerExampleLoss(keras.Sequential):
    """Returns its loss unreduced, one value per example: Keras takes such logs as they are."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.losses.mean_squared_error(y, self(x, training=True))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
        return {"loss": loss}


class NestedLogs(keras.Sequential):
    """Returns its logs in a dict of dicts, which Keras flattens."""

    def train_step(self, data):
        return {"losses": super().train_step(data)}


@pytest.mark.parametrize("kind", [PerExampleLoss, NestedLogs], ids=lambda kind: kind.__name__)
def test_logs_that_keras_takes_are_taken_and_train_as_without_the_monitor(kind):
    def fitted(callbacks):
        keras.utils.set_random_seed(0)
        model = kind([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        model.fit(steady_dataset(), epochs=2, steps_per_epoch=4, verbose=0, callbacks=callbacks)
        return model.get_weights()

    monitor = Monitor(every_steps=3)
    for got, want in zip(fitted([monitor]), fitted([])):
        np.testing.assert_array_equal(got, want)
    assert [record["step"] for record in monitor.records_of("window")] == [4, 7]


class Noisy(keras.layers.Layer):
    """Adds noise from a stateful TensorFlow random op, as keras.io's GAN adds it to its labels."""

    def call(self, x, training=False):
        return x + 0.1 * tf.random.uniform(tf.shape(x)) if training else x


def test_a_second_fit_draws_a_stateful_random_op_on_as_without_the_monitor():
    def fitted(callbacks):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((FEATURES,)), Noisy(), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        losses = []
        for _ in range(2):  # a notebook cell run twice, or training in stages
            losses += model.fit(finite_dataset(4), epochs=1, verbose=0, callbacks=callbacks).history["loss"]
        return losses, model.get_weights()

    (plain_losses, plain), (losses, weights) = fitted([]), fitted([Monitor(every_steps=2)])
    assert losses == plain_losses
    for got, want in zip(weights, plain):
        np.testing.assert_array_equal(got, want)


def test_a_short_last_batch_traces_the_train_step_no_more_than_fit_does():
    def traces(callbacks):
        TracedTrainStep.traces = 0
        keras.utils.set_random_seed(0)
        model = TracedTrainStep([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(finite_dataset(4, last=8), epochs=2, verbose=0, callbacks=callbacks)
        return TracedTrainStep.traces

    # Keras traces its one-step function for the iterator's spec (batch dimension None): a batch of 8
    # after the batches of 32 traces nothing again, with the Monitor as without it.
    assert traces([Monitor(every_steps=2, hardware=Hardware())]) == traces([])


def test_monitor_trains_data_of_unknown_length_as_fit_does():
    """Keras' call on the spent iterator at each epoch's end adds one to Adam's `iterations` without XLA
    (which its bias correction reads): the Monitor makes the same call, so training is the same."""
    features = np.random.default_rng(0).random((48, FEATURES), dtype=np.float32)
    unknown = tf.data.Dataset.from_tensor_slices((features, features[:, :1])).filter(lambda x, y: x[0] > 0.2).batch(8)
    assert unknown.cardinality() == tf.data.UNKNOWN_CARDINALITY

    def train(callbacks):
        model = make_model(optimizer=keras.optimizers.Adam(0.01), jit_compile=False)
        history = model.fit(unknown, epochs=3, verbose=0, callbacks=callbacks)
        return model, history.history["loss"]

    (plain, plain_loss), (monitored, monitored_loss) = train([]), train([Monitor(every_steps=2, hardware=Hardware())])
    assert monitored_loss == plain_loss
    assert int(monitored.optimizer.iterations) == int(plain.optimizer.iterations)
    for got, want in zip(monitored.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(got, want)


def test_cpu_says_which_metrics_do_not_apply(caplog):
    monitor = Monitor(every_steps=3, hardware=FAKE_HARDWARE["cpu_bf16"])
    model = make_model()
    with caplog.at_level(logging.INFO, logger="tfopt"):
        history = model.fit(steady_dataset(), epochs=1, steps_per_epoch=7, verbose=0, callbacks=[monitor])
        model.fit(steady_dataset(), epochs=1, steps_per_epoch=7, verbose=0, callbacks=[monitor])
    start = monitor.records_of("start")[0]
    assert start["accelerator"] == "cpu" and start["note"] == CPU_NOTE
    assert start["not_applicable"] == ["mfu_percent", "device_memory_peak_bytes"]
    assert set(history.history) == {"loss", *KEYS}
    # Said once through the tfopt logger, however many fits the Monitor watches.
    (said,) = [record.getMessage() for record in caplog.records if "not measured" in record.getMessage()]
    assert said == (
        "tfopt.Monitor: not measured in this run: mfu_percent (no accelerator with a known peak "
        "FLOP/s); device_memory_peak_bytes (no GPU)."
    )


def test_windows_span_epochs_without_the_time_between_them(monkeypatch):
    clock = SteppedClock()
    monkeypatch.setattr(monitor_module, "time", clock)
    monitor = Monitor(every_steps=4, hardware=Hardware())
    features = np.zeros((2 * BATCH, FEATURES), dtype=np.float32)
    validation = tf.data.Dataset.from_tensor_slices((features, features[:, :1])).batch(BATCH)
    make_model().fit(
        steady_dataset(), epochs=3, steps_per_epoch=4, validation_data=validation, verbose=0, callbacks=[monitor, clock]
    )
    windows = monitor.records_of("window")
    # Epochs of 4 steps, windows of 4 after the untimed first step: 2-5 and 6-9 span an epoch's end, and
    # 10-12 is the window cut short by the end of fit (3 steps: kept).
    assert [(window["step"], window["steps"]) for window in windows] == [(5, 4), (9, 4), (12, 3)]
    # 1 s a step, 200 s at each epoch's end (validation, callbacks): the windows counted the steps alone.
    assert [window["seconds"] for window in windows] == [4.0, 4.0, 3.0]
    assert all(window["steps_per_second"] == 1.0 for window in windows)


def test_steps_count_on_from_the_optimizer_across_fit_calls(tmp_path):
    model = make_model()
    monitor = Monitor(logdir=tmp_path, every_steps=2, hardware=Hardware())
    for _ in range(2):  # as tfopt.training.train does when it resumes mid-epoch
        model.fit(steady_dataset(), epochs=1, steps_per_epoch=6, verbose=0, callbacks=[monitor])
    # Each fit's first step is untimed (1, 7) and its last 1-step window dropped (6, 12).
    assert [record["step"] for record in monitor.records_of("start")] == [0, 6]
    assert [window["step"] for window in monitor.records_of("window")] == [3, 5, 9, 11]
    assert [step for step, _ in scalars(tmp_path)["tfopt/steps_per_second"]] == [3, 5, 9, 11]


def test_a_short_fit_keeps_its_cut_short_window_and_a_shorter_one_warns_once(caplog):
    monitor = Monitor(hardware=Hardware())  # 30-second windows: none fills in a few steps
    model = make_model()
    with caplog.at_level(logging.WARNING, logger="tfopt"):
        model.fit(steady_dataset(), epochs=2, steps_per_epoch=4, verbose=0, callbacks=[monitor])
        for _ in range(2):
            model.fit(steady_dataset(), epochs=1, steps_per_epoch=3, verbose=0, callbacks=[monitor])
    assert [(window["step"], window["steps"]) for window in monitor.records_of("window")] == [(8, 7)]
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2 and "no logdir or tensorboard given" in said[0]  # where its numbers go, once
    warning = said[1]
    assert warning.startswith("tfopt.Monitor recorded no window in this fit: it trained 3 step(s), to step 11")
    assert "every_steps=" in warning


def test_a_step_that_raises_closes_the_monitor_and_keeps_its_windows(tmp_path):
    model = make_model()
    monitor = Monitor(logdir=tmp_path, every_steps=2, hardware=Hardware())
    with pytest.raises(tf.errors.OpError, match="the disk went away"):
        model.fit(generated_dataset(fail_from_batch=7), epochs=1, steps_per_epoch=10, verbose=0, callbacks=[monitor])
    assert not hasattr(model.train_function, "tfopt_original")  # Keras' own function is back
    assert [line["step"] for line in jsonl(tmp_path / "monitor.jsonl") if line["kind"] == "window"] == [3, 5, 7]
    assert [step for step, _ in scalars(tmp_path)["tfopt/steps_per_second"]] == [3, 5, 7]


def test_an_error_in_another_callback_ends_the_monitor_at_the_next_fit_or_at_close():
    model = make_model()
    monitor = Monitor(every_steps=2, hardware=Hardware())
    with pytest.raises(RuntimeError, match="a callback failed"):
        model.fit(steady_dataset(), epochs=1, steps_per_epoch=10, verbose=0, callbacks=[monitor, FailAtStep(6)])
    assert model.train_function.tfopt_monitor is monitor  # Keras called no callback on its way out
    windows = monitor.records_of("window")
    model.fit(steady_dataset(), epochs=1, steps_per_epoch=4, verbose=0)  # no Monitor this time
    assert not hasattr(model.train_function, "tfopt_original")
    assert monitor.records_of("window") == windows  # the dead Monitor timed none of the plain fit's steps

    other = Monitor(every_steps=2, hardware=Hardware())
    with pytest.raises(RuntimeError, match="a callback failed"):
        model.fit(steady_dataset(), epochs=1, steps_per_epoch=10, verbose=0, callbacks=[other, FailAtStep(6)])
    other.close()
    assert not hasattr(model.train_function, "tfopt_original")


def test_a_tensorboard_callback_given_writes_into_its_train_run(tmp_path):
    board = keras.callbacks.TensorBoard(str(tmp_path))
    monitor = Monitor(tensorboard=board, every_steps=4, hardware=Hardware())
    make_model().fit(steady_dataset(), epochs=1, steps_per_epoch=9, verbose=0, callbacks=[monitor, board])
    assert monitor.logdir == tmp_path / "train"
    assert [step for step, _ in scalars(tmp_path / "train")["tfopt/steps_per_second"]] == [5, 9]
    assert (tmp_path / "train" / "monitor.jsonl").is_file()


def test_a_tensorboard_callback_that_writes_every_n_steps_does_not_gate_the_monitors_scalars(tmp_path):
    """Keras' TensorBoard(update_freq=N) leaves record_if(step % N == 0) in force for the whole fit."""
    board = keras.callbacks.TensorBoard(str(tmp_path), update_freq=100)
    monitor = Monitor(tensorboard=board, every_steps=4, hardware=Hardware())
    make_model().fit(steady_dataset(), epochs=1, steps_per_epoch=9, verbose=0, callbacks=[monitor, board])
    assert [step for step, _ in scalars(tmp_path / "train")["tfopt/steps_per_second"]] == [5, 9]


WITHOUT_TENSORBOARD = """
import sys
sys.modules["tensorboard"] = None  # TensorFlow 2.21 does not install it: importing it fails
import keras, numpy as np, tensorflow as tf
from tfopt.hardware import Hardware
from tfopt.profiling.monitor import Monitor

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
data = tf.data.Dataset.from_tensor_slices((np.ones((64, 4), "float32"), np.ones((64, 1), "float32"))).batch(8)
monitor = Monitor(logdir=sys.argv[1], every_steps=3, hardware=Hardware())
model.fit(data.repeat(), epochs=1, steps_per_epoch=7, verbose=0, callbacks=[monitor])
print("WINDOWS", len(monitor.records_of("window")))
"""


@pytest.mark.slow
def test_the_monitor_writes_its_scalars_without_the_tensorboard_package(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-c", WITHOUT_TENSORBOARD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_environment(),
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "WINDOWS 2" in completed.stdout
    assert [step for step, _ in scalars(tmp_path)["tfopt/steps_per_second"]] == [4, 7]


def test_a_monitor_with_no_destination_says_once_where_its_numbers_go(tmp_path, caplog):
    """Added as a Keras user adds callbacks, beside a TensorBoard it was not given: it says once, as training
    starts, where its numbers go and the argument that puts them into that TensorBoard's log."""
    monitor = Monitor(every_steps=4, hardware=Hardware())
    board = keras.callbacks.TensorBoard(str(tmp_path))
    model = make_model()
    with caplog.at_level(logging.WARNING, logger="tfopt"):
        for _ in range(2):
            model.fit(steady_dataset(), epochs=1, steps_per_epoch=5, verbose=0, callbacks=[board, monitor])
    said = [record.getMessage() for record in caplog.records if "no logdir or tensorboard given" in record.getMessage()]
    assert len(said) == 1 and "Monitor(tensorboard=board)" in said[0] and "monitor.records" in said[0]
    with caplog.at_level(logging.WARNING, logger="tfopt"):
        caplog.clear()
        model.fit(
            steady_dataset(),
            epochs=1,
            steps_per_epoch=5,
            verbose=0,
            callbacks=[Monitor(every_steps=4, hardware=Hardware(), tensorboard=board), board],
        )
    assert not [record for record in caplog.records if "no logdir" in record.getMessage()]


def test_a_tensorboard_callback_not_given_is_not_looked_for(tmp_path):
    monitor = Monitor(every_steps=4, hardware=Hardware())
    board = keras.callbacks.TensorBoard(str(tmp_path))
    make_model().fit(steady_dataset(), epochs=1, steps_per_epoch=9, verbose=0, callbacks=[monitor, board])
    assert monitor.logdir is None and len(monitor.records_of("window")) == 2
    assert "tfopt/steps_per_second" not in scalars(tmp_path / "train")


def test_mfu_and_memory_on_an_accelerator(monkeypatch):
    """The GPU path with the hardware faked: MFU from the counted FLOPs and the table's peak."""
    monkeypatch.setattr(monitor_module, "_visible_gpus", lambda: ["GPU:0"])
    monkeypatch.setattr(monitor_module, "_allocator_peak_bytes", lambda devices: 3 * 2**30)
    h100 = FAKE_HARDWARE["h100"]
    model = make_model(width=64)
    monitor = Monitor(every_steps=3, hardware=h100)
    model.fit(steady_dataset(), epochs=1, steps_per_epoch=7, verbose=0, callbacks=[monitor])
    peak = peak_flops_per_second(h100, precision_in_use(model, h100))
    # Dense 16->64->1 at batch 32: forward 2*32*(16*64 + 64) FLOPs; backward and update add more.
    assert monitor.flops_per_step > 2 * BATCH * (FEATURES * 64 + 64)
    assert monitor.records_of("start")[0]["not_applicable"] == []
    for window in monitor.records_of("window"):
        expected = 100 * monitor.flops_per_step * window["steps_per_second"] / peak
        assert window["mfu_percent"] == pytest.approx(expected)
        assert window["device_memory_peak_bytes"] == 3 * 2**30


def test_a_metric_that_cannot_be_read_is_dropped_and_training_goes_on(monkeypatch, caplog):
    # A GPU the process does not use (set_visible_devices) made get_memory_info raise at the first window.
    def unreadable(devices):
        raise ValueError("No matching devices found for 'GPU:1'")

    monkeypatch.setattr(monitor_module, "_visible_gpus", lambda: ["GPU:1"])
    monkeypatch.setattr(monitor_module, "_allocator_peak_bytes", unreadable)
    monkeypatch.setattr("tfopt.profiling.measurement.train_step_flops", lambda *args, **kwargs: 1 / 0)
    monitor = Monitor(every_steps=3, hardware=FAKE_HARDWARE["h100"])
    with caplog.at_level(logging.WARNING, logger="tfopt"):
        history = make_model().fit(steady_dataset(), epochs=1, steps_per_epoch=7, verbose=0, callbacks=[monitor])
    assert len(history.history["loss"]) == 1 and len(monitor.records_of("window")) == 2
    assert all("mfu_percent" not in w and "device_memory_peak_bytes" not in w for w in monitor.records_of("window"))
    dropped = [record.getMessage() for record in caplog.records if "not measured from here on" in record.getMessage()]
    assert len(dropped) == 2 and "GPU:1" in dropped[1] and "ZeroDivisionError" in dropped[0]


def test_steps_per_execution_counts_the_steps_each_call_ran(caplog):
    model = make_model(steps_per_execution=4)
    monitor = Monitor(every_steps=4, hardware=Hardware())
    with caplog.at_level(logging.INFO, logger="tfopt"):
        # 13 batches an epoch at 4 a call: calls of 4, 4, 4 and 1 step.
        model.fit(finite_dataset(13, last=8), epochs=3, verbose=0, callbacks=[monitor])
        model.fit(finite_dataset(4), epochs=1, verbose=0, callbacks=[monitor])
    assert int(model.optimizer.iterations) == 3 * 13 + 4
    windows = [(window["step"], window["steps"]) for window in monitor.records_of("window")]
    # Steps 1-4 (the first call) are untimed; 13 and 26 end an epoch's short call; 39 alone is too short to keep.
    assert windows == [(8, 4), (12, 4), (17, 5), (21, 4), (25, 4), (30, 5), (34, 4), (38, 4)]
    assert [start["step"] for start in monitor.records_of("start")] == [0, 39]
    # Batches of no static size: examples/s is not measured, and the Monitor says so once.
    assert not any("examples_per_second" in window for window in monitor.records_of("window"))
    (said,) = [record.getMessage() for record in caplog.records if "not measured in this fit" in record.getMessage()]
    assert said.startswith("tfopt.Monitor: not measured in this fit: examples_per_second (")
    assert "drop_remainder=True" in said


def test_steps_per_execution_counts_micro_batches_under_gradient_accumulation():
    optimizer = keras.optimizers.SGD(0.01, gradient_accumulation_steps=2)
    model = make_model(optimizer=optimizer, steps_per_execution=3)
    monitor = Monitor(every_steps=3, hardware=Hardware())
    for _ in range(2):
        model.fit(finite_dataset(8), epochs=1, verbose=0, callbacks=[monitor])
    # 16 micro-batches, 8 updates: the steps are the micro-batches, so the second fit counts on from 8.
    assert int(model.optimizer.iterations) == 8
    assert [start["step"] for start in monitor.records_of("start")] == [0, 8]
    assert [(window["step"], window["steps"]) for window in monitor.records_of("window")] == [(6, 3), (14, 3)]


def test_steps_per_execution_with_a_static_batch_measures_examples_and_mfu(monkeypatch):
    monkeypatch.setattr(monitor_module, "_visible_gpus", lambda: ["GPU:0"])
    monkeypatch.setattr(monitor_module, "_allocator_peak_bytes", lambda devices: 2**30)
    model = make_model(steps_per_execution=2)
    monitor = Monitor(every_steps=4, hardware=FAKE_HARDWARE["h100"])
    model.fit(finite_dataset(10, drop_remainder=True), epochs=1, verbose=0, callbacks=[monitor])
    windows = monitor.records_of("window")
    assert monitor.flops_per_step > 2 * BATCH * FEATURES  # counted on the dataset's spec
    assert windows and all(
        window["examples_per_second"] == pytest.approx(BATCH * window["steps_per_second"]) and "mfu_percent" in window
        for window in windows
    )


class OwnOptimizer(keras.Sequential):
    """A train_step that applies an optimizer of its own (as a GAN's does): the compiled one counts nothing."""

    def __init__(self, layers):
        super().__init__(layers)
        self.own_optimizer = keras.optimizers.SGD(0.01)

    def train_step(self, data):
        features, targets = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((self(features, training=True) - targets) ** 2)
        self.own_optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights), self.trainable_weights))
        return {"loss": loss}


def test_steps_per_execution_without_a_counting_optimizer_counts_whole_calls(caplog):
    model = OwnOptimizer([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile(steps_per_execution=4)
    monitor = Monitor(every_steps=4, hardware=Hardware())
    with caplog.at_level(logging.INFO, logger="tfopt"):
        model.fit(finite_dataset(8), epochs=2, verbose=0, callbacks=[monitor])
    assert int(model.own_optimizer.iterations) == 16 and int(model.optimizer.iterations) == 0
    assert [(window["step"], window["steps"]) for window in monitor.records_of("window")] == [(8, 4), (12, 4), (16, 4)]
    said = [record.getMessage() for record in caplog.records if "counted no step" in record.getMessage()]
    assert len(said) == 1 and "steps_per_execution=4" in said[0]


def test_steps_count_on_across_fit_calls_where_the_compiled_optimizer_never_steps(tmp_path):
    model = OwnOptimizer([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile()  # as a GAN's compile calls super().compile(): an optimizer its train_step never applies
    monitor = Monitor(logdir=tmp_path, every_steps=2, hardware=Hardware())
    for _ in range(2):
        model.fit(steady_dataset(), epochs=1, steps_per_epoch=6, verbose=0, callbacks=[monitor])
    assert int(model.optimizer.iterations) == 0
    assert [record["step"] for record in monitor.records_of("start")] == [0, 6]
    assert [window["step"] for window in monitor.records_of("window")] == [3, 5, 9, 11]


def test_steps_per_execution_leaves_input_wait_unmeasured():
    model = make_model()
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    monitor = Monitor(every_steps=4, hardware=Hardware())
    history = model.fit(steady_dataset(), epochs=1, steps_per_epoch=10, verbose=0, callbacks=[monitor])
    assert "input_wait_percent" in monitor.records_of("start")[0]["not_applicable"]
    windows = monitor.records_of("window")
    assert windows and all(w["steps"] == 4 and "input_wait_percent" not in w for w in windows)
    assert "tfopt/input_wait_percent" not in history.history


@pytest.mark.slow
def test_alert_when_the_pipeline_slows_mid_run(caplog):
    events = []
    monitor = Monitor(every_steps=4, alert_windows=3, on_alert=events.append, hardware=Hardware())
    with caplog.at_level(logging.WARNING, logger="tfopt"):
        # Steps of a few ms: in a 1 ms step, the eager fetch's own cost under load read 20-24% input wait.
        make_model(width=512, hidden=3).fit(
            generated_dataset(slow_from_batch=20), epochs=1, steps_per_epoch=45, verbose=0, callbacks=[monitor]
        )
    assert [event.kind for event in events] == ["input_wait"]  # one warning per episode, not per window
    assert [(record["kind"], record["alert"]) for record in monitor.records_of("alert")] == [("alert", "input_wait")]
    alert = events[0]
    assert alert.step > 20 and all(wait > 20 for wait in alert.values["input_wait_percent"])
    messages = [
        record.getMessage() for record in caplog.records if "tfopt.Monitor: training waited" in record.getMessage()
    ]
    assert len(messages) == 1 and "data_pipeline" in messages[0] and "tfopt-recipe diagnose" in messages[0]


@pytest.mark.slow
def test_no_alert_on_a_steady_pipeline():
    monitor = Monitor(every_steps=4, alert_windows=3, hardware=Hardware())
    make_model(width=2048, hidden=2).fit(steady_dataset(), epochs=1, steps_per_epoch=45, verbose=0, callbacks=[monitor])
    assert len(monitor.records_of("window")) == 11 and monitor.alerts == []


def test_alert_rules_mfu_drop_against_the_runs_median():
    rules = AlertRules(alert_windows=2, mfu_drop_fraction=0.3)

    def windows(values):
        return [
            {"step": 10 * (i + 1), "steps": 10, "steps_per_second": 5.0, "mfu_percent": value}
            for i, value in enumerate(values)
        ]

    assert rules.check(windows([40, 41, 39, 40, 27])) == []  # one low window is not enough
    (alert,) = rules.check(windows([40, 41, 39, 40, 27, 26]))
    assert alert.kind == "mfu_drop" and alert.values == {"mfu_percent": [27, 26], "median_percent": 40}
    assert "40.0%" in alert.message and "30%" in alert.message
    assert rules.check(windows([40, 41, 39, 40, 27, 26, 25])) == []  # the same episode alerts once


def test_input_wait_alerts_only_where_a_step_waits_beyond_the_fetchs_own_cost():
    def windows(step_seconds):
        return [
            {
                "step": 10 * (i + 1),
                "steps": 10,
                "seconds": 10 * step_seconds,
                "steps_per_second": 1 / step_seconds,
                "input_wait_percent": 36.0,
            }
            for i in range(3)
        ]

    assert AlertRules().check(windows(0.7e-3)) == []  # 0.25 ms a step: a loaded host's fetch
    (alert,) = AlertRules().check(windows(10e-3))
    assert alert.kind == "input_wait" and alert.values == {"input_wait_percent": [36.0] * 3}


def test_an_mfu_drop_alerts_from_the_sixth_window_at_the_defaults():
    """3 windows for the run's median (MFU_BASELINE_WINDOWS), then alert_windows=3 low ones (docs/monitoring.md)."""
    windows = [
        {"step": 10 * (i + 1), "steps": 10, "steps_per_second": 5.0, "mfu_percent": value}
        for i, value in enumerate([40, 40, 40, 20, 20, 20])
    ]
    rules = AlertRules()
    assert [len(rules.check(windows[:count])) for count in range(1, 7)] == [0, 0, 0, 0, 0, 1]


def test_the_reports_training_figure_draws_the_alert_threshold_only_where_input_wait_was_measured():
    """plots.training_figure, the report's view of these windows (here: tests/profiling has no plots test)."""
    from tfopt.profiling.diagnose import INPUT_BOUND_HIGH_PERCENT
    from tfopt.profiling.plots import training_figure

    measured = [
        {"step": 4 * n, "steps_per_second": 9.0, "examples_per_second": 288.0, "input_wait_percent": 3.0}
        for n in range(1, 4)
    ]
    speed, percent = training_figure(measured).axes
    thresholds = [line for line in percent.get_lines() if list(line.get_ydata()) == [INPUT_BOUND_HIGH_PERCENT] * 2]
    assert len(thresholds) == 1 and f"({INPUT_BOUND_HIGH_PERCENT:.0f}%)" in thresholds[0].get_label()
    unmeasured = [{key: value for key, value in window.items() if key != "input_wait_percent"} for window in measured]
    (speed,) = training_figure(unmeasured).axes  # steps_per_execution > 1 on a CPU: throughput alone
    assert [list(line.get_ydata()) for line in speed.get_lines()] == [[288.0] * 3]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"window_seconds": 0}, "window_seconds=0"),
        ({"every_steps": 0}, "every_steps=0"),
        ({"profile_every": 1.5}, "profile_every=1.5"),
        ({"alert_windows": 0}, "alert_windows=0"),
        ({"mfu_drop_fraction": 1.5}, "mfu_drop_fraction=1.5"),
        ({"on_alert": "chat"}, "not callable"),
        ({"tensorboard": "logs"}, "tensorboard='logs' is not a keras.callbacks.TensorBoard"),
        ({"logdir": "a", "tensorboard": keras.callbacks.TensorBoard("b")}, "got logdir='a' and tensorboard="),
    ],
)
def test_bad_arguments_name_the_value(kwargs, words):
    with pytest.raises(RecipeConfigError, match=words):
        Monitor(**kwargs)


@pytest.mark.slow
def test_profile_capture_adds_busy_and_diagnosis(tmp_path):
    monitor = Monitor(logdir=tmp_path, every_steps=4, profile_every=1, hardware=Hardware())
    model = make_model(width=1024, hidden=2)
    model.fit(steady_dataset(), epochs=1, steps_per_epoch=18, verbose=0, callbacks=[monitor])
    profiles = monitor.records_of("profile")
    assert profiles and Path(profiles[0]["path"]).is_dir()
    # the heaviest layer (the 1024x1024 Dense between a 16x1024 and a 1024x1 one: 64 times the work, so that
    # a loaded host cannot order their few-microsecond ops the other way); the cached pipeline's stages do next
    # to no work, so a slowest stage may be named or not (test_stages.py checks the naming)
    assert profiles[0]["top_layer"] == model.layers[1].name and profiles[0]["top_layer_seconds_per_step"] > 0
    assert isinstance(profiles[0]["top_stage"], str) == (profiles[0]["top_stage_seconds_per_batch"] is not None)
    written = [json.loads(line) for line in (tmp_path / "monitor.jsonl").read_text().splitlines()]
    assert [record["top_layer"] for record in written if record["kind"] == "profile"] == [
        record["top_layer"] for record in profiles
    ]
    if tf.config.list_logical_devices("GPU"):  # the model trains on the GPU, whose kernels the trace holds
        assert 0 < profiles[0]["busy_percent"] < 100
    else:
        assert profiles[0]["busy_percent"] is None  # CPU: no accelerator activity in the trace
    assert 0 <= profiles[0]["input_wait_percent"] < 100 and profiles[0]["diagnosis"]
    # The captured steps (5 after each window) are in no window: their profiler overhead is not timed.
    steps = [(w["step"] - w["steps"] + 1, w["step"]) for w in monitor.records_of("window")]
    assert steps == [(2, 5), (12, 15)]
    assert "tfopt/profile/input_wait_percent" in scalars(tmp_path)


@pytest.mark.slow
def test_a_second_run_into_the_same_logdir_captures_beside_the_first(tmp_path):
    paths = []
    for _ in range(2):  # the script run again with the same logdir
        monitor = Monitor(logdir=tmp_path, every_steps=4, profile_every=1, hardware=Hardware())
        make_model().fit(steady_dataset(), epochs=1, steps_per_epoch=10, verbose=0, callbacks=[monitor])
        paths += [record["path"] for record in monitor.records_of("profile")]
    assert len(paths) == 2 and len(set(paths)) == 2 and all(Path(path).is_dir() for path in paths)


@pytest.mark.slow
def test_a_failure_during_a_capture_stops_the_profiler(tmp_path):
    monitor = Monitor(logdir=tmp_path, every_steps=2, profile_every=1, hardware=Hardware())
    # Step 3 closes a window and starts a capture; step 6's batch fails inside it.
    with pytest.raises(tf.errors.OpError, match="the disk went away"):
        make_model().fit(
            generated_dataset(fail_from_batch=5), epochs=1, steps_per_epoch=10, verbose=0, callbacks=[monitor]
        )
    tf.profiler.experimental.start(str(tmp_path / "next"))  # raises while another capture is running
    tf.profiler.experimental.stop()


def mirrored_script_result(*arguments):
    """What monitor_mirrored_script.py prints: two logical CPUs need a fresh process, as TensorFlow fixes its
    devices when it starts."""
    completed = subprocess.run(
        [sys.executable, str(HERE / "monitor_mirrored_script.py"), *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_environment(),
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, completed.stderr[-3000:]
    return json.loads(lines[0][len("RESULT ") :])


@pytest.mark.slow
def test_mirrored_strategy_on_two_cpus():
    result = mirrored_script_result()
    assert result["start"]["replicas"] == 2
    # On a host with a GPU, replicas on CPUs are measured as CPUs: no MFU against the GPU's peak, no GPU memory.
    assert result["start"]["accelerator"] == "cpu"
    assert {"mfu_percent", "device_memory_peak_bytes"} <= set(result["start"]["not_applicable"])
    windows = result["windows"]
    assert [window["step"] for window in windows] == [5, 9, 13]
    for window in windows:  # the global batch of 16, split over the two replicas, counts once
        assert window["examples_per_second"] == pytest.approx(16 * window["steps_per_second"])
        assert 0 <= window["input_wait_percent"] < 100
    assert result["weights_max_diff"] < 1e-6


@pytest.mark.slow
def test_under_two_replicas_an_epochs_metrics_are_over_all_its_examples_where_a_window_closes_it():
    """Keras takes the epoch's logs from its metrics only where the last step's logs name just those: the
    replicas' mean of the last, uneven batch's accuracy is not the epoch's."""
    monitored, plain = mirrored_script_result("uneven")
    assert monitored == plain and plain["accuracy"][0] * 61 == pytest.approx(round(plain["accuracy"][0] * 61))
