"""XLA is set explicitly, left off on CPU by 'auto', and refused with the layer named when unsupported."""

import keras
import numpy as np
import pytest

from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tfopt.builder import build
from tfopt.plan import make_plan
from tfopt.recipes.xla import Xla, xla_blockers


class NoJitLayer(keras.layers.Layer):
    """A layer that declares it cannot be compiled with XLA, as TextVectorization does."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False

    def call(self, inputs):
        return inputs


def model_with_unsupported_layer():
    inputs = keras.Input((12, 12, 3))
    x = NoJitLayer(name="no_jit")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize("machine", ["cpu_bf16", "cpu_plain"])
def test_auto_is_off_on_cpu_with_reason(machine):
    hardware = FAKE_HARDWARE[machine]
    plan = Xla()(make_plan(make_cnn(), make_images(), hardware=hardware))
    assert plan.jit_compile is False
    detail = plan.applied[-1].detail
    assert plan.applied[-1].skipped and f"no GPU or TPU ({hardware.describe()})" in detail
    # The plan once claimed "XLA measured about 2x slower on CPU" on every machine: a figure from one.
    assert "measured" not in detail and "2x" not in detail and "jit_compile: true" in detail


@pytest.mark.parametrize("machine", ["a100", "tpu"])
def test_auto_is_on_for_accelerators(machine):
    plan = Xla()(make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE[machine]))
    assert plan.jit_compile is True and plan.compile_config["jit_compile"] is True


def test_forced_xla_compiles_and_trains_on_cpu(cpu_hardware):
    plan = Xla(jit_compile=True)(make_plan(make_cnn(), make_images(), hardware=cpu_hardware))
    model = build(plan).model
    assert model.jit_compile is True
    loss = model.fit(make_images(), epochs=1, verbose=0).history["loss"][0]
    assert np.isfinite(loss)


def test_unsupported_layer_is_named_and_xla_stays_off():
    plan = Xla()(make_plan(model_with_unsupported_layer(), make_images(), hardware=FAKE_HARDWARE["a100"]))
    assert plan.jit_compile is False
    assert "'no_jit' (NoJitLayer)" in plan.applied[-1].detail


def test_op_without_xla_kernel_is_reported():
    inputs = keras.Input((4,))
    outputs = keras.layers.Lambda(lambda x: keras.ops.cast(
        keras.ops.convert_to_tensor(__import__("tensorflow").strings.as_string(x)) != "", "float32"))(inputs)
    model = keras.Model(inputs, outputs)
    blockers = xla_blockers(model, np.zeros((2, 4), "float32"))
    assert len(blockers) == 1 and "XLA could not compile" in blockers[0]


def test_off_is_explicit_false(cpu_hardware):
    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware)
    assert plan.compile_config["jit_compile"] is False  # the honest baseline
    assert Xla(jit_compile=False)(plan).compile_config["jit_compile"] is False
