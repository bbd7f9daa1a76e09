"""The fused_layers recipe: the build rewrites the copy's BatchNormalization layers, says which, trains as plain
Keras does, and "auto" keeps the rewrite only where it measured faster than the same setup without it."""

import keras
import numpy as np
import pytest

import tfopt
from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tests.same_training import assert_same_training
from tfopt.builder import build
from tfopt.errors import RecipeConfigError
from tfopt.plan import make_plan
from tfopt.profiling.measurement import SideBySide
from tfopt.recipes import FusedLayers
from tfopt.rewrites.batch_norm import FusedBatchNormalization
from tfopt.verdict import built_again, decided_alone

BUILD_ONLY = dict(measure_speed=False)
FORCED = [{"fused_layers": {"batch_norm": True, "conv_bias": True}}]


def cnn(batch_norms=2, use_bias=False):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((12, 12, 3))
    x = inputs
    for index in range(batch_norms):
        x = keras.layers.Conv2D(4, 3, padding="same", use_bias=use_bias, bias_initializer="random_normal")(x)
        x = keras.layers.BatchNormalization(momentum=0.9, name=f"bn{index}")(x)
        x = keras.layers.ReLU()(x)
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy")
    return model


def test_settings_are_checked():
    assert FusedLayers().batch_norm == "auto"
    with pytest.raises(RecipeConfigError, match=r"batch_norm='yes' is not valid\. Expected 'auto', true or false"):
        FusedLayers(batch_norm="yes")
    with pytest.raises(RecipeConfigError, match=r"conv_bias=1 is not valid") as raised:
        FusedLayers(conv_bias=1)
    assert raised.value.setting == "conv_bias"
    assert FusedLayers(batch_norm=True).verified and not FusedLayers(batch_norm=True, conv_bias=False).verified
    plan = make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE["cpu_plain"])
    off = FusedLayers(batch_norm=False, conv_bias=False)(plan)
    assert off.layer_rewrites == () and off.applied[-1].skipped


def test_the_result_trains_as_plain_keras_does_with_its_layers_rewritten():
    user, data = cnn(), make_images(count=48, batch_size=8)
    result = tfopt.apply(user, data, recipes=FORCED, hardware=FAKE_HARDWARE["cpu_plain"], **BUILD_ONLY)
    assert [type(result.model.get_layer(f"bn{index}")) for index in range(2)] == [FusedBatchNormalization] * 2
    assert [type(layer) for layer in user.layers].count(keras.layers.BatchNormalization) == 2  # theirs untouched
    step = next(step for step in result.plan.applied if step.recipe == "fused_layers")
    assert not step.skipped and step.detail.endswith("; batch_norm in 2 layer(s): bn0, bn1")
    # The kernel sums in another order: float32 rounding that grows over 18 steps of SGD with momentum to 4e-5
    # here; a statistic taken differently (the kernel's Bessel-corrected variance) is 1e-2 away.
    assert_same_training(result, user, data, epochs=3, rounding=2e-4)
    for name in ("bn0", "bn1"):  # the moving statistics moved as Keras moves them
        for mine, theirs in zip(result.model.get_layer(name).weights, user.get_layer(name).weights):
            np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=2e-4, atol=2e-5)


def test_under_bfloat16_and_xla_it_learns_as_keras_own_layers_do():
    """The path a GPU keeps: bf16 + XLA forced, with and without the rewrite, from the same start."""
    data = make_images(count=48, batch_size=8)
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}, {"xla": {"jit_compile": True}}]
    histories = []
    for rewritten in (True, False):
        recipes = [*forced, {"fused_layers": {"batch_norm": rewritten, "conv_bias": rewritten}}]
        model = cnn(use_bias=True)
        result = tfopt.apply(model, data, recipes=recipes, hardware=FAKE_HARDWARE["cpu_bf16"], **BUILD_ONLY)
        assert result.plan.jit_compile and result.plan.dtype_policy == "mixed_bfloat16"
        assert (type(result.model.get_layer("bn0")) is FusedBatchNormalization) == rewritten
        assert result.plan.layer_rewrites == (("batch_norm", "conv_bias") if rewritten else ())
        histories.append(result.model.fit(result.dataset, epochs=4, verbose=0, shuffle=False).history["loss"])
    fused, plain = histories
    assert fused[-1] < fused[0] * 0.97  # it learns (random labels: slowly)
    np.testing.assert_allclose(fused, plain, rtol=2e-2)


def test_a_model_without_batch_normalization_has_nothing_to_rewrite():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.ones((8, 2), "float32"))).batch(4)
    result = tfopt.apply(model, data, recipes=FORCED, hardware=FAKE_HARDWARE["cpu_plain"], **BUILD_ONLY)
    step = next(step for step in result.plan.applied if step.recipe == "fused_layers")
    assert step.skipped and step.detail == "no layer to rewrite in this model" and result.plan.layer_rewrites == ()


def test_layers_left_to_keras_are_named_with_why():
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.BatchNormalization(axis=1, name="across_rows")(inputs)
    x = keras.layers.BatchNormalization(name="channels")(x)
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(x)))
    model.compile(optimizer="sgd", loss="mse")
    plan = FusedLayers(batch_norm=True)(
        make_plan(model, make_images(count=8, image_size=6), hardware=FAKE_HARDWARE["cpu_plain"])
    )
    built = build(plan)
    assert type(built.model.get_layer("channels")) is FusedBatchNormalization
    assert built.plan.applied[-1].detail.endswith(
        "; batch_norm in 1 layer(s): channels (left as they are: across_rows: axis=1 is not "
        "the last (channels_first): the fused kernel on CPU takes channels last)"
    )


def test_auto_keeps_the_rewrite_only_where_faster_in_every_round():
    plan = FusedLayers()(make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE["cpu_plain"]))
    rewritten = build(plan)
    pair = (built_again(rewritten, rewritten.plan.replace(layer_rewrites=())), rewritten)
    assert type(pair[0].model.layers[2]) is keras.layers.BatchNormalization and pair[0].dataset is rewritten.dataset
    assert type(pair[1].model.layers[2]) is FusedBatchNormalization

    def measured(faster):
        return SideBySide(measurements=(None, None), rounds=((1.0, 1.0, 1.0), faster))

    sides = [("without fused_layers", pair[0]), ("", pair[1])]
    kept = decided_alone("fused_layers", sides, measured((1.5, 1.4, 1.6)))
    assert kept.model is rewritten.model and kept.plan.layer_rewrites == ("batch_norm",)
    assert "; kept: measured 1.50x [1.40-1.60] over 3 rounds against the same setup without fused_layers" in str(
        kept.plan.applied[-1]
    )
    noisy = decided_alone("fused_layers", sides, measured((1.5, 0.9, 1.6)))
    assert noisy.model is pair[0].model and noisy.plan.layer_rewrites == ()
    step = noisy.plan.applied[-1]
    assert step.skipped and step.detail.startswith("left out: measured 1.50x [0.90-1.60]")
    assert step.detail.endswith("within noise")


def test_the_other_recipes_are_judged_with_the_rewrite_on_both_sides():
    from tfopt.verdict import candidates

    plan = make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE["cpu_bf16"])
    optimized = FusedLayers()(plan.replace(dtype_policy="mixed_bfloat16").record("mixed_precision", "bf16"))
    setups = candidates(build(plan), build(optimized), frozenset({"mixed_precision", "fused_layers"})).setups
    assert list(setups) == ["before", "your numerics", "after"]
    users = setups["your numerics"]
    assert users.plan.dtype_policy == "float32" and users.plan.layer_rewrites == ("batch_norm",)
    assert type(users.model.layers[2]) is FusedBatchNormalization and users.model.layers[2].compute_dtype == "float32"
    assert type(setups["before"].model.layers[2]) is keras.layers.BatchNormalization


def test_the_pipeline_question_does_not_count_the_rewrites_gain():
    """With mixed precision left out, the pipeline rewrite is judged on the model with the user's numerics and
    the rewrites, on both pipelines; left out too, that model on the user's pipeline is given back (not the
    user's own setup, which the rewrites were measured faster than)."""
    from tests.test_fidelity import measured_as
    from tfopt.verdict import candidates, decided

    data = make_images()
    plan = make_plan(make_cnn(), data, hardware=FAKE_HARDWARE["cpu_bf16"])
    tuned = FusedLayers()(plan.replace(dtype_policy="mixed_bfloat16").record("mixed_precision", "bf16"))
    tuned = tuned.record("data_pipeline", "tuned")
    setups = candidates(build(plan), build(tuned), frozenset({"mixed_precision", "data_pipeline", "fused_layers"}))
    names = ["before", "your numerics", "your numerics and pipeline", "your pipeline", "after"]
    assert list(setups.setups) == names
    both = setups.setups["your numerics and pipeline"]
    assert both.model is setups.setups["your numerics"].model and both.plan.dataset is data
    assert type(both.model.layers[2]) is FusedBatchNormalization and both.plan.dtype_policy == "float32"
    # The rewrites made every setup but the user's 1.5x as fast; neither bf16 nor the pipeline adds to that.
    rounds = dict(before=(1.0,) * 3, your_pipeline=(1.5,) * 3, after=(1.5, 1.4, 1.6))
    verdict = decided(
        setups, measured_as(setups, your_numerics=(1.5,) * 3, your_numerics_and_pipeline=(1.5,) * 3, **rounds)
    )
    assert verdict.chosen == "your numerics and pipeline" and verdict.built.model is both.model
    pipeline = next(step for step in verdict.built.plan.applied if step.recipe == "data_pipeline")
    assert pipeline.skipped and pipeline.detail.startswith("left out: measured 1.00x [1.00-1.00]")


def test_a_resnet_style_block_with_biases_folded_learns_as_keras_does():
    """Convolutions with a bias before each BatchNormalization, as keras.applications writes ResNets: both
    rewrites made, the biases (non-zero here) gone into the moving means, the same losses and predictions."""

    def block_model():
        keras.utils.set_random_seed(4)
        inputs = keras.Input((12, 12, 3))
        x = inputs
        for index in range(2):
            x = keras.layers.Conv2D(4, 3, padding="same", bias_initializer="random_normal", name=f"conv{index}")(x)
            x = keras.layers.BatchNormalization(epsilon=1.001e-5, name=f"bn{index}")(x)
            x = keras.layers.Activation("relu")(x)
        outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x))
        model = keras.Model(inputs, outputs)
        model.compile(
            optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    user, data = block_model(), make_images(count=48, batch_size=8)
    result = tfopt.apply(user, data, recipes=FORCED, hardware=FAKE_HARDWARE["cpu_plain"], **BUILD_ONLY)
    step = next(step for step in result.plan.applied if step.recipe == "fused_layers")
    assert step.detail.endswith("batch_norm in 2 layer(s): bn0, bn1; conv_bias in 2 layer(s): conv0, conv1")
    assert result.plan.layer_rewrites == ("batch_norm", "conv_bias")
    assert not result.model.get_layer("conv0").bias.trainable and user.get_layer("conv0").bias.trainable
    mine = result.model.fit(result.dataset, epochs=3, verbose=0, shuffle=False).history["loss"]
    theirs = user.fit(data, epochs=3, verbose=0, shuffle=False).history["loss"]
    np.testing.assert_allclose(mine, theirs, rtol=2e-4)
    images = next(iter(data))[0]
    np.testing.assert_allclose(result.model.predict(images, verbose=0), user.predict(images, verbose=0), atol=2e-4)


MIRRORED = """
import json
import tensorflow as tf

tf.config.set_visible_devices([], "GPU")
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np, tfopt
from tfopt.hardware import Hardware

rng = np.random.default_rng(0)
data = tf.data.Dataset.from_tensor_slices(
    (rng.random((64, 8, 8, 3)).astype("float32"), rng.random((64, 2)).astype("float32"))
).batch(16)
losses, kinds = [], []
for rewritten in (True, False):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.BatchNormalization(momentum=0.8)(keras.layers.Conv2D(4, 3, bias_initializer="ones")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(x)))
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    recipes = [
        {"distribution": {"strategy": "mirrored", "devices": ["/cpu:0", "/cpu:1"], "scale_batch": False}},
        {"fused_layers": {"batch_norm": rewritten, "conv_bias": rewritten}},
    ]
    result = tfopt.apply(model, data, recipes=recipes, hardware=Hardware(cpu_count=2), measure_speed=False)
    strategy = result.strategy
    kinds.append([type(strategy).__name__, strategy.num_replicas_in_sync, list(result.plan.layer_rewrites)])
    losses.append(result.model.fit(result.dataset, epochs=3, verbose=0, shuffle=False).history["loss"])
print("RESULT " + json.dumps({"losses": losses, "kinds": kinds}))
"""


def test_under_a_mirrored_strategy_it_learns_as_keras_own_layers_do():
    """Two replicas (two logical CPUs, in a fresh process): each computes its batch statistics, the moving ones
    are assigned as Keras assigns them, and the losses are plain Keras' under the same strategy. The second
    apply packs its gradients to another size (the bias kept): under a strategy of its own it failed with
    "Shape mismatch in the collective instance 100" (`tfopt.distribute.strategy`)."""
    import json
    import subprocess
    import sys

    from tests.processes import child_environment

    finished = subprocess.run(
        [sys.executable, "-c", MIRRORED], capture_output=True, text=True, env=child_environment(), timeout=300
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    (line,) = [line for line in finished.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    assert result["kinds"] == [["MirroredStrategy", 2, ["batch_norm", "conv_bias"]], ["MirroredStrategy", 2, []]]
    rewritten, plain = result["losses"]
    np.testing.assert_allclose(rewritten, plain, rtol=2e-4)
