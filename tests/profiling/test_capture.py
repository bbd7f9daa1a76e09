"""capture / profile: what a real capture holds, state kept, bad datasets rejected, failures and
interruptions leave the profiler stopped and earlier reports untouched."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.errors import DataError, MeasurementError
from tfopt.profiling import capture as capture_module
from tfopt.profiling.analyze import analyze
from tfopt.profiling.capture import capture, profile
from tfopt.profiling.report import compare
from tfopt.profiling.timing import window_layout

from .conftest import BATCH, STEPS, WARMUP_STEPS


def _small_model() -> keras.Model:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    return model


def _numbers(count: int, batch: int = 4) -> tf.data.Dataset:
    """Batches of (i, i, i, i) -> i for i in range(count)."""
    values = np.arange(count, dtype=np.float32)
    return tf.data.Dataset.from_tensor_slices((np.repeat(values[:, None], 4, axis=1), values[:, None])).batch(batch)


def _assert_profiler_free(tmp_path) -> None:
    """A new profiler session starts: the failed capture did not leave one running."""
    tf.profiler.experimental.start(str(tmp_path / "probe"))
    tf.profiler.experimental.stop()


def test_profile_holds_the_measured_steps(starved_profile):
    captured = starved_profile.capture
    assert captured.step_numbers == tuple(range(WARMUP_STEPS, WARMUP_STEPS + STEPS))
    # One window over the measured steps: the device is waited for at its two ends only.
    assert captured.step_times.steps == STEPS and captured.step_times.window_steps == STEPS
    assert captured.step_times.batch_size == BATCH
    assert captured.xplane_path.is_file() and captured.xplane_path.name.endswith(".xplane.pb")
    assert captured.xplane_path.parent.parent == captured.logdir / "plugins" / "profile"
    assert len(starved_profile.breakdown.step_seconds) == STEPS
    windows, window_steps = window_layout(STEPS)
    for side in (starved_profile.measurement.real, starved_profile.measurement.ceiling):
        assert (len(side.seconds), side.window_steps) == (windows, window_steps)
    assert starved_profile.steps_per_epoch == 1024 // BATCH
    # Host samples cover the run: the first an interval after its start (a share of CPU time needs one), the
    # last after the measured steps.
    host = starved_profile.samples.of("host")
    assert 0.0 < host[0].seconds < 1.0
    assert host[-1].seconds >= captured.step_times.median_seconds * STEPS
    metrics = starved_profile.metrics
    hardware = starved_profile.hardware
    assert metrics.accelerator == hardware.accelerator
    if hardware.accelerator == "cpu":
        # The peak is this process's RSS, and the accelerator metrics do not apply.
        assert captured.peak_memory_bytes > 100 * 2**20 and starved_profile.peak_memory_fraction is None
        assert (metrics.busy_percent, metrics.mfu_percent) == (None, None)
    else:
        # The peak is TensorFlow's allocator's on the GPUs (the model's 2048x2048 kernel alone is 16 MiB,
        # 48 MiB with Adam's two slots), a share of the first GPU's memory where NVML gave its size.
        assert captured.peak_memory_bytes > 32 * 2**20
        memory = hardware.gpus[0].memory_bytes if hardware.gpus else None
        fraction = starved_profile.peak_memory_fraction
        assert fraction == (pytest.approx(captured.peak_memory_bytes / memory) if memory else None)
        # The starved device waits for input most of every wall step: busy a small share of it.
        assert metrics.busy_percent is not None and 0.0 <= metrics.busy_percent < 50.0
        assert metrics.mfu_percent is None or 0.0 < metrics.mfu_percent <= 100.0
    assert metrics.input_wait_percent == pytest.approx(starved_profile.breakdown.input_percent)
    assert json.loads(json.dumps(starved_profile.to_dict()))["logdir"] == str(captured.logdir)


def test_profiling_overhead_compares_profiled_and_unprofiled_speed(starved_profile):
    expected = (
        1 - starved_profile.capture.step_times.steps_per_second / starved_profile.measurement.real.steps_per_second
    )
    assert starved_profile.profiling_overhead == pytest.approx(expected)


def test_profile_keeps_weights_and_optimizer_state(tmp_path):
    model = _small_model()
    model.fit(_numbers(32), epochs=1, verbose=0)
    before = [v.numpy().copy() for v in [*model.weights, *model.optimizer.variables]]
    result = profile(model, _numbers(64), steps=3, warmup_steps=1, logdir=tmp_path)
    after = [v.numpy() for v in [*model.weights, *model.optimizer.variables]]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert result.breakdown.source == "trace+xprof" and len(result.breakdown.step_seconds) == 3


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        (_numbers(0), "has 0 batches; profiling needs at least 2"),
        (_numbers(3, batch=4), "has 1 batch; profiling needs at least 2"),
        (
            tf.data.Dataset.range(10)
            .filter(lambda i: i > 8)
            .map(lambda i: (tf.fill([1, 4], 1.0), tf.fill([1, 1], 1.0))),
            "has 1 batch",
        ),  # cardinality unknown to tf.data: counted by reading
        ([1, 2, 3], "Expected a batched tf.data.Dataset, received list"),
        (tf.data.Dataset.range(8).batch(2), "must be an \\(inputs, targets\\[, sample_weights\\]\\) tuple"),
    ],
)
def test_unprofilable_datasets_are_clear_errors(dataset, message):
    with pytest.raises(DataError, match=message):
        profile(_small_model(), dataset, steps=2, warmup_steps=1)


def test_capture_checks_its_step_counts(tmp_path):
    with pytest.raises(MeasurementError, match="steps >= 2 and warmup_steps >= 1; received steps=1"):
        capture(_small_model(), _numbers(16), steps=1, warmup_steps=1, batch_size=4, logdir=tmp_path)


def test_several_steps_per_execution_are_measured_so_and_captured_one_by_one(tmp_path):
    """The speed is measured at the model's 4 steps per call (windows of whole calls); the capture marks each step,
    one per call; then the model runs 4 per call again, with the train function it had, and its weights."""
    model = _small_model()
    model.compile(optimizer="adam", loss="mse", steps_per_execution=4)
    model.fit(_numbers(64), epochs=1, verbose=0)
    function, weights = model.train_function, [weight.numpy() for weight in model.weights]
    profiled = profile(model, _numbers(64), steps=6, warmup_steps=1, logdir=tmp_path)
    assert profiled.measurement.real.window_steps % 4 == 0 and profiled.measurement.ceiling.window_steps % 4 == 0
    assert profiled.capture.step_numbers == tuple(range(1, 7)) and len(profiled.breakdown.step_seconds) == 6
    assert model.steps_per_execution == 4 and model.train_function is function
    for kept, weight in zip(weights, model.weights, strict=True):
        np.testing.assert_array_equal(kept, weight.numpy())
    history = model.fit(_numbers(64), epochs=1, verbose=0)  # 16 batches: 4 calls of 4 steps
    assert model.optimizer.iterations.numpy() == 16 + 16 and np.isfinite(history.history["loss"][0])


def test_failed_capture_stops_the_profiler_and_leaves_reports_untouched(tmp_path, make_fake_profile):
    report_path = compare(make_fake_profile(), make_fake_profile(input_ms=1.0)).save(tmp_path / "report.html")
    original = report_path.read_bytes()
    # Element 30 fails: batch 7 of 4-element batches, a measured step under the profiler.
    failing = tf.data.Dataset.range(100).map(_fail_at(30)).batch(4)
    with pytest.raises(
        MeasurementError,
        match=r"(?s)stopped after 7 of 12 steps \(InvalidArgumentError.*element 30 is "
        r"broken.*reports written before are untouched",
    ):
        capture(_small_model(), failing, steps=8, warmup_steps=3, batch_size=4, logdir=tmp_path / "logs")
    assert report_path.read_bytes() == original
    _assert_profiler_free(tmp_path)


def _fail_at(index: int):
    def check(i):
        tf.debugging.assert_none_equal(i, tf.constant(index, tf.int64), message=f"element {index} is broken")
        value = tf.cast(i, tf.float32)
        return tf.fill([4], value), tf.reshape(value, [1])

    return check


def test_interrupted_capture_stops_the_profiler_and_says_how_far_it_got(tmp_path, monkeypatch):
    original_end = capture_module._ProfiledSteps.on_train_batch_end

    def interrupt_at_step_five(self, batch, logs=None):
        original_end(self, batch, logs)
        if batch == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(capture_module._ProfiledSteps, "on_train_batch_end", interrupt_at_step_five)
    with pytest.raises(KeyboardInterrupt) as raised:
        capture(_small_model(), _numbers(64), steps=6, warmup_steps=2, batch_size=4, logdir=tmp_path / "logs")
    assert any("stopped after 6 of 9 steps" in note for note in getattr(raised.value, "__notes__", []))
    _assert_profiler_free(tmp_path)


def test_a_failed_capture_into_its_own_temporary_directory_removes_it(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    failing = tf.data.Dataset.range(100).map(_fail_at(30)).batch(4)
    with pytest.raises(MeasurementError, match=r"stopped after 7 of 12 steps \(InvalidArgumentError: assertion"):
        capture(_small_model(), failing, steps=8, warmup_steps=3, batch_size=4)
    assert list(tmp_path.iterdir()) == []
    _assert_profiler_free(tmp_path / "probe")


def test_a_running_profiler_session_is_reported(tmp_path):
    tf.profiler.experimental.start(str(tmp_path / "theirs"))
    try:
        with pytest.raises(MeasurementError, match="Another profiling session is probably running"):
            capture(_small_model(), _numbers(32), steps=2, warmup_steps=1, batch_size=4, logdir=tmp_path / "ours")
    finally:
        tf.profiler.experimental.stop()


def test_captures_into_one_logdir_are_told_apart(tmp_path):
    model, data = _small_model(), _numbers(32)
    first = capture(model, data, steps=2, warmup_steps=1, batch_size=4, logdir=tmp_path)
    second = capture(model, data, steps=2, warmup_steps=1, batch_size=4, logdir=tmp_path)
    assert second.xplane_path.is_file() and second.logdir == first.logdir == tmp_path
    # Whether or not both runs started within the same second (and so share a file), the second
    # capture names a file holding its own measured steps.
    assert len(analyze(second.xplane_path, step_numbers=second.step_numbers).step_seconds) == 2


def test_profile_refuses_a_model_not_compiled_and_hardware_of_another_kind():
    from tfopt.errors import IncompatibleModelError, RecipeConfigError

    uncompiled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(IncompatibleModelError, match=r"Sequential \(not compiled\): compile it"):
        profile(uncompiled, _numbers(32))
    with pytest.raises(RecipeConfigError, match=r"hardware=.gpu. is not a tfopt\.hardware\.Hardware"):
        profile(_small_model(), _numbers(32), hardware="gpu")
