"""Real training against the on-device ceiling: input efficiency, MFU, the model's state restored (under
its strategy too)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tfopt.profiling.measurement import (
    Measurement,
    device_batch,
    measure,
    prepare_ceiling,
    time_ceiling_steps,
    train_step_flops,
)
from tfopt.profiling.timing import StepTimes, window_layout


def test_the_ceiling_runs_on_a_device_resident_batch_and_syncs_per_call_as_fit_does():
    model = make_cnn()
    data = make_images()
    syncs = []
    times = time_ceiling_steps(model, data, steps=8, warmup_steps=1, batch_size=8, sync=syncs.append)
    assert len(times.seconds) == window_layout(8)[0] and len(syncs) == 1 + 8  # warm-up call + timed calls
    images, labels = device_batch(model, data)
    first_images, first_labels = next(iter(data))
    np.testing.assert_array_equal(images, first_images)
    np.testing.assert_array_equal(labels, first_labels)
    assert ("GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0") in images.device  # the default device


def test_measure_restores_the_model_and_reports_input_efficiency():
    model = make_cnn()
    weights = [weight.copy() for weight in model.get_weights()]
    measurement = measure(
        model, make_images(), steps=8, warmup_steps=1, batch_size=8, hardware=FAKE_HARDWARE["cpu_bf16"]
    )
    assert measurement.real.steps >= 8 and measurement.ceiling.steps >= 8
    assert measurement.real.window_steps == measurement.ceiling.window_steps == window_layout(8)[1]
    assert measurement.ceiling_ratio == pytest.approx(
        measurement.ceiling.median_seconds / measurement.real.median_seconds
    )
    assert measurement.mfu is None and measurement.flops_per_step is None  # a CPU has no MFU
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)
    assert int(model.optimizer.iterations) == 0


def test_input_efficiency_is_capped_and_a_reading_beyond_the_ceiling_is_a_measurement_problem():
    def measured(real_ms, ceiling_ms, spread=0.0):
        real = StepTimes(tuple(real_ms * (1 + spread * k) / 1000 for k in (-1, 0, 0, 1)), 8)
        return Measurement(real=real, ceiling=StepTimes((ceiling_ms / 1000,) * 4, 8))

    assert measured(50, 40).input_efficiency == pytest.approx(0.8)
    assert measured(50, 40).measurement_problem is None
    noisy = measured(40, 41, spread=0.05)  # 2.5% beyond the ceiling, within twice the spread
    assert noisy.input_efficiency == 1.0 and noisy.measurement_problem is None
    beyond = measured(30, 40)
    assert beyond.input_efficiency is None
    assert "1.33x as fast as the compute-only ceiling" in beyond.measurement_problem


def test_mfu_is_model_flops_over_time_and_peak():
    measurement = Measurement(
        real=StepTimes((0.01,) * 4, 8),
        ceiling=StepTimes((0.01,) * 4, 8),
        flops_per_step=1e12,
        peak_flops_per_second=989.4e12,
        precision="bf16",
    )
    assert measurement.mfu == pytest.approx(1e12 / 0.01 / 989.4e12)
    assert measurement.to_dict()["mfu"] == pytest.approx(measurement.mfu)


def test_train_step_flops_counts_forward_backward_and_update():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((32, 64), "float32"), np.ones((32, 10), "float32"))).batch(32)
    forward = 2 * 32 * 64 * 10
    flops = train_step_flops(model, data)
    # The weight gradient is another matmul of the same size; the input needs no gradient.
    assert 2 * forward <= flops <= 2.5 * forward


def test_train_step_flops_count_convolutions_and_their_gradients():
    # MFU's "model FLOPs" are about 3x the forward pass (forward, input gradient, weight gradient): the
    # convolutions' backward ops must count, not only matmuls.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 8))
    x = keras.layers.Conv2D(32, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.Conv2D(32, 3, padding="same", use_bias=False)(x)
    model = keras.Model(inputs, keras.layers.Dense(4, use_bias=False)(keras.layers.GlobalAveragePooling2D()(x)))
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.zeros((8, 16, 16, 8), "float32"), np.zeros((8, 4), "float32")))
    forward = 2 * 8 * 16 * 16 * 3 * 3 * (8 * 32 + 32 * 32)  # both convolutions, multiply-adds as 2 FLOPs
    assert 2.5 * forward <= train_step_flops(model, data.batch(8)) <= 3.5 * forward


@pytest.fixture
def tf32_on():
    """TensorFlow's TF32 switch on (its default; an earlier build in this process may have turned it off)."""
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(True)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(previous)


def test_measure_on_a_faked_h100_computes_mfu_for_the_precision_in_use(tf32_on):
    model = make_cnn()
    measurement = measure(model, make_images(), steps=2, warmup_steps=1, batch_size=8, hardware=FAKE_HARDWARE["h100"])
    assert measurement.precision == "tf32"  # float32 on compute capability 9.0 with TF32 on (TF's default)
    assert measurement.peak_flops_per_second == pytest.approx(494.7e12)
    assert measurement.flops_per_step > 0 and 0 < measurement.mfu < 1e-3  # a CPU is no H100


@pytest.mark.parametrize("machine", ["cpu_bf16", "h100"])
def test_measure_under_a_strategy_builds_the_optimizer_in_its_scope(machine, tf32_on):
    """docs/recipes/distribution.md on one device: measuring crashed building the optimizer outside scope.
    On a faked H100 the MFU branch (the step's FLOPs from cost analysis) runs under the strategy too; the
    strategy is pinned to this machine's CPU."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = make_cnn()
    assert not model.optimizer.built
    measurement = measure(model, make_images(), steps=2, warmup_steps=1, batch_size=8, hardware=FAKE_HARDWARE[machine])
    assert measurement.real.steps >= 2 and int(model.optimizer.iterations) == 0
    if machine == "h100":
        flops = train_step_flops(make_cnn(), make_images())  # the same model, no strategy
        assert measurement.flops_per_step == pytest.approx(flops, rel=0.05) and flops > 0
        assert (measurement.precision, measurement.peak_flops_per_second) == ("tf32", pytest.approx(494.7e12))
        assert 0 < measurement.mfu < 1e-3
    else:
        assert measurement.mfu is None and measurement.flops_per_step is None


def test_the_ceiling_runs_as_many_steps_per_call_as_fit():
    model = make_cnn()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=4)
    syncs = []
    times = time_ceiling_steps(model, make_images(), steps=8, warmup_steps=1, batch_size=8, sync=syncs.append)
    assert times.window_steps % 4 == 0 and times.steps >= 8
    assert len(syncs) == 1 + times.steps // 4  # one per call of four steps, as fit reads its logs
    before = int(model.optimizer.iterations)
    prepare_ceiling(model, make_images()).step(device_batch(model, make_images()))
    assert int(model.optimizer.iterations) == before + 4  # one call, four optimizer steps


def test_side_by_side_alternates_rounds_and_shares_what_one_model_needs_once():
    """Two sides on one model (the baseline's model on two pipelines) and a third: every round visits each side
    in order, each side's `before_round` runs before its round, and the shared model is put back once."""
    from tfopt.profiling.measurement import Side, measure_side_by_side

    shared, other = make_cnn(), make_cnn()
    weights = [weight.copy() for weight in shared.get_weights()]
    visits = []
    sides = [
        Side(shared, make_images(), 8, before_round=lambda: visits.append("a")),
        Side(shared, make_images().prefetch(2), 8, before_round=lambda: visits.append("b")),
        Side(other, make_images(), 8, before_round=lambda: visits.append("c")),
    ]
    result = measure_side_by_side(sides, steps=6, warmup_steps=1, hardware=FAKE_HARDWARE["cpu_plain"])
    assert visits == ["a", "b", "c"] * 3  # 6 steps: windows of one step, two per round
    assert [len(rounds) for rounds in result.rounds] == [3, 3, 3]
    assert all(
        len(measurement.real.seconds) == 6 == len(measurement.ceiling.seconds) for measurement in result.measurements
    )
    assert len(result.ratios(2, 0)) == 3
    for mine, theirs in zip(shared.get_weights(), weights):
        np.testing.assert_array_equal(mine, theirs)
