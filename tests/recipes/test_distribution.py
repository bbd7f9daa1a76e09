"""The distribution recipe with faked hardware and a faked launcher environment."""

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tfopt.distribute.environment import detect_environment
from tfopt.errors import RecipeClashError, RecipeConfigError
from tfopt.plan import make_plan
from tfopt.recipes import GradAccum, StepsPerExecution, chain
from tfopt.recipes import distribution as distribution_module
from tfopt.recipes.distribution import Distribution, choose_strategy
from tfopt.recipes.steps_per_execution import steps_choices

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


def test_a_scaled_batch_keeps_the_length_and_says_what_is_dropped():
    """Dataset.rebatch loses the length: under MirroredStrategy Keras then counted 72 examples of 64 in its logs,
    and one-iterator training reads `cardinality()`. 32 examples in global batches of 3 x 8: one, 8 dropped."""
    plan = Distribution(strategy="mirrored", devices=["/cpu:0", "/cpu:1", "/cpu:2"])(plan_on())
    assert plan.batch_size == 24 and int(plan.dataset.cardinality()) == 1
    assert [int(x.shape[0]) for x, _ in plan.dataset] == [24]
    assert "global batch 8 x 3 = 24 (the last 8 examples of each pass, short of a whole global batch, are dropped" in (
        plan.applied[-1].detail
    )


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


def test_check_rejects_tpu_without_tpu_and_uneven_split(two_cpus):
    with pytest.raises(RecipeConfigError, match="no TPU is visible") as error:
        Distribution(strategy="tpu").check(plan_on())
    assert error.value.setting == "strategy"
    with pytest.raises(RecipeConfigError, match="does not divide evenly") as error:
        Distribution(strategy="mirrored", devices=["/cpu:0", "/cpu:1", "/cpu:2"], scale_batch=False).check(plan_on())
    assert error.value.setting == "scale_batch"


@pytest.mark.parametrize(
    "devices, words",
    [
        (["/gpu:0", "/gpu:1"], "names /gpu:0, /gpu:1, which this process does not have (it has /device:CPU:0"),
        (["/cpu:0", "/device:CPU:0"], "names /cpu:0, /device:CPU:0 more than once"),
    ],
)
def test_devices_this_process_does_not_have_are_refused_before_anything_waits_for_them(devices, words):
    """MirroredStrategy over a device that is not there waits forever (the first step hung on TF 2.21)."""
    with pytest.raises(RecipeConfigError, match=re.escape(words)) as error:
        Distribution(strategy="mirrored", devices=devices).check_before_trials(plan_on())
    assert error.value.setting == "devices" and "tf.config.list_logical_devices()" in str(error.value)


@pytest.mark.parametrize("seconds", [0, -1, True, "5"])
def test_a_start_timeout_must_be_seconds_above_zero(seconds):
    with pytest.raises(RecipeConfigError, match=r"start_timeout_seconds=.*expected seconds above 0") as raised:
        Distribution(start_timeout_seconds=seconds)
    assert raised.value.setting == "start_timeout_seconds"


TWO_CPUS = {"strategy": "mirrored", "devices": ["/cpu:0", "/cpu:1"]}


@pytest.fixture
def two_cpus(monkeypatch):
    """The checks as on a host with two CPU devices: this process has one (the subprocess tests below make two)."""
    monkeypatch.setattr(distribution_module, "_check_devices_exist", lambda devices: None)


@pytest.mark.parametrize(
    "distribution",
    [TWO_CPUS, {"strategy": "mirrored", "devices": ["/cpu:0"]}, {"strategy": "multi_worker", "environ": TWO_WORKERS}],
    ids=["mirrored-2", "mirrored-1", "multi_worker"],
)
def test_gradient_accumulation_is_refused_under_a_mirrored_strategy(distribution, two_cpus):
    with pytest.raises(RecipeClashError, match=r'Keras 3.15 cannot accumulate .*"merge_call called') as raised:
        chain(Distribution(**distribution), GradAccum(steps=2)).check(plan_on())
    assert raised.value.recipes == ("distribution", "grad_accum")
    chain(Distribution(strategy="one_device"), GradAccum(steps=2)).check(plan_on())


def test_several_steps_per_call_are_refused_under_several_replicas_in_this_process(two_cpus):
    two = Distribution(**TWO_CPUS)
    with pytest.raises(RecipeClashError, match="more than one step per call under MirroredStrategy over 2") as raised:
        chain(two, StepsPerExecution(steps=4)).check(plan_on())
    assert raised.value.recipes == ("distribution", "steps_per_execution")
    own = make_cnn(compiled=False)
    own.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", steps_per_execution=4)
    with pytest.raises(RecipeConfigError, match=r"your compile runs 4 steps per call \(steps_per_execution=4\)"):
        two.check(make_plan(own, make_images(batch_size=8), hardware=FAKE_HARDWARE["cpu_plain"]))
    # One replica runs them; "auto" is left out after the build, with nothing to measure under two.
    chain(Distribution(strategy="mirrored", devices=["/cpu:0"]), StepsPerExecution(steps=4)).check(plan_on())
    chain(two, StepsPerExecution()).check(plan_on())
    assert steps_choices(two(plan_on())) == () and steps_choices(Distribution(strategy="one_device")(plan_on()))
    (step,) = StepsPerExecution()(two(plan_on())).applied[-1:]
    assert step.skipped and step.detail.startswith("Keras 3.15 fails with more than one step per call under")


TWO_REPLICAS = """
import json
import re
import tensorflow as tf

tf.config.set_visible_devices([], "GPU")
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np, tfopt
from tfopt.hardware import Hardware

rng = np.random.default_rng(0)
features, labels = rng.normal(size=(64, 8)).astype("float32"), rng.integers(0, 3, 64)
def data(batch):
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch)
def mlp(accumulation=None, steps=1):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.1, gradient_accumulation_steps=accumulation), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=steps)
    return model
two = {"strategy": "mirrored", "devices": ["/cpu:0", "/cpu:1"]}
out = {}
plain = mlp()
out["plain"] = plain.fit(data(16), epochs=2, verbose=0, shuffle=False).history
result = tfopt.apply(mlp(), data(8), [{"distribution": two}], hardware=Hardware(cpu_count=2), measure_speed=False)
out["length"] = int(result.dataset.cardinality())
out["scaled"] = result.model.fit(result.dataset, epochs=2, verbose=0, shuffle=False).history
unknown = data(8).unbatch().filter(lambda x, y: True).batch(8)  # a length tf.data does not know
result = tfopt.apply(mlp(), unknown, [{"distribution": two}], hardware=Hardware(cpu_count=2), measure_speed=False)
out["unknown"] = result.model.fit(result.dataset, epochs=2, verbose=0, shuffle=False).history
result = tfopt.apply(mlp(), data(16), recipes=[{"distribution": {**two, "scale_batch": False}}, "steps_per_execution"],
                     hardware=Hardware(cpu_count=2), steps=2, warmup_steps=1)
out["auto"] = [str(step) for step in result.plan.applied if step.recipe == "steps_per_execution"]
out["auto_steps"] = result.model.steps_per_execution
# Why both are refused: plain Keras under the same strategy fails with them (a fixed Keras shows here first).
strategy = tf.distribute.MirroredStrategy(two["devices"])
for name, compiled in (("accumulation", {"accumulation": 2}), ("four_steps", {"steps": 4})):
    with strategy.scope():
        model = mlp(**compiled)
    try:
        model.fit(data(16), epochs=1, verbose=0)
        out[name] = "trained"
    except Exception as error:
        out[name] = str(error)
# A model the user made under their own strategy is copied and trained under it, as plain Keras trains it.
with strategy.scope():
    theirs, copied = mlp(), mlp()
out["theirs"] = theirs.fit(data(16), epochs=2, verbose=0, shuffle=False).history
result = tfopt.apply(copied, data(16), ["data_pipeline"], hardware=Hardware(cpu_count=2), measure_speed=False)
out["placed"] = [result.plan.strategy, result.strategy.num_replicas_in_sync, str(result.plan.applied[0])]
out["copied"] = result.model.fit(result.dataset, epochs=2, verbose=0, shuffle=False).history
with strategy.scope():
    copied = mlp()
kept = [{"distribution": {"strategy": "mirrored", "scale_batch": False}}]  # no devices: the user's strategy's
result = tfopt.apply(copied, data(16), kept, hardware=Hardware(cpu_count=2), measure_speed=False)
out["kept"] = [result.strategy is strategy, str(result.plan.applied[-1])]
named = [{"distribution": {**two, "scale_batch": False}}]  # its devices by their short names
result = tfopt.apply(copied, data(16), named, hardware=Hardware(cpu_count=2), measure_speed=False)
out["named"] = result.strategy is strategy
try:
    tfopt.apply(copied, data(16), [{"grad_accum": {"steps": 2}}], hardware=Hardware(cpu_count=2), measure_speed=False)
except tfopt.RecipeConfigError as error:
    out["own_strategy_accumulation"] = str(error)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_under_two_replicas_the_scaled_batch_learns_and_logs_as_keras_at_the_global_batch():
    """Two logical CPUs (a fresh process). The scaled pipeline keeps its length, and the history on it is plain
    Keras' at the global batch (with the length lost, Keras' logs under the strategy counted 72 examples of 64);
    steps_per_execution's "auto" is left out there, not failing the apply; and plain Keras fails with gradient
    accumulation and with several steps per call under the strategy, which is why tfopt refuses them."""
    import subprocess
    import sys

    from tests.processes import child_environment

    finished = subprocess.run(
        [sys.executable, "-c", TWO_REPLICAS], capture_output=True, text=True, env=child_environment(), timeout=300
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    (line,) = [line for line in finished.stdout.splitlines() if line.startswith("RESULT ")]
    out = json.loads(line[len("RESULT ") :])
    assert out["length"] == 4
    for name, values in out["plain"].items():
        np.testing.assert_allclose(out["scaled"][name], values, rtol=1e-5)
        np.testing.assert_allclose(out["unknown"][name], values, rtol=1e-5)  # a dropped remainder miscounted them
    assert out["auto_steps"] == 1 and out["auto"] == [
        "steps_per_execution: skipped: Keras 3.15 fails with more than one step per call under MirroredStrategy over "
        '2 replicas in this process ("You must feed a value for placeholder"; plain Keras fails the same way): 1 '
        "step(s) per call, as before"
    ]
    assert "merge_call` called while defining a new graph" in out["accumulation"]
    assert out["placed"] == ["mirrored", 2, "baseline: MirroredStrategy over 2 devices, as your model was made"]
    for name, values in out["theirs"].items():
        np.testing.assert_allclose(out["copied"][name], values, rtol=1e-6)
    assert out["kept"] == [
        True,
        "distribution: mirrored with 2 replica(s): requested (no TF_CONFIG, Slurm or Horovod variables: a single "
        "process); global batch 16 split 8 per replica",
    ]
    assert out["named"] is True
    assert out["own_strategy_accumulation"].startswith("grad_accum: your model was made under a mirrored strategy")
    assert "You must feed a value for placeholder" in out["four_steps"]


def test_data_carrying_strings_is_refused_under_several_replicas_as_keras_fails_on_it(two_cpus):
    """Keras 3.15 reduces the first distributed batch with MEAN: strings fail there in plain fit too (seen with
    two logical CPUs), and an apply that accepted them failed mid-measurement with a bare AddN error."""
    inputs = keras.Input((1,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["a", "b"])(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Embedding(3, 4)(ids)[:, 0]))
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    text = tf.data.Dataset.from_tensor_slices((np.array([["a"], ["b"]] * 4), np.zeros(8, "int32"))).batch(4)
    plan = make_plan(model, text, hardware=FAKE_HARDWARE["cpu_plain"])
    with pytest.raises(RecipeConfigError, match=r"your data carries strings .* plain fit fails there too") as error:
        Distribution(**TWO_CPUS).check(plan)
    assert error.value.setting == "strategy"
    Distribution(strategy="mirrored", devices=["/cpu:0"]).check(plan)  # one replica reduces nothing
