"""One learning-rate scaling for batch_size, grad_accum and distribution: rules, schedules, wrapped
optimizers, warm-up, and errors that say how to fix them."""

import keras
import numpy as np
import pytest

from tfopt.errors import RecipeConfigError
from tfopt.recipes.learning_rate import scale_learning_rate


@pytest.mark.parametrize("rule, expected", [("linear", 0.8), ("sqrt", 0.2), ("none", 0.1)])
def test_learning_rate_rules(rule, expected):
    config = {"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}}, "loss": "mse"}
    scaled, _ = scale_learning_rate(config, old_batch_size=32, new_batch_size=256 if rule != "sqrt" else 128, rule=rule)
    assert scaled["optimizer"]["config"]["learning_rate"] == pytest.approx(expected)
    assert config["optimizer"]["config"]["learning_rate"] == 0.1


def test_learning_rate_schedule_is_scaled():
    schedule = keras.saving.serialize_keras_object(keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9))
    config = {"optimizer": {"class_name": "SGD", "config": {"learning_rate": schedule}}}
    scaled, _ = scale_learning_rate(config, old_batch_size=8, new_batch_size=16, rule="linear")
    assert scaled["optimizer"]["config"]["learning_rate"]["config"]["initial_learning_rate"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    "schedule, peak_step",
    [
        (keras.optimizers.schedules.CosineDecay(0.0, 90, warmup_target=0.1, warmup_steps=10), 10),
        (keras.optimizers.schedules.PolynomialDecay(0.1, 100, end_learning_rate=0.05), 0),
        (keras.optimizers.schedules.PiecewiseConstantDecay([50], [0.1, 0.05]), 0),
    ],
)
def test_a_schedule_is_scaled_at_every_step_its_shape_kept(schedule, peak_step):
    """A warm-up's peak, a decay's floor, each piece: scaling only the initial rate would change the shape."""
    config = {
        "optimizer": {"class_name": "SGD", "config": {"learning_rate": keras.saving.serialize_keras_object(schedule)}}
    }
    scaled, detail = scale_learning_rate(config, old_batch_size=8, new_batch_size=32, rule="linear")
    made = keras.saving.deserialize_keras_object(scaled["optimizer"]["config"]["learning_rate"])
    for step in (peak_step, 60, 100):
        assert float(made(step)) == pytest.approx(4 * float(schedule(step)))
    assert detail.startswith("learning rate ") and f"(of its {type(schedule).__name__})" in detail


def test_unscalable_learning_rate_says_how_to_fix():
    config = {"optimizer": {"class_name": "SGD", "config": {"learning_rate": {"class_name": "Custom", "config": {}}}}}
    with pytest.raises(RecipeConfigError, match="scale_learning_rate='none'"):
        scale_learning_rate(config, old_batch_size=8, new_batch_size=16, rule="sqrt")


def test_learning_rate_of_an_optimizer_given_by_name_is_scaled():
    config, reason = scale_learning_rate(
        {"optimizer": "adam", "loss": "mse"}, old_batch_size=32, new_batch_size=128, rule="linear"
    )
    assert config["optimizer"]["class_name"] == "Adam"
    assert config["optimizer"]["config"]["learning_rate"] == pytest.approx(0.004)  # Keras' default 0.001 x 4
    assert "x4" in reason


def test_the_rate_inside_a_loss_scale_optimizer_is_scaled():
    inner = {"class_name": "SGD", "config": {"learning_rate": 0.1}}
    config = {"optimizer": {"class_name": "LossScaleOptimizer", "config": {"inner_optimizer": inner}}}
    scaled, detail = scale_learning_rate(config, old_batch_size=8, new_batch_size=32, rule="linear")
    assert scaled["optimizer"]["config"]["inner_optimizer"]["config"]["learning_rate"] == pytest.approx(0.4)
    assert inner["config"]["learning_rate"] == 0.1 and "0.1 -> 0.4" in detail


def test_a_warmup_wraps_the_rate_and_ramps_to_the_scaled_value():
    config = {"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}}}
    scaled, detail = scale_learning_rate(config, old_batch_size=8, new_batch_size=16, rule="linear", warmup_steps=4)
    schedule = keras.saving.deserialize_keras_object(scaled["optimizer"]["config"]["learning_rate"])
    np.testing.assert_allclose([float(schedule(step)) for step in (0, 3, 9)], [0.05, 0.2, 0.2], rtol=1e-6)
    assert "warm-up over 4 steps" in detail


def test_a_warmup_alone_keeps_the_rate_it_ramps_to():
    config = {"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}}}
    scaled, _ = scale_learning_rate(config, old_batch_size=8, new_batch_size=8, rule="none", warmup_steps=2)
    schedule = keras.saving.deserialize_keras_object(scaled["optimizer"]["config"]["learning_rate"])
    np.testing.assert_allclose([float(schedule(0)), float(schedule(5))], [0.05, 0.1], rtol=1e-6)


LOAD = """
import json, sys
import keras, tfopt

out = {}
try:
    keras.models.load_model(sys.argv[1])
    out["tfopt"] = "loaded"
except TypeError as error:
    out["tfopt"] = str(error)
import tfopt.distribute.warmup

model = keras.models.load_model(sys.argv[1])
schedule = model.optimizer._learning_rate
out["warmup"] = [type(schedule).__name__, [float(schedule(step)) for step in (0, 5)]]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_a_copy_with_tfopts_warmup_saves_a_file_that_loads_once_the_schedule_is_imported(tmp_path, cpu_hardware):
    """A warm-up wraps the schedule in LinearWarmup, which Keras cannot load by itself and `import tfopt` (lazy)
    does not register: the cards say to `import tfopt.distribute.warmup`, checked in a fresh process as a user's
    would be."""
    import json
    import subprocess
    import sys

    import tensorflow as tf

    import tfopt
    from tests.processes import child_environment

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([4], [0.1, 0.01])
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="sparse_categorical_crossentropy")
    data = tf.data.Dataset.from_tensor_slices((np.zeros((32, 4), "float32"), np.zeros(32, "int32"))).batch(8)
    recipes = [{"distribution": {"strategy": "one_device", "warmup_steps": 4}}]
    result = tfopt.apply(model, data, recipes, hardware=cpu_hardware, measure_speed=False)
    step = next(step for step in result.plan.applied if step.recipe == "distribution")
    assert "schedule 'PiecewiseConstantDecay' -> LinearWarmup" in step.detail
    result.model.save(tmp_path / "copy.keras")
    finished = subprocess.run(
        [sys.executable, "-c", LOAD, str(tmp_path / "copy.keras")],
        capture_output=True,
        text=True,
        env=child_environment(),
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    (line,) = [line for line in finished.stdout.splitlines() if line.startswith("RESULT ")]
    out = json.loads(line[len("RESULT ") :])
    assert "could not be deserialized" in out["tfopt"]
    assert out["warmup"][0] == "LinearWarmup"
    np.testing.assert_allclose(out["warmup"][1], [0.1 / 4, 0.01], rtol=1e-6)  # a quarter of the way up; then on
