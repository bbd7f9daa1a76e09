"""Shared fixtures for the profiling tests: a tiny model, a starved and a tuned pipeline, real profiles of
both (captured once per session), and hand-built profiles for fast report tests."""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.hardware import Gpu, Hardware
from tfopt.profiling.breakdown import StepBreakdown
from tfopt.profiling.capture import Capture, Profile, profile
from tfopt.profiling.diagnose import diagnose_breakdown
from tfopt.profiling.measurement import Measurement
from tfopt.profiling.sampler import HOST, Sample, Samples
from tfopt.profiling.timing import StepTimes
from tfopt.runtime import gpu_thread_mode_in_force

FEATURES = 64
BATCH = 32
# Each element sleeps this long in a Python function (a stand-in for slow reads or decoding): serially
# that is ~320 ms per batch, several times the model's step even when another test process shares the
# cores (then the step took up to 160 ms, and a 96 ms batch hid behind tf.data's injected prefetch), so
# the starved pipeline waits most of every step; 32 parallel calls make a batch in about 10 ms.
SLEEP_SECONDS = 0.01
STEPS = 8
WARMUP_STEPS = 3


def make_model(width: int = 2048) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    return model


def _slow_pipeline(*, parallel: bool, examples: int = 1024) -> tf.data.Dataset:
    features = np.random.default_rng(0).random((examples, FEATURES), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((features, features[:, :1]))

    def slow_identity(inputs, targets):
        time.sleep(SLEEP_SECONDS)  # stands in for decoding/augmenting in Python
        return inputs, targets

    def load(inputs, targets):
        inputs, targets = tf.numpy_function(slow_identity, [inputs, targets], [tf.float32, tf.float32])
        return tf.ensure_shape(inputs, [FEATURES]), tf.ensure_shape(targets, [1])

    if parallel:
        # tf.data's thread pool has one thread per core by default, which caps 32 parallel sleeps at 2.
        options = tf.data.Options()
        options.threading.private_threadpool_size = BATCH
        return dataset.map(load, num_parallel_calls=BATCH).batch(BATCH).prefetch(4).with_options(options)
    return dataset.map(load).batch(BATCH)


@pytest.fixture
def starved_dataset() -> tf.data.Dataset:
    return _slow_pipeline(parallel=False)


@pytest.fixture
def tuned_dataset() -> tf.data.Dataset:
    return _slow_pipeline(parallel=True)


@pytest.fixture(scope="session")
def session_model() -> keras.Model:
    return make_model()


@pytest.fixture(scope="session")
def starved_profile(session_model, tmp_path_factory) -> Profile:
    """A real profile of the model fed by a serial, sleeping pipeline."""
    return profile(
        session_model,
        _slow_pipeline(parallel=False),
        steps=STEPS,
        warmup_steps=WARMUP_STEPS,
        logdir=tmp_path_factory.mktemp("starved"),
        monitor_interval_seconds=0.05,
    )


@pytest.fixture(scope="session")
def tuned_profile(session_model, tmp_path_factory) -> Profile:
    """A real profile of the same model fed by the parallel, prefetched version of that pipeline."""
    return profile(
        session_model,
        _slow_pipeline(parallel=True),
        steps=STEPS,
        warmup_steps=WARMUP_STEPS,
        logdir=tmp_path_factory.mktemp("tuned"),
        monitor_interval_seconds=0.05,
    )


def fake_profile(
    *,
    step_ms: float = 40.0,
    input_ms: float = 20.0,
    ceiling_ms: float = 18.0,
    gpus: int = 0,
    steps: int = 6,
    batch_size: int = 32,
    steps_per_epoch: int | None = 100,
    logdir: str = "/tmp/fake-logdir",
) -> Profile:
    """A Profile built by hand, with exact numbers: for report and diagnosis tests that need no training."""
    hardware = Hardware(gpus=tuple(Gpu("Fake A100", (8, 0), 40 * 2**30) for _ in range(gpus)), cpu_count=2)
    seconds = tuple(step_ms / 1000.0 * (1 + 0.01 * (i % 3 - 1)) for i in range(steps))
    measurement = Measurement(
        real=StepTimes(seconds, batch_size),
        ceiling=StepTimes(tuple(ceiling_ms / 1000.0 for _ in range(steps)), batch_size),
        precision="tf32" if gpus else None,  # float32 matmuls on an A100, as precision_in_use says
    )
    profiled = StepTimes(tuple(s * 1.05 for s in seconds), batch_size)
    device_ms = (step_ms - input_ms) * 0.8 if gpus else 0.0
    breakdown = StepBreakdown(
        source="trace+xprof",
        hardware_type="GPU" if gpus else "CPU_ONLY",
        step_seconds=tuple(s * 1.05 for s in seconds),
        input_seconds=input_ms / 1000.0,
        device_compute_seconds=device_ms / 1000.0,
        device_busy_seconds=device_ms / 1000.0 if gpus else None,
        host_compute_seconds=(sum(seconds) * 1.05 / steps - input_ms / 1000.0 - device_ms / 1000.0),
        input_split={"preprocessing": 0.9, "file_read": 0.1, "enqueue": 0.0, "other": 0.0},
    )
    ends = tuple(0.2 + sum(profiled.seconds[: i + 1]) for i in range(steps))
    readings = [Sample(t, HOST, 50.0 + i, 500 * 2**20 + i * 2**20) for i, t in enumerate((0.0, *ends))]
    totals = {}
    for g in range(gpus):
        readings += [Sample(t, f"gpu:{g}", 40.0 + 5 * i, (10 + i) * 2**30) for i, t in enumerate((0.0, *ends))]
        totals[f"gpu:{g}"] = 40 * 2**30
    samples = Samples(samples=tuple(readings), source="nvml" if gpus else "psutil", device_memory_total_bytes=totals)
    peak = 12 * 2**30 if gpus else 600 * 2**20
    capture = Capture(
        logdir=logdir,
        xplane_path=f"{logdir}/x.xplane.pb",
        step_times=profiled,
        step_numbers=tuple(range(3, 3 + steps)),
        samples=samples,
        peak_memory_bytes=peak,
    )
    return Profile(
        measurement=measurement,
        capture=capture,
        breakdown=breakdown,
        diagnosis=diagnose_breakdown(  # as tfopt.profile diagnoses its own capture
            breakdown,
            hardware,
            peak_memory_fraction=peak / (40 * 2**30) if gpus else None,
            measurement=measurement,
            gpu_thread_mode=gpu_thread_mode_in_force(),
        ),
        hardware=hardware,
        steps_per_epoch=steps_per_epoch,
    )


@pytest.fixture
def make_fake_profile():
    """The `fake_profile` factory, as a fixture so test modules need no import path to conftest."""
    return fake_profile


FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture
def unpack_capture(tmp_path):
    """Unpacks a real capture from tests/fixtures (`unpack_capture("gpu-planted", "lstm_fp32")`) into the
    test's directory and returns its logdir."""

    def unpack(folder: str, case: str) -> Path:
        with tarfile.open(FIXTURES / folder / f"{case}.tar.xz", "r:xz") as archive:
            archive.extractall(tmp_path, filter="data")
        return tmp_path / case

    return unpack
