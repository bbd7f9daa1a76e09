"""Tests of tfopt.runtime: GPU memory is set before TensorFlow starts the GPUs, or the error says how."""

import pytest
import tensorflow as tf

from tfopt import registry
from tfopt.errors import RecipeConfigError
from tfopt.runtime import configure_gpu_memory, gpu_memory_in_force


class FakeGpuConfig:
    """Stands in for tf.config on a machine with two GPUs, refusing changes once 'initialised'. The
    environment's TF_FORCE_GPU_ALLOW_GROWTH (set where the suite runs on a real GPU) is taken away: it would
    answer for the code under test."""

    def __init__(self, monkeypatch, initialised=False):
        monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
        self.gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
        self.growth, self.limits, self.initialised = {}, {}, initialised
        monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: self.gpus if kind == "GPU" else [])
        monkeypatch.setattr(tf.config.experimental, "set_memory_growth", self.set_growth)
        monkeypatch.setattr(tf.config.experimental, "get_memory_growth", lambda gpu: self.growth.get(gpu.name, False))
        monkeypatch.setattr(tf.config, "set_logical_device_configuration", self.set_limit)
        monkeypatch.setattr(tf.config, "get_logical_device_configuration", lambda gpu: self.limits.get(gpu.name))

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
