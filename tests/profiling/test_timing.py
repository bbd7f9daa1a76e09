"""Step timing: exact step counts, interleaved rounds, the model's state restored, the arithmetic right."""

import numpy as np
import pytest

from tests.conftest import make_cnn, make_images
from tfopt.errors import MeasurementError
from tfopt.profiling.timing import StepTimes, measure, one_batch_repeated, time_training_steps


def test_step_times_arithmetic():
    times = StepTimes(seconds=(0.1, 0.2, 0.3, 0.4, 1.0), batch_size=10)
    assert times.median_seconds == pytest.approx(0.3)
    assert times.steps_per_second == pytest.approx(1 / 0.3)
    assert times.examples_per_second == pytest.approx(10 / 0.3)
    assert times.spread_seconds == pytest.approx(0.7 - 0.15)  # interquartile range, not max - min
    assert times.to_dict()["median_seconds"] == pytest.approx(0.3)


@pytest.mark.parametrize("steps", [3, 5])
def test_measure_times_exactly_the_steps_asked_and_restores_the_model(steps):
    model = make_cnn()
    weights = [weight.copy() for weight in model.get_weights()]
    measurement = measure(model, make_images(), steps=steps, warmup_steps=1, batch_size=8)
    assert len(measurement.real.seconds) == len(measurement.ceiling.seconds) == steps
    assert all(seconds > 0 for seconds in measurement.real.seconds + measurement.ceiling.seconds)
    assert measurement.utilization == pytest.approx(
        measurement.ceiling.median_seconds / measurement.real.median_seconds)
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)
    assert int(model.optimizer.iterations) == 0


def test_one_batch_repeated_is_the_first_batch_forever():
    data = make_images(count=24, batch_size=8)
    first = next(iter(data))
    for images, labels in one_batch_repeated(data).take(5):
        np.testing.assert_array_equal(images, first[0])
        np.testing.assert_array_equal(labels, first[1])


def test_too_few_steps_is_a_clear_error():
    with pytest.raises(MeasurementError, match="steps >= 2 and warmup_steps >= 1"):
        time_training_steps(make_cnn(), make_images(), steps=1, warmup_steps=0, batch_size=8)


def test_several_steps_per_call_are_timed_per_step():
    model = make_cnn()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=4)
    times = time_training_steps(model, make_images(), steps=6, warmup_steps=1, batch_size=8)
    # Rounded up to whole calls of 4 steps; each step gets a quarter of its call's time.
    assert len(times.seconds) == 8
    assert times.seconds[0] == times.seconds[3] and times.seconds[4] == times.seconds[7]
