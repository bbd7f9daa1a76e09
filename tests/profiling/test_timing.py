"""Step timing: windows with one device sync at each end, not one per step, whatever the steps per call."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import make_cnn, make_images
from tfopt.errors import MeasurementError
from tfopt.profiling import timing
from tfopt.profiling.timing import StepTimes, WindowTimer, one_batch_repeated, time_training_steps, window_layout


class CountingLoss:
    """A loss value whose reading to the host is counted: one reading is one device sync."""

    reads = 0

    def __array__(self, dtype=None, copy=None):
        CountingLoss.reads += 1
        return np.array(0.5, dtype=dtype)


class FakeModel:
    """Runs `fit` as Keras does for the callbacks (one on_train_batch_end per step, a lazy loss), no TF."""

    steps_per_execution = 1

    def fit(self, data, *, steps_per_epoch, epochs, verbose, shuffle, callbacks):
        for step in range(steps_per_epoch * epochs):
            for callback in callbacks:
                callback.on_train_batch_end(step, {"loss": CountingLoss()})


class FakeData:
    def repeat(self):
        return self


def test_step_times_arithmetic():
    times = StepTimes(seconds=(0.1, 0.2, 0.3, 0.4, 1.0), batch_size=10, window_steps=4)
    assert times.steps == 20
    assert times.median_seconds == pytest.approx(0.3)
    assert times.steps_per_second == pytest.approx(1 / 0.3)
    assert times.examples_per_second == pytest.approx(10 / 0.3)
    assert times.spread_seconds == pytest.approx(0.7 - 0.15)  # interquartile range, not max - min
    assert times.to_dict()["window_steps"] == 4


def test_windows_hold_whole_calls_and_all_the_steps_asked():
    assert window_layout(20) == (4, 5)
    assert window_layout(3) == (3, 1)
    assert window_layout(21) == (5, 5)  # rounded up to whole windows
    assert window_layout(6, steps_per_call=4) == (2, 4)
    assert window_layout(10, window_steps=3) == (4, 3)


def test_timing_syncs_once_per_window_end_not_per_step():
    CountingLoss.reads = 0
    times = time_training_steps(FakeModel(), FakeData(), steps=20, warmup_steps=3, batch_size=8)
    windows, window_steps = window_layout(20)
    assert (len(times.seconds), times.window_steps) == (windows, window_steps)
    assert CountingLoss.reads == windows + 1  # 23 steps ran; the device was waited for 5 times


def test_window_timer_records_each_window_at_its_boundaries():
    syncs = []
    timer = WindowTimer(warmup_steps=2, windows=3, window_steps=2, sync=syncs.append)
    for step in range(10):
        timer.on_train_batch_end(step, {"loss": step})
    assert [logs["loss"] for logs in syncs] == [1, 3, 5, 7]  # after steps 2, 4, 6, 8 completed
    assert len(timer.seconds) == 3 and all(seconds >= 0 for seconds in timer.seconds)


def test_one_batch_repeated_is_the_first_batch_forever():
    data = make_images(count=24, batch_size=8)
    first = next(iter(data))
    for images, labels in one_batch_repeated(data).take(5):
        np.testing.assert_array_equal(images, first[0])
        np.testing.assert_array_equal(labels, first[1])


def test_too_few_steps_is_a_clear_error():
    with pytest.raises(MeasurementError, match="steps >= 2 and warmup_steps >= 1"):
        time_training_steps(make_cnn(), make_images(), steps=1, warmup_steps=0, batch_size=8)


def test_several_steps_per_call_are_timed_in_whole_calls():
    model = make_cnn()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=4)
    times = time_training_steps(model, make_images(), steps=6, warmup_steps=1, batch_size=8)
    assert times.window_steps % 4 == 0 and times.steps >= 6


def test_read_loss_reads_the_loss_or_the_first_value():
    CountingLoss.reads = 0
    timing.read_loss({"loss": CountingLoss()})
    timing.read_loss({"accuracy": CountingLoss()})
    timing.read_loss({"losses": {"d_loss": CountingLoss(), "g_loss": CountingLoss()}})  # nested: the first only
    timing.read_loss(None)
    assert CountingLoss.reads == 3
    timing.read_loss({"loss": tf.constant([0.5, 1.5])})  # a per-example loss Keras takes as it is


def test_keras_reads_every_steps_logs_to_the_host_on_tensorflow():
    """The trap the ceiling's per-call sync mirrors: if Keras stops converting each step's logs (a device
    sync), this fails and the ceiling should stop syncing per call."""
    seen = []

    class Types(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(type(logs["loss"]))

    make_cnn().fit(make_images(), epochs=1, verbose=0, callbacks=[Types()])
    assert seen and set(seen) == {float}
    from keras.src.backend.tensorflow.core import IS_THREAD_SAFE

    assert IS_THREAD_SAFE is False  # so CallbackList never dispatches batch ends asynchronously
