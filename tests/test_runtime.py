"""Tests of tfopt.runtime: GPU memory and the GPUs' threads are set before TensorFlow starts the GPUs, or the
error says how."""

import os

import pytest
import tensorflow as tf

from tfopt import registry, runtime
from tfopt.errors import RecipeConfigError
from tfopt.runtime import configure_gpu_memory, configure_gpu_threads, gpu_memory_in_force, gpu_thread_mode_in_force


def unset(monkeypatch, *variables):
    """Unsets the variables for the test and puts back what they were after it, also where the code under test
    sets them (`monkeypatch.delenv` of an unset variable records nothing to put back)."""
    for variable in variables:
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)


class FakeGpuConfig:
    """Stands in for tf.config on a machine with two GPUs, refusing changes once 'initialised'. The
    environment's TF_FORCE_GPU_ALLOW_GROWTH (set where the suite runs on a real GPU) is taken away: it would
    answer for the code under test."""

    def __init__(self, monkeypatch, initialised=False):
        unset(monkeypatch, "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_THREAD_MODE", "TF_GPU_THREAD_COUNT")
        self.gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
        self.growth, self.limits, self.initialised = {}, {}, initialised
        monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: self.gpus if kind == "GPU" else [])
        monkeypatch.setattr(tf.config.experimental, "set_memory_growth", self.set_growth)
        monkeypatch.setattr(tf.config.experimental, "get_memory_growth", lambda gpu: self.growth.get(gpu.name, False))
        monkeypatch.setattr(tf.config, "set_logical_device_configuration", self.set_limit)
        monkeypatch.setattr(tf.config, "get_logical_device_configuration", lambda gpu: self.limits.get(gpu.name))
        monkeypatch.setattr(runtime, "_devices_started", lambda: self.initialised)

    def set_growth(self, gpu, enable):
        if self.initialised:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[gpu.name] = enable

    def set_limit(self, gpu, configs):
        if self.initialised:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        self.limits[gpu.name] = configs


def test_growth_is_set_on_every_gpu(monkeypatch):
    fake = FakeGpuConfig(monkeypatch)
    assert configure_gpu_memory(growth=True) == ["/physical_device:GPU:0", "/physical_device:GPU:1"]
    assert fake.growth == {"/physical_device:GPU:0": True, "/physical_device:GPU:1": True}


def test_limit_becomes_a_logical_device_in_mib(monkeypatch):
    fake = FakeGpuConfig(monkeypatch)
    configure_gpu_memory(growth=False, limit_bytes=3 * 2**30)
    assert [config.memory_limit for config in fake.limits["/physical_device:GPU:1"]] == [3072]


def test_too_late_says_to_call_it_first(monkeypatch):
    FakeGpuConfig(monkeypatch, initialised=True)
    with pytest.raises(RecipeConfigError, match="before TensorFlow initialises the GPUs") as error:
        configure_gpu_memory(growth=True)
    message = str(error.value)
    assert "tfopt.runtime.configure_gpu_memory(growth=True, limit_bytes=None)" in message
    assert "restart the kernel" in message and "TF_FORCE_GPU_ALLOW_GROWTH=true" in message


def test_a_notebook_cell_run_again_after_the_gpus_started_works(monkeypatch):
    fake = FakeGpuConfig(monkeypatch)
    configure_gpu_memory(growth=True)
    fake.initialised = True  # the next cells trained a model
    assert configure_gpu_memory(growth=True) == ["/physical_device:GPU:0", "/physical_device:GPU:1"]
    with pytest.raises(RecipeConfigError, match="restart the kernel"):
        configure_gpu_memory(growth=False, limit_bytes=2**30)  # a different setting cannot be made now


@pytest.mark.parametrize("forced, in_force", [("true", True), ("TRUE", True), ("false", False)])
def test_tf_force_gpu_allow_growth_decides_growth(monkeypatch, forced, in_force):
    # On the H100 the suite ran with TF_FORCE_GPU_ALLOW_GROWTH=true after other tests had started the GPU:
    # growth was in force, yet get_memory_growth() said False and tfopt refused.
    FakeGpuConfig(monkeypatch, initialised=True)
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", forced)
    assert gpu_memory_in_force(growth=True, limit_bytes=None) is in_force
    if in_force:
        assert configure_gpu_memory(growth=True) == ["/physical_device:GPU:0", "/physical_device:GPU:1"]
    else:
        with pytest.raises(RecipeConfigError, match="restart the kernel"):
            configure_gpu_memory(growth=True)


def test_in_force_reads_what_was_set(monkeypatch):
    fake = FakeGpuConfig(monkeypatch)
    assert not gpu_memory_in_force(growth=True, limit_bytes=None)
    configure_gpu_memory(growth=True)
    assert gpu_memory_in_force(growth=True, limit_bytes=None)
    assert not gpu_memory_in_force(growth=False, limit_bytes=2 * 2**30)
    assert fake.limits == {}  # reading changed nothing


def test_no_gpu_means_nothing_to_configure(monkeypatch):
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    assert configure_gpu_memory(growth=True) == [] and gpu_memory_in_force(growth=False, limit_bytes=2**30)


@pytest.mark.parametrize(
    "settings, words, setting",
    [
        ({"growth": "yes"}, "Expected true or false", "growth"),
        ({"growth": False, "limit_bytes": 10}, "at least 1 MiB", "limit_bytes"),
        ({"limit_bytes": 2**30}, "exclude each other", "growth"),
    ],
)
def test_bad_settings(monkeypatch, settings, words, setting):
    FakeGpuConfig(monkeypatch)
    with pytest.raises(RecipeConfigError, match=words) as error:
        configure_gpu_memory(**settings)
    assert error.value.setting == setting


def test_gpu_memory_is_no_recipe_and_the_error_says_where_it_went():
    with pytest.raises(RecipeConfigError, match=r"runtime: \{gpu_memory_growth: true\}.*configure_gpu_memory"):
        registry.from_item({"gpu_memory": {"growth": True}})


def test_gpu_threads_are_set_where_tensorflow_reads_them(monkeypatch):
    FakeGpuConfig(monkeypatch)
    assert gpu_thread_mode_in_force() == "global"  # TensorFlow's default
    assert configure_gpu_threads("gpu_private", count=4) == ["/physical_device:GPU:0", "/physical_device:GPU:1"]
    assert (os.environ["TF_GPU_THREAD_MODE"], os.environ["TF_GPU_THREAD_COUNT"]) == ("gpu_private", "4")
    configure_gpu_threads("gpu_shared")  # no count: the environment's, as the user exported it
    assert (os.environ["TF_GPU_THREAD_MODE"], os.environ["TF_GPU_THREAD_COUNT"]) == ("gpu_shared", "4")
    monkeypatch.setenv("TF_GPU_THREAD_MODE", " GPU_Private ")  # TensorFlow lower-cases it
    assert gpu_thread_mode_in_force() == "gpu_private"


def test_gpu_threads_too_late_say_how_and_change_nothing(monkeypatch):
    fake = FakeGpuConfig(monkeypatch)
    configure_gpu_threads("gpu_private")
    fake.initialised = True  # the next cells trained a model
    assert configure_gpu_threads("gpu_private") == ["/physical_device:GPU:0", "/physical_device:GPU:1"]  # run again
    started = "TensorFlow started the GPUs with TF_GPU_THREAD_MODE=gpu_private"
    for mode, count, setting in (("global", None, "mode"), ("gpu_private", 3, "count")):
        with pytest.raises(RecipeConfigError, match=started) as error:
            configure_gpu_threads(mode, count=count)
        assert error.value.setting == setting
    assert "TF_GPU_THREAD_COUNT=2, and reads them only then" in str(error.value)  # unset: TensorFlow's 2
    assert os.environ["TF_GPU_THREAD_MODE"] == "gpu_private" and "TF_GPU_THREAD_COUNT" not in os.environ


def test_gpu_threads_without_a_gpu_apply_to_no_device(monkeypatch):
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    unset(monkeypatch, "TF_GPU_THREAD_MODE", "TF_GPU_THREAD_COUNT")
    assert configure_gpu_threads("gpu_private") == []  # this process' devices started long ago: no matter
    assert os.environ["TF_GPU_THREAD_MODE"] == "gpu_private"  # its GPU-less children inherit a harmless value


@pytest.mark.parametrize(
    "settings, words, setting",
    [
        ({"mode": "private"}, "Expected one of global, gpu_private, gpu_shared", "mode"),
        ({"mode": "gpu_private", "count": 0}, "at least 1", "count"),
        ({"mode": "gpu_private", "count": True}, "at least 1", "count"),
        ({"mode": "global", "count": 2}, "changes nothing", "count"),
    ],
)
def test_bad_gpu_thread_settings(monkeypatch, settings, words, setting):
    FakeGpuConfig(monkeypatch)
    with pytest.raises(RecipeConfigError, match=words) as error:
        configure_gpu_threads(**settings)
    assert error.value.setting == setting and "TF_GPU_THREAD_MODE" not in os.environ
