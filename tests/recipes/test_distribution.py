"""The distribution recipe with faked hardware and a faked launcher environment."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tfopt.distribute.environment import detect_environment
from tfopt.errors import RecipeConfigError
from tfopt.plan import make_plan
from tfopt.recipes.distribution import Distribution, choose_strategy

TWO_WORKERS = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})}


@pytest.mark.parametrize(
    "hardware, environ, expected",
    [
        ("cpu_plain", {}, "default"),
        ("t4", {}, "one_device"),
        ("a100", {}, "mirrored"),
        ("tpu", {}, "tpu"),
        ("a100", TWO_WORKERS, "multi_worker"),
        ("cpu_plain", {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2"}, "multi_worker"),
        ("a100", {"HOROVOD_SIZE": "2", "HOROVOD_RANK": "0"}, "horovod"),
    ],
)
def test_auto_picks_from_hardware_and_launcher(hardware, environ, expected):
    assert choose_strategy(FAKE_HARDWARE[hardware], detect_environment(environ))[0] == expected


def plan_on(hardware="cpu_plain"):
    return make_plan(make_cnn(), make_images(count=32, batch_size=8), hardware=FAKE_HARDWARE[hardware])


def test_single_cpu_is_recorded_as_skipped():
    plan = Distribution(environ={})(plan_on())
    assert plan.strategy == "default" and plan.batch_size == 8
    assert plan.applied[-1].skipped and "nothing to distribute" in plan.applied[-1].detail


def test_two_workers_scale_batch_shard_by_data_and_set_timeout():
    plan = Distribution(
        environ=TWO_WORKERS, shard_by="data", communication_timeout_seconds=60, start_timeout_seconds=30
    )(plan_on())
    assert plan.strategy == "multi_worker"
    assert dict(plan.strategy_options) == {
        "communication_timeout_seconds": 60.0,
        "start_timeout_seconds": 30.0,
        "cluster_resolver": "tf_config",
    }
    assert plan.batch_size == 16
    assert [int(x.shape[0]) for x, _ in plan.dataset] == [16, 16]
    assert plan.dataset.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.DATA
    assert (
        "global batch 8 x 2 = 16" in plan.applied[-1].detail and "TF_CONFIG lists 2 workers" in plan.applied[-1].detail
    )


def test_batches_keep_their_examples_in_order():
    plan = Distribution(environ=TWO_WORKERS)(plan_on())
    original = np.concatenate([x.numpy() for x, _ in plan_on().dataset])
    rebatched = np.concatenate([x.numpy() for x, _ in plan.dataset])
    np.testing.assert_array_equal(rebatched, original)


def test_linear_learning_rate_scaling_with_warmup():
    plan = Distribution(strategy="mirrored", scale_learning_rate="linear", warmup_steps=2)(plan_on("a100"))
    assert plan.batch_size == 16
    schedule = keras.saving.deserialize_keras_object(plan.compile_config["optimizer"]["config"]["learning_rate"])
    np.testing.assert_allclose([float(schedule(step)) for step in range(3)], [1e-3, 2e-3, 2e-3], rtol=1e-6)
    # The built optimizer uses it: Keras deserializes the schedule from the compile config.
    optimizer = keras.saving.deserialize_keras_object(dict(plan.compile_config))["optimizer"]
    optimizer.build([keras.Variable(np.zeros(2, "float32"))])
    np.testing.assert_allclose(float(optimizer.learning_rate), 1e-3, rtol=1e-6)
    detail = plan.applied[-1].detail
    assert "-> LinearWarmup (x2, batch 8 -> 16" in detail and "linear warm-up over 2 steps" in detail


def test_square_root_learning_rate_scaling():
    plan = Distribution(strategy="mirrored", scale_learning_rate="sqrt")(plan_on("a100"))
    assert plan.batch_size == 16
    rate = plan.compile_config["optimizer"]["config"]["learning_rate"]
    np.testing.assert_allclose(rate, 1e-3 * np.sqrt(2), rtol=1e-6)
    assert "square-root scaling" in plan.applied[-1].detail


def test_config_round_trip_with_devices():
    recipe = Distribution(strategy="mirrored", devices=["/gpu:0", "/gpu:1"], environ={"A": "1"})
    config = recipe.get_config()
    assert config["devices"] == ["/gpu:0", "/gpu:1"] and Distribution(**config) == recipe


@pytest.mark.parametrize(
    "kwargs, words, setting",
    [
        ({"strategy": "gpu_farm"}, "strategy='gpu_farm' is not valid", "strategy"),
        ({"shard_by": "rows"}, "shard_by='rows'", "shard_by"),
        ({"scale_learning_rate": "log"}, "Expected one of 'none', 'linear', 'sqrt'", "scale_learning_rate"),
        ({"warmup_steps": -1}, "warmup_steps=-1", "warmup_steps"),
        ({"devices": "/gpu:0"}, "expected a list of device names", "devices"),
        ({"strategy": "horovod", "devices": ["/gpu:0"]}, "devices is only used", "devices"),
    ],
)
def test_bad_settings_raise(kwargs, words, setting):
    with pytest.raises(RecipeConfigError, match=words) as error:
        Distribution(**kwargs)
    assert error.value.setting == setting


def test_check_rejects_tpu_without_tpu_and_uneven_split():
    with pytest.raises(RecipeConfigError, match="no TPU is visible") as error:
        Distribution(strategy="tpu").check(plan_on())
    assert error.value.setting == "strategy"
    with pytest.raises(RecipeConfigError, match="does not divide evenly") as error:
        Distribution(strategy="mirrored", devices=["/cpu:0"] * 3, scale_batch=False).check(plan_on())
    assert error.value.setting == "scale_batch"


@pytest.mark.parametrize("seconds", [0, -1, True, "5"])
def test_a_start_timeout_must_be_seconds_above_zero(seconds):
    with pytest.raises(RecipeConfigError, match=r"start_timeout_seconds=.*expected seconds above 0") as raised:
        Distribution(start_timeout_seconds=seconds)
    assert raised.value.setting == "start_timeout_seconds"
