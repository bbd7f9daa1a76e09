"""make_plan accepts what it should and rejects bad input with a message naming the fix."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import make_cnn, make_images
from tfopt.errors import DataError, IncompatibleModelError
from tfopt.plan import make_plan


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3, activation="softmax")

    def call(self, inputs):
        return self.dense(keras.ops.mean(inputs, axis=(1, 2)))


def test_baseline_plan(cpu_hardware):
    plan = make_plan(make_cnn(), make_images(batch_size=8), hardware=cpu_hardware)
    assert plan.batch_size == 8
    assert plan.dtype_policy == "float32" and plan.strategy == "default"
    assert plan.compile_config["jit_compile"] is False
    assert plan.sample_inputs.shape == (8, 12, 12, 3)
    assert plan.applied == ()


def test_repr_shows_decisions_not_tensors(cpu_hardware):
    plan = make_plan(make_cnn(), make_images(batch_size=8), hardware=cpu_hardware)
    plan = plan.replace(dtype_policy="mixed_bfloat16").record("mixed_precision", "bf16: the CPU has it")
    text = repr(plan)
    assert text.splitlines() == [
        "Plan(batch_size=8, dtype_policy='mixed_bfloat16', jit_compile=False, strategy='default', "
        f"hardware={cpu_hardware.describe()!r}, applied=1 steps)",
        "  mixed_precision: bf16: the CPU has it",
    ]
    assert "tf.Tensor" not in text and "array" not in text


def test_plan_is_immutable(cpu_hardware):
    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware)
    with pytest.raises(AttributeError):
        plan.dtype_policy = "mixed_bfloat16"
    with pytest.raises(TypeError):
        plan.compile_config["jit_compile"] = True


@pytest.mark.parametrize(
    "bad_model, words",
    [
        (object(), "Expected a keras.Model"),
        (None, "model=None"),
    ],
)
def test_not_a_model(bad_model, words, cpu_hardware):
    with pytest.raises(IncompatibleModelError, match=words):
        make_plan(bad_model, make_images(), hardware=cpu_hardware)


def test_subclassed_model_is_copied_with_its_class(cpu_hardware):
    model = Subclassed()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    plan = make_plan(model, make_images(), hardware=cpu_hardware)
    twin = plan.model_fn()
    assert type(twin) is Subclassed and twin is not model


def test_uncompiled_model(cpu_hardware):
    with pytest.raises(IncompatibleModelError, match=r"model.compile\(optimizer"):
        make_plan(make_cnn(compiled=False), make_images(), hardware=cpu_hardware)


@pytest.mark.parametrize(
    "dataset, error, words",
    [
        (np.zeros((4, 12, 12, 3)), DataError, "Expected a tf.data.Dataset"),
        (
            tf.data.Dataset.from_tensor_slices((np.zeros((0, 12, 12, 3), "float32"), np.zeros(0))).batch(2),
            DataError,
            "empty",
        ),
        (
            tf.data.Dataset.from_tensor_slices(tuple(np.zeros((4, 2), "float32") for _ in range(4))).batch(2),
            DataError,
            r"tuple of 4; Keras' fit\(\) takes inputs, \(inputs, targets\)",
        ),
    ],
)
def test_bad_datasets(dataset, error, words, cpu_hardware):
    with pytest.raises(error, match=words):
        make_plan(make_cnn(), dataset, hardware=cpu_hardware)


def test_compile_override(cpu_hardware):
    plan = make_plan(
        make_cnn(compiled=False),
        make_images(),
        hardware=cpu_hardware,
        compile={"optimizer": keras.optimizers.SGD(0.1), "loss": "sparse_categorical_crossentropy"},
    )
    assert plan.compile_config["optimizer"]["class_name"] == "SGD"
    with pytest.raises(IncompatibleModelError, match="compile= needs at least 'optimizer'"):
        make_plan(make_cnn(), make_images(), hardware=cpu_hardware, compile={"loss": "mse"})
    assert float(plan.compile_objects["optimizer"].learning_rate) == pytest.approx(0.1)


def _tf32_on() -> bool:
    return bool(tf.config.experimental.tensor_float_32_execution_enabled())


def test_a_build_that_turns_tf32_off_leaves_the_next_baseline_the_users(tf32_as_tensorflow_starts):
    """A notebook: apply with mixed_precision tf32: false, train the result, then plan again. The result's
    model trains in IEEE float32, and the next baseline is still the user's TF32 float32, with its note."""
    from tests.conftest import FAKE_HARDWARE
    from tfopt.builder import build
    from tfopt.policies import users_tf32_setting
    from tfopt.recipes import MixedPrecision

    a100 = FAKE_HARDWARE["a100"]
    first = make_plan(make_cnn(), make_images(), hardware=a100)
    assert first.tf32 is True and first.applied[0].detail.startswith(
        "float32 baseline: TF32 on this GPU (compute capability 8.0 >= 8.0"
    )
    build(MixedPrecision(policy="float32", tf32=False)(first))
    assert not _tf32_on() and users_tf32_setting() is True  # off for the model to train; the user's is on
    again = make_plan(make_cnn(), make_images(), hardware=a100)
    assert again.tf32 is True and again.applied == first.applied
    build(again)  # the baseline is built (and measured) with the user's TF32 again
    assert _tf32_on() and users_tf32_setting() is True


def test_the_users_own_tf32_setting_is_the_baseline(tf32_as_tensorflow_starts):
    from tests.conftest import FAKE_HARDWARE
    from tfopt.builder import build
    from tfopt.policies import users_tf32_setting
    from tfopt.recipes import MixedPrecision

    h100 = FAKE_HARDWARE["h100"]
    tf.config.experimental.enable_tensor_float_32_execution(False)  # the user's choice: IEEE float32
    ieee = make_plan(make_cnn(), make_images(), hardware=h100)
    assert ieee.tf32 is False and ieee.applied == ()  # no TF32 note: the baseline is IEEE float32
    build(MixedPrecision(policy="float32", tf32=True)(ieee))
    assert _tf32_on() and users_tf32_setting() is False
    assert make_plan(make_cnn(), make_images(), hardware=h100).tf32 is False
    tf.config.experimental.enable_tensor_float_32_execution(False)  # the user switches it back: as before
    build(make_plan(make_cnn(), make_images(), hardware=h100))
    assert not _tf32_on() and users_tf32_setting() is False


def test_a_step_amended_with_what_it_says_already_stays_as_it_is(cpu_hardware):
    """A setup built again from a built plan (mixed precision left out) makes the build's amendments again."""
    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware).record("fused_layers", "rewritten")
    once = plan.amend("fused_layers", "batch_norm in 1 layer(s): bn; conv_bias in 1 layer(s)")
    assert once.amend("fused_layers", "batch_norm in 1 layer(s): bn; conv_bias in 1 layer(s)") is once
    twice = once.amend("fused_layers", "conv_bias")  # a part of a detail is not the detail
    assert twice.applied[-1].detail.endswith("; conv_bias in 1 layer(s); conv_bias")
