"""The model layer by layer, from captures Keras' TensorBoard callback makes here (one layer far heavier
than the rest, auto-named layers) and from the real GPU captures; and each layer's FLOPs and bytes."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.hardware import Gpu, Hardware
from tfopt.profiling.analyze import find_xplane
from tfopt.profiling.layer_cost import layer_costs
from tfopt.profiling.layers import layer_times
from tfopt.profiling.trace import trace_breakdown, trace_gpus

# On a GPU the kernels of a 512-wide Dense take about a launch's time, as the light layer's do: there the
# heavy layers are made wide enough for their FLOPs to show.
ON_GPU = bool(tf.config.list_physical_devices("GPU"))
WIDTH = 8192 if ON_GPU else 512


def heavy_middle_model() -> keras.Model:
    """Three auto-named Dense layers; the middle one does most of the FLOPs. Without XLA, whose fusions span
    layers (the GPU captures of test_gpu_fixtures.py read those): each op runs in its layer's scope."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32,))
    hidden = keras.layers.Dense(WIDTH, activation="relu")(inputs)
    hidden = keras.layers.Dense(WIDTH, activation="relu")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile("sgd", "mse", jit_compile=False)
    return model


@pytest.fixture(scope="module")
def heavy_capture(tmp_path_factory):
    model = heavy_middle_model()
    data = tf.data.Dataset.from_tensor_slices((np.ones((512, 32), np.float32), np.ones((512, 1), np.float32)))
    logdir = tmp_path_factory.mktemp("layers")
    callback = keras.callbacks.TensorBoard(log_dir=str(logdir), profile_batch=(3, 6), write_graph=False)
    model.fit(data.batch(64).cache().repeat(), steps_per_epoch=8, epochs=1, verbose=0, callbacks=[callback])
    return model, find_xplane(logdir)


@pytest.mark.slow
def test_the_heavy_layer_comes_first_under_its_own_name(heavy_capture):
    model, xplane = heavy_capture
    # auto-named in creation order (`dense_4`, `dense_5`, ... where other models came first in the process)
    first, middle, last = (layer.name for layer in model.layers[1:])
    device = "GPU" if ON_GPU else "CPU"
    for given in (model, None):  # the scopes resolve to the same names with or without the model
        table = layer_times(xplane, model=given, batch_size=64)
        assert table.device == device and table.steps == 4  # profile_batch=(3, 6)
        assert table.top.layer == middle and table.layers[0] is table.top
        names = [layer.layer for layer in table.layers]
        assert {first, middle, last, f"({model.optimizer.name})", "(compile_loss)"} <= set(names)
        assert not any(name.startswith("(") for name in names[:3])  # Keras layers before other scopes
        heavy, light = (next(layer for layer in table.layers if layer.layer == name) for name in (middle, last))
        # The light layer's time is mostly its ops' fixed cost on a CPU: far from the FLOPs' ratio, and a loaded
        # 2-core host has read it at 4.9x (and the heavy layer's share of all device time at 0.23, the input
        # pipeline's ops taking more of it there).
        assert heavy.seconds_per_step > 3 * light.seconds_per_step
        assert heavy.share_of_device > 3 * light.share_of_device and heavy.share_of_device > 0.15
        assert heavy.matmul_share > 0.7 and 0.3 < heavy.backward_share < 0.95
        if device == "CPU":
            assert table.share_of_step(heavy) is None  # host ops overlap on a CPU: no share of the wall step
        assert sum(layer.share_of_device for layer in table.layers) == pytest.approx(1.0)
    with_model = layer_times(xplane, model=model, batch_size=64)
    assert with_model.top.flops_per_step == pytest.approx(3 * 2 * 64 * WIDTH * WIDTH)
    assert with_model.top.intensity > 10 and with_model.top.bound is None  # no hardware given: no ridge point
    assert layer_times(xplane).top.flops_per_step is None


def test_layer_costs_from_weights_and_shapes():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    features = keras.layers.Conv2D(8, 3, padding="same", name="conv")(inputs)
    pooled = keras.layers.GlobalAveragePooling2D(name="pool")(features)
    model = keras.Model(inputs, keras.layers.Dense(4, name="logits")(pooled))
    costs, unknown = layer_costs(model, batch_size=2)
    assert unknown == []
    conv_flops, conv_bytes = costs["conv"]
    assert conv_flops == 3 * 2 * (2 * 16 * 16 * 8) * (3 * 3 * 3)  # multiply-adds per output element: 3x3x3
    assert conv_bytes == 3 * ((2 * 16 * 16 * 3 + 2 * 16 * 16 * 8) * 4 + (3 * 3 * 3 * 8 + 8) * 4)
    assert costs["logits"][0] == 3 * 2 * 2 * 8 * 4
    assert costs["pool"][0] == 3 * 2 * 16 * 16 * 8  # no weights: one FLOP per input element


def test_layers_of_a_subclassed_model_have_no_cost_but_are_named():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(8, name="hidden")

        def call(self, inputs):
            return self.hidden(inputs)

    model = Net()
    model(np.ones((2, 4), np.float32))
    assert layer_costs(model, batch_size=2) == ({}, ["hidden"])


@pytest.mark.parametrize(
    "case, recipe",
    [
        ("heavy_conv_fp32", "mixed_precision"),
        ("heavy_conv_bf16_xla", None),
        ("elementwise_chain_fp32", "xla"),
        ("lstm_fp32", "mixed_precision"),
    ],
)
def test_gpu_captures_with_a_planted_layer(unpack_capture, case, recipe):
    """H200 captures by Keras' TensorBoard callback (tests/fixtures/gpu-planted): the planted layer comes
    first, with the fix its kernels call for."""
    logdir = unpack_capture("gpu-planted", case)
    truth = json.loads((logdir / "case.json").read_text())
    xplane = find_xplane(logdir)
    (gpu,) = trace_gpus(xplane)
    table = layer_times(xplane, step_seconds=trace_breakdown(xplane).step_seconds_mean, hardware=Hardware(gpus=(gpu,)))
    top = table.top
    assert table.device == "GPU" and top.layer == truth["planted"]["layer"]
    assert top.layer in truth["layers"] and top.recipe == recipe
    assert top.share_of_device > 0.4 and 0 < table.share_of_step(top) < 1
    if truth["policy"] == "mixed_bfloat16":
        assert top.sixteen_bit_share == pytest.approx(1.0) and top.matmul_share > 0.9
    elif case == "elementwise_chain_fp32":
        assert top.matmul_share == 0.0 and {"Tanh", "TanhGrad", "Mul"} <= {op for op, _ in top.op_types}
    else:
        assert top.sixteen_bit_share == 0.0 and top.matmul_share > 0.7


def test_the_h100_resnet_layers_are_resnets(unpack_capture):
    logdir = unpack_capture("gpu-h100", "resnet_small_batch_fp32")
    table = layer_times(find_xplane(logdir))
    layers = {layer.layer for layer in table.layers}
    # ResNet-50's own layer names, with TensorFlow's `_1` scope suffix dropped
    assert {"conv1_conv", "conv1_bn", "conv5_block3_3_conv", "predictions", "(sgd)"} <= layers
    assert not any(name.endswith("_1") and name[:-2] in layers for name in layers)
    convolutions = [layer for layer in table.layers if layer.layer.endswith("_conv")]
    assert len(convolutions) == 53 and all(layer.matmul_share > 0.5 for layer in convolutions)


def test_ridge_point_from_the_same_table_as_peak_flops():
    from tfopt.profiling.peak_flops import memory_bandwidth_bytes_per_second, peak_flops_per_second

    h100 = Hardware(gpus=(Gpu("NVIDIA H100 80GB HBM3", (9, 0)),))
    ridge = peak_flops_per_second(h100, "bf16") / memory_bandwidth_bytes_per_second(h100)
    assert ridge == pytest.approx(989.4 / 3.35, rel=1e-9)
    assert memory_bandwidth_bytes_per_second(Hardware()) is None


@pytest.mark.slow
def test_a_nested_models_heavy_layer_is_named_inside_it(tmp_path):
    keras.utils.set_random_seed(0)
    features = WIDTH // 32
    backbone = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(4 * WIDTH, name="deep_big"),
            # One output: at 16 (with WIDTH // 32 = 16 features on a CPU) it did deep_big's work and more (its input
            # gradient too), and the heavier of the two was the machine's noise.
            keras.layers.Dense(1, name="deep_small"),
        ],
        name="backbone",
    )
    inputs = keras.Input((features,))
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(backbone(inputs)))
    model.compile("sgd", "mse", jit_compile=False)
    data = tf.data.Dataset.from_tensor_slices((np.ones((256, features), np.float32), np.ones((256, 1), np.float32)))
    callback = keras.callbacks.TensorBoard(log_dir=str(tmp_path), profile_batch=(3, 5), write_graph=False)
    model.fit(data.batch(64).cache().repeat(), steps_per_epoch=6, epochs=1, verbose=0, callbacks=[callback])
    table = layer_times(find_xplane(tmp_path))
    # Keras' own top-level layer, and the layer inside it that holds its time
    assert table.top.layer == "backbone" and table.top.heaviest_sublayer == "deep_big"
    assert "heaviest layer: backbone (mostly its deep_big)" in table.top_line()
    assert next(layer for layer in table.layers if layer.layer == "out").heaviest_sublayer is None
