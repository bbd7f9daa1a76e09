"""What only a real GPU shows about measurement: the ceiling against real training, the allocator's peak,
device kernels in a capture. They skip on a CPU-only machine with the reason; every decision made from
these numbers is also tested on the real H100 captures (test_gpu_fixtures.py) and with faked hardware."""

from __future__ import annotations

import pytest

from tfopt.hardware import detect

from .conftest import STEPS, WARMUP_STEPS, make_model


@pytest.fixture(scope="module")
def gpu_profile(tmp_path_factory):
    if detect().accelerator != "gpu":
        pytest.skip("needs a GPU: on CPU test_measurement.py and test_gpu_fixtures.py check the same arithmetic")
    import numpy as np
    import tensorflow as tf

    from tfopt.profiling.capture import profile

    features = np.random.default_rng(0).random((2048, 64), dtype=np.float32)
    data = tf.data.Dataset.from_tensor_slices((features, features[:, :1])).batch(256).cache().prefetch(4)
    return profile(make_model(), data, steps=STEPS, warmup_steps=WARMUP_STEPS, logdir=tmp_path_factory.mktemp("gpu"))


@pytest.mark.gpu
def test_the_ceiling_is_at_least_real_training_within_its_spread(gpu_profile):
    measurement = gpu_profile.measurement
    assert measurement.measurement_problem is None, measurement.measurement_problem
    assert 0 < measurement.input_efficiency <= 1.0


@pytest.mark.gpu
def test_memory_in_use_is_the_allocators_peak_not_the_reservation(gpu_profile):
    fraction = gpu_profile.peak_memory_fraction
    assert fraction is not None and 0 < fraction < 0.5  # a 2048-wide MLP, not TF's whole-GPU reservation


@pytest.mark.gpu
def test_a_capture_holds_device_kernels_and_the_accelerator_metrics(gpu_profile):
    breakdown = gpu_profile.breakdown
    assert breakdown.hardware_type == "GPU" and 0 < breakdown.busy_percent <= 100
    assert breakdown.device_compute_seconds > 0
    metrics = gpu_profile.metrics
    assert metrics.accelerator == "gpu" and metrics.busy_percent == pytest.approx(breakdown.busy_percent)
    if gpu_profile.measurement.peak_flops_per_second:  # the GPU is in tfopt's peak table
        assert 0 < metrics.mfu_percent < 100
