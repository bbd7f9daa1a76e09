"""tfopt.apply end to end on the model kinds users have, and its errors on bad input."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tests.conftest import make_cnn, make_images
from tfopt.errors import DataError, IncompatibleModelError, RecipeClashError, RecipeConfigError, TfoptError
from tfopt.recipes import MixedPrecision

FAST = dict(steps=3, warmup_steps=1)
# Each recipe set as asked (a pipeline and a policy the user chose): kept whatever it measures.
BF16_AS_ASKED = [{"data_pipeline": {"cache": "memory"}}, {"mixed_precision": {"policy": "mixed_bfloat16"}}, "xla"]


def snapshot(model):
    return [weight.copy() for weight in model.get_weights()]


def test_functional_cnn(cpu_hardware):
    user_model = make_cnn()
    weights = snapshot(user_model)
    # An explicit policy is applied as asked (policy auto, the default, keeps mixed precision only where it
    # measures faster: tests/test_fidelity.py).
    result = tfopt.apply(user_model, make_images(), recipes=BF16_AS_ASKED, hardware=cpu_hardware, **FAST)
    assert [step.recipe for step in result.plan.applied] == ["data_pipeline", "mixed_precision", "xla"]
    assert result.plan.dtype_policy == "mixed_bfloat16"
    assert result.model.get_layer(index=1).compute_dtype == "bfloat16"
    for measurement in (result.before, result.after):
        assert len(measurement.real.seconds) == len(measurement.ceiling.seconds) >= 2  # rounds of 2 steps or more
        assert measurement.real.batch_size == 8
        assert measurement.ceiling_ratio > 0 and measurement.flops_per_step is None  # no MFU on a CPU
    assert result.speedup > 0
    # The user's model is untouched, and the returned model starts from the user's weights: measuring
    # trained it for a few steps, and those steps were rolled back.
    for before, now, returned in zip(weights, user_model.get_weights(), result.model.get_weights()):
        np.testing.assert_array_equal(before, now)
        np.testing.assert_array_equal(before, returned)
    assert int(result.model.optimizer.iterations) == 0
    json.dumps(result.to_dict())
    assert "examples/s" in result.summary() and "<table>" in result._repr_html_()
    # On a CPU the accelerator metrics do not apply, and the line says so instead of a "utilization".
    assert (
        "input efficiency" in result.summary()
        and "CPU only: accelerator busy % and MFU do not apply" in result.summary()
        and "utilization" not in result.summary()
    )
    assert result.to_dict()["metrics"]["before"]["accelerator"] == "cpu"


def test_sequential(cpu_hardware):
    model = keras.Sequential(
        [keras.Input((12, 12, 3)), keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    result = tfopt.apply(model, make_images(), recipes=[MixedPrecision()], hardware=cpu_hardware, **FAST)
    assert result.model.layers[-1].compute_dtype == "float32"
    assert result.after.real.examples_per_second > 0


class TwoHeads(keras.Model):
    def __init__(self):
        super().__init__()
        self.conv = keras.layers.Conv2D(4, 3, activation="relu")
        self.out = keras.layers.Dense(3, activation="softmax")

    def call(self, inputs):
        return self.out(keras.ops.mean(self.conv(inputs), axis=(1, 2)))


def test_subclassed_with_model_fn(cpu_hardware):
    user_model = TwoHeads()
    user_model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    user_model(np.zeros((1, 12, 12, 3), "float32"))
    result = tfopt.apply(user_model, make_images(), model_fn=TwoHeads, hardware=cpu_hardware, **FAST)
    assert result.model(np.zeros((2, 12, 12, 3), "float32")).dtype == "float32"
    for mine, theirs in zip(user_model.get_weights(), result.model.get_weights()):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.slow
def test_resnet50_small(cpu_hardware):
    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=3)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    result = tfopt.apply(
        model,
        make_images(count=8, image_size=32, batch_size=4),
        recipes=BF16_AS_ASKED,
        hardware=cpu_hardware,
        measure_speed=False,
    )  # what is built is checked, not its speed
    assert result.plan.dtype_policy == "mixed_bfloat16"
    assert result.model.get_layer("conv1_conv").compute_dtype == "bfloat16"
    assert np.isfinite(result.model.fit(result.dataset, steps_per_epoch=1, verbose=0).history["loss"][0])


def test_without_measuring(cpu_hardware):
    result = tfopt.apply(make_cnn(), make_images(), measure_speed=False, hardware=cpu_hardware)
    assert result.before is None and result.speedup is None and "not measured" in result.summary()
    # print(result) and print(result.plan) once printed the whole sample batch tensor
    text = repr(result)
    assert text.startswith(
        "ApplyResult(applied data_pipeline, mixed_precision, fused_layers as planned, not measured "
        "(measure_speed=False): none was timed against your setup; model='tiny_cnn', Plan(batch_size=8"
    )
    assert len(text.splitlines()) == 5 and "tf.Tensor" not in text and len(text) < 1500  # a line per step, no tensor


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: tfopt.apply("model", make_images()), IncompatibleModelError, "Expected a keras.Model"),
        (lambda: tfopt.apply(make_cnn(), [1, 2, 3]), DataError, "Expected a tf.data.Dataset"),
        (
            lambda: tfopt.apply(make_cnn(), make_images(), recipes=["mixed_precison"]),
            RecipeConfigError,
            "Did you mean 'mixed_precision'",
        ),
        (lambda: tfopt.apply(make_cnn(), make_images(), recipes=["xla", "xla"]), RecipeClashError, "appears twice"),
        (lambda: tfopt.apply(make_cnn(), make_images(), recipes="fast"), RecipeConfigError, "Pass 'default'"),
        (
            lambda: tfopt.apply(make_cnn(), make_images(), steps=1),
            RecipeConfigError,
            "steps=1 must be a whole number >= 2",
        ),
        (lambda: tfopt.apply(make_cnn(), make_images(), steps=2.5), RecipeConfigError, "steps=2.5 must be a whole"),
        (lambda: tfopt.apply(make_cnn(), make_images(), warmup_steps="2"), RecipeConfigError, "warmup_steps='2'"),
        (lambda: tfopt.apply(make_cnn(), make_images(), hardware="gpu"), RecipeConfigError, "not a tfopt.hardware"),
        (lambda: tfopt.apply(make_cnn(), make_images(), compile="adam"), RecipeConfigError, "must be a dict of Keras"),
    ],
)
def test_bad_input_is_one_clear_error(call, error, words, cpu_hardware):
    with pytest.raises(error, match=words):
        call()


def test_yaml_style_items(cpu_hardware):
    result = tfopt.apply(
        make_cnn(),
        make_images(),
        recipes=[{"mixed_precision": {"policy": "float32"}}, "xla"],
        measure_speed=False,
        hardware=cpu_hardware,
    )
    assert result.plan.dtype_policy == "float32"
    assert [step.skipped for step in result.plan.applied] == [True, True]


def test_training_the_result(cpu_hardware):
    result = tfopt.apply(make_cnn(), make_images(), measure_speed=False, hardware=cpu_hardware)
    history = result.model.fit(result.dataset, epochs=2, verbose=0)
    assert all(np.isfinite(history.history["loss"]))
    assert isinstance(result.dataset, tf.data.Dataset)


def test_the_model_given_back_fits_a_pipeline_of_unknown_length_as_plain_keras_does():
    """Keras' step does other work where a pipeline of unknown length with a fixed batch size runs out (its loss
    mean counts one batch more, its step count one more each epoch); a copy whose step tfopt had traced on a
    batch of unknown size did not, and its Adam moved otherwise from the second epoch on."""
    from tests.conftest import FAKE_HARDWARE

    features = np.random.default_rng(0).standard_normal((40, 4)).astype("float32")

    def data():
        dataset = tf.data.Dataset.from_tensor_slices((features, np.arange(40) % 3)).filter(lambda x, y: True)
        return dataset.batch(6, drop_remainder=True)

    def model():
        keras.utils.set_random_seed(0)
        made = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        made.compile("adam", "sparse_categorical_crossentropy")
        return made

    plain = model()
    theirs = plain.fit(data(), epochs=2, verbose=0).history["loss"]
    copy = tfopt.apply(model(), data(), recipes=[], hardware=FAKE_HARDWARE["cpu_plain"], measure_speed=False).model
    mine = copy.fit(data(), epochs=2, verbose=0).history["loss"]
    assert mine == theirs and int(copy.optimizer.iterations) == int(plain.optimizer.iterations)
    for a, b in zip(copy.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_profiled_apply_has_a_report(cpu_hardware, tmp_path):
    result = tfopt.apply(
        make_cnn(),
        make_images(count=64),
        profile=True,
        logdir=str(tmp_path),
        hardware=cpu_hardware,
        steps=4,
        warmup_steps=1,
    )
    assert result.before is result.before_profile.measurement and result.after is result.after_profile.measurement
    assert list((tmp_path / "before").rglob("*.xplane.pb")) and list((tmp_path / "after").rglob("*.xplane.pb"))
    report = result.report()
    data = report.to_dict()
    assert json.loads(report.to_json()) == json.loads(json.dumps(data))
    report.save(tmp_path / "report.html")
    assert (tmp_path / "report.html").read_text().count("<img") >= 2


def test_a_logdir_that_is_a_file_fails_before_anything_is_built(cpu_hardware, tmp_path, monkeypatch):
    import tfopt.optimize

    monkeypatch.setattr(tfopt.optimize, "make_plan", None)  # nothing may be planned, built or measured
    (tmp_path / "traces").write_text("mine\n")
    with pytest.raises(tfopt.StorageError, match="traces is a file, not a directory"):
        tfopt.apply(make_cnn(), make_images(), hardware=cpu_hardware, profile=True, logdir=str(tmp_path / "traces"))
    assert (tmp_path / "traces").read_text() == "mine\n"


def test_report_without_profiles_is_a_clear_error(cpu_hardware):
    result = tfopt.apply(make_cnn(), make_images(), measure_speed=False, hardware=cpu_hardware)
    with pytest.raises(TfoptError, match="profile=True"):
        result.report()


def test_one_device_distribution_measures_under_its_strategy(cpu_hardware):
    """docs/recipes/distribution.md's snippet with strategy one_device: measuring, restoring and building
    touch the optimizer's variables, which must happen inside the strategy's scope ("Need to be inside
    `with strategy.scope()`" on the H100). With faked CPU hardware one_device is this machine's first
    device: its CPU here, the GPU on a GPU machine."""
    result = tfopt.apply(
        make_cnn(),
        make_images(),
        recipes=[{"distribution": {"strategy": "one_device"}}],
        hardware=cpu_hardware,
        steps=2,
        warmup_steps=1,
    )
    assert isinstance(result.strategy, tf.distribute.OneDeviceStrategy)
    assert result.plan.strategy == "one_device" and result.plan.applied[-1].recipe == "distribution"
    assert not result.plan.applied[-1].skipped and result.plan.batch_size == 8  # one replica: batch kept
    assert result.model.distribute_strategy is result.strategy
    assert result.before.real.steps >= 2 and result.after.real.steps >= 2
    assert int(result.model.optimizer.iterations) == 0  # measured, then restored under the strategy
    assert np.isfinite(result.model.fit(result.dataset, steps_per_epoch=2, verbose=0).history["loss"][0])


def test_a_second_apply_in_a_notebook_measures_the_users_tf32_baseline(tf32_as_tensorflow_starts):
    """On a faked H100: the first apply turns TF32 off for its model (mixed_precision tf32: false), which
    keeps it off to train; the second apply's baseline is still the user's TF32 float32, and says so."""
    from tests.conftest import FAKE_HARDWARE

    h100 = FAKE_HARDWARE["h100"]
    ieee = [{"mixed_precision": {"policy": "float32", "tf32": False}}]
    first = tfopt.apply(make_cnn(), make_images(), recipes=ieee, hardware=h100, measure_speed=False)
    assert first.plan.tf32 is False and not tf.config.experimental.tensor_float_32_execution_enabled()
    second = tfopt.apply(make_cnn(), make_images(), recipes=ieee, hardware=h100, **FAST)
    assert second.baseline_plan.tf32 is True
    assert str(second.baseline_plan.applied[0]).startswith("baseline: float32 baseline: TF32 on this GPU")
    assert str(second.plan.applied[0]) == str(second.baseline_plan.applied[0])  # the report's first line
    assert not tf.config.experimental.tensor_float_32_execution_enabled()  # the result trains as planned


def test_a_recipe_that_cannot_serve_the_plan_fails_before_anything_is_built(cpu_hardware):
    builds = []
    with pytest.raises(RecipeConfigError, match="strategy='tpu' but no TPU"):
        tfopt.apply(
            None,
            make_images(),
            recipes=[{"distribution": {"strategy": "tpu"}}],
            hardware=cpu_hardware,
            model_fn=lambda: builds.append(1) or make_cnn(compiled=False),
            compile={"optimizer": "sgd", "loss": "sparse_categorical_crossentropy"},
        )
    assert builds == []


def test_a_failed_apply_gives_the_user_back_their_tf32_setting(tf32_as_tensorflow_starts):
    """On a faked A100, the optimized build (TF32 off for it) fails: TF32 is on again, as the user had it."""
    import tfopt.policies
    from tests.conftest import FAKE_HARDWARE

    builds = []

    def model_fn():
        builds.append(1)
        if len(builds) == 2:
            assert not tf.config.experimental.tensor_float_32_execution_enabled()  # the build switched it
            raise RuntimeError("out of host memory")
        return make_cnn(compiled=False)

    with pytest.raises(IncompatibleModelError, match="out of host memory"):
        tfopt.apply(
            None,
            make_images(),
            recipes=[{"mixed_precision": {"policy": "float32", "tf32": False}}],
            hardware=FAKE_HARDWARE["a100"],
            model_fn=model_fn,
            steps=2,
            warmup_steps=1,
            compile={"optimizer": "sgd", "loss": "sparse_categorical_crossentropy"},
        )
    assert len(builds) == 2 and tf.config.experimental.tensor_float_32_execution_enabled()
    assert tfopt.policies._users_tf32_before_build is None


def test_a_failed_apply_leaves_the_tf32_an_earlier_result_trains_under(tf32_as_tensorflow_starts):
    """A first result turned TF32 off to train under it; a second apply that fails must not turn it on again."""
    from tests.conftest import FAKE_HARDWARE

    ieee = [{"mixed_precision": {"policy": "float32", "tf32": False}}]
    tfopt.apply(make_cnn(), make_images(), recipes=ieee, hardware=FAKE_HARDWARE["h100"], measure_speed=False)
    with pytest.raises(IncompatibleModelError):
        tfopt.apply(None, make_images(), hardware=FAKE_HARDWARE["h100"], model_fn=lambda: 1 / 0, compile={})
    assert not tf.config.experimental.tensor_float_32_execution_enabled()


def test_an_unbatched_dataset_is_named_so_where_a_recipes_check_meets_it_first(monkeypatch, cpu_hardware):
    """A distribution over two replicas rebatches while it is checked, before the first batch's check could say
    what is wrong: the error is the same "not batched" one, not the rebatch's bare ValueError."""
    from tfopt.recipes import distribution

    monkeypatch.setattr(distribution, "_check_devices_exist", lambda devices: None)  # two CPUs, as on a host
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    unbatched = tf.data.Dataset.from_tensor_slices((np.zeros((16, 8), "float32"), np.zeros(16, "int32")))
    recipes = [{"distribution": {"strategy": "mirrored", "devices": ["/cpu:0", "/cpu:1"]}}, "data_pipeline"]
    with pytest.raises(DataError, match=r"The dataset is not batched: its inputs have shape \(8,\) per element"):
        tfopt.apply(model, unbatched, recipes, hardware=cpu_hardware, measure_speed=False)


def test_a_pipeline_that_cannot_be_read_twice_is_named_with_its_fix(cpu_hardware):
    """from_generator handing out one generator object: a pass spends it, and tfopt's measurements read the
    pipeline again. It said "Reading the first batch failed: StopIteration"."""
    rng = np.random.default_rng(0)
    examples = iter([(rng.random(4, dtype=np.float32), np.float32(index)) for index in range(24)])
    signature = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((), tf.float32))
    data = tf.data.Dataset.from_generator(lambda: examples, output_signature=signature).batch(8)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(DataError, match=r"cannot be read twice .*\(from_generator\(make_examples\)"):
        tfopt.apply(model, data, hardware=cpu_hardware, steps=2, warmup_steps=1)
