import pytest
import tensorflow as tf

from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tfopt.errors import RecipeConfigError
from tfopt.plan import make_plan
from tfopt.recipes.memory import GpuMemory, configure_gpu_memory


class FakeGpuConfig:
    """Stands in for tf.config on a machine with two GPUs, refusing changes once 'initialised'."""

    def __init__(self, monkeypatch, initialised=False):
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


@pytest.fixture
def v100_plan():
    return make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE["v100"])


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
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    with pytest.raises(RecipeConfigError, match="before TensorFlow initialises the GPUs") as error:
        configure_gpu_memory(growth=True)
    message = str(error.value)
    assert "configure_gpu_memory(growth=True, limit_bytes=None)" in message
    assert "restart the kernel" in message and "TF_FORCE_GPU_ALLOW_GROWTH=true" in message


def test_a_notebook_cell_run_again_after_the_gpus_started_works(monkeypatch):
    fake = FakeGpuConfig(monkeypatch)
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    configure_gpu_memory(growth=True)
    fake.initialised = True  # the next cells trained a model
    assert configure_gpu_memory(growth=True) == ["/physical_device:GPU:0", "/physical_device:GPU:1"]
    with pytest.raises(RecipeConfigError, match="restart the kernel"):
        configure_gpu_memory(growth=False, limit_bytes=2**30)  # a different setting cannot be made now


@pytest.mark.parametrize("forced, in_force", [("true", True), ("TRUE", True), ("false", False)])
def test_tf_force_gpu_allow_growth_decides_growth(monkeypatch, v100_plan, forced, in_force):
    # On the H100 the suite ran with TF_FORCE_GPU_ALLOW_GROWTH=true after other tests had started the GPU:
    # growth was in force, yet get_memory_growth() said False and the recipe refused.
    FakeGpuConfig(monkeypatch, initialised=True)
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", forced)
    if in_force:
        assert configure_gpu_memory(growth=True) == ["/physical_device:GPU:0", "/physical_device:GPU:1"]
        GpuMemory().check(v100_plan)
    else:
        with pytest.raises(RecipeConfigError, match="memory growth is not in force"):
            GpuMemory().check(v100_plan)


def test_check_passes_when_in_force_and_fails_otherwise(monkeypatch, v100_plan):
    fake = FakeGpuConfig(monkeypatch)
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    with pytest.raises(RecipeConfigError, match="memory growth is not in force"):
        GpuMemory().check(v100_plan)
    configure_gpu_memory(growth=True)
    GpuMemory().check(v100_plan)
    assert "memory growth" in GpuMemory()(v100_plan).applied[-1].detail
    with pytest.raises(RecipeConfigError, match="a memory limit of 2.00 GiB per GPU is not in force"):
        GpuMemory(growth=False, limit_bytes=2 * 2**30).check(v100_plan)
    assert fake.growth  # check() changed nothing


def test_cpu_plan_is_skipped(cpu_hardware):
    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware)
    GpuMemory().check(plan)
    assert GpuMemory()(plan).applied[-1].skipped


@pytest.mark.parametrize("settings, words", [
    ({"growth": "yes"}, "Expected true or false"),
    ({"growth": False, "limit_bytes": 10}, "at least 1 MiB"),
    ({"limit_bytes": 2**30}, "exclude each other"),
])
def test_bad_settings(settings, words):
    with pytest.raises(RecipeConfigError, match=words):
        GpuMemory(**settings)
