"""Shared fixtures: faked hardware descriptions, tiny models and small generated datasets."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from tfopt.hardware import Gpu, Hardware

GIB = 2**30

# What detect() would return on the machines tfopt must decide for, none of which the tests have.
FAKE_HARDWARE = {
    "v100": Hardware(
        gpus=(Gpu("Tesla V100-SXM2-16GB", (7, 0), 16 * GIB),),
        cpu_model="Intel Xeon",
        cpu_flags=frozenset({"avx2", "avx512f"}),
        cpu_count=8,
        host_memory_bytes=64 * GIB,
    ),
    "t4": Hardware(
        gpus=(Gpu("Tesla T4", (7, 5), 15 * GIB),),
        cpu_model="Intel Xeon",
        cpu_flags=frozenset({"avx2"}),
        cpu_count=4,
        host_memory_bytes=16 * GIB,
    ),
    "a100": Hardware(
        gpus=(Gpu("NVIDIA A100-SXM4-40GB", (8, 0), 40 * GIB),) * 2,
        cpu_model="AMD EPYC",
        cpu_flags=frozenset({"avx2"}),
        cpu_count=32,
        host_memory_bytes=256 * GIB,
    ),
    "h100": Hardware(
        gpus=(Gpu("NVIDIA H100 80GB HBM3", (9, 0), 80 * GIB),),
        cpu_model="Intel Xeon Platinum",
        cpu_flags=frozenset({"avx512f", "amx_bf16", "amx_tile"}),
        cpu_count=64,
        host_memory_bytes=512 * GIB,
    ),
    "k80": Hardware(
        gpus=(Gpu("Tesla K80", (3, 7), 12 * GIB),),
        cpu_model="Intel Xeon",
        cpu_flags=frozenset({"avx2"}),
        cpu_count=4,
        host_memory_bytes=32 * GIB,
    ),
    "tpu": Hardware(
        tpu_cores=8, cpu_model="AMD EPYC", cpu_flags=frozenset({"avx2"}), cpu_count=96, host_memory_bytes=300 * GIB
    ),
    "cpu_bf16": Hardware(
        cpu_model="AMD EPYC", cpu_flags=frozenset({"avx512f", "avx512_bf16"}), cpu_count=2, host_memory_bytes=24 * GIB
    ),
    "cpu_plain": Hardware(
        cpu_model="Intel Core i5", cpu_flags=frozenset({"avx2", "fma"}), cpu_count=4, host_memory_bytes=16 * GIB
    ),
}


@pytest.fixture(params=sorted(FAKE_HARDWARE))
def any_hardware(request):
    return FAKE_HARDWARE[request.param]


@pytest.fixture
def cpu_hardware():
    """This project's CPU as described, fixed so tests do not depend on which machine runs them."""
    return FAKE_HARDWARE["cpu_bf16"]


def make_cnn(num_classes=3, image_size=12, compiled=True):
    """A tiny Functional CNN: fast to build and train, with a softmax output layer."""
    import keras

    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax")(x)
    model = keras.Model(inputs, outputs, name="tiny_cnn")
    if compiled:
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
        )
    return model


def make_images(count=32, image_size=12, num_classes=3, batch_size=8, seed=0):
    """A small batched image dataset with labels; deterministic for a seed."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    images = rng.random((count, image_size, image_size, 3), dtype=np.float32)
    labels = rng.integers(0, num_classes, count).astype("int32")
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch_size)


@pytest.fixture
def tf32_as_tensorflow_starts(monkeypatch):
    """TensorFlow's TF32 switch as a process starts (on) and no setting left by an earlier build; the switch
    and what tfopt.policies remembered are restored afterwards."""
    import tensorflow as tf

    import tfopt.policies

    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    monkeypatch.setattr(tfopt.policies, "_users_tf32_before_build", None)
    tf.config.experimental.enable_tensor_float_32_execution(True)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(previous)


@pytest.fixture
def ieee_float32():
    """For tests comparing two float32 computations to ~1e-5: on GPUs of compute capability 8.0+ TensorFlow
    runs float32 matmuls and convolutions in TF32 (10-bit mantissa, ~1e-3 relative), so these run in IEEE
    float32. No effect on a CPU."""
    from tfopt.recipes.mixed_precision import float32_matmul_scope

    with float32_matmul_scope(tf32=False):
        yield


@pytest.fixture
def tiny_cnn():
    return make_cnn()


@pytest.fixture
def tiny_images():
    return make_images()
