"""Hardware description: detection on this machine, and the derived facts used by decisions."""

import sys
import types

import pytest

from tests.conftest import FAKE_HARDWARE
from tfopt import hardware as hardware_module
from tfopt.hardware import Hardware, detect, visible_gpu_nvml_indices


def test_detect_this_machine():
    hardware = detect()
    assert hardware.accelerator in {"cpu", "gpu", "tpu"}
    assert hardware.cpu_count >= 1 and hardware.host_memory_bytes > 0
    assert detect() is hardware  # cached: detection initialises TensorFlow's devices once
    if not hardware.gpus and not hardware.tpu_cores:
        assert hardware.accelerator == "cpu"
    assert hardware.cpu_supports_bf16 == bool({"avx512_bf16", "amx_bf16"} & hardware.cpu_flags)


def test_accelerator_kind():
    assert FAKE_HARDWARE["tpu"].accelerator == "tpu"
    assert FAKE_HARDWARE["a100"].accelerator == "gpu"
    assert FAKE_HARDWARE["cpu_plain"].accelerator == "cpu"


def test_min_compute_capability_of_mixed_gpus():
    mixed = Hardware(gpus=FAKE_HARDWARE["a100"].gpus + FAKE_HARDWARE["v100"].gpus)
    assert mixed.min_compute_capability == (7, 0)
    assert Hardware().min_compute_capability is None


def test_describe():
    assert FAKE_HARDWARE["a100"].describe().startswith("2x NVIDIA A100-SXM4-40GB (cc 8.0, 40.0 GiB)")
    assert "bf16 instructions" in FAKE_HARDWARE["cpu_bf16"].describe()
    assert FAKE_HARDWARE["tpu"].describe().startswith("TPU: 8 cores")
    assert FAKE_HARDWARE["h100"].cpu_supports_bf16  # AMX


@pytest.mark.parametrize(("visible", "count", "expected"), [
    (None, 3, [0, 1, 2]), ("1,0", 3, [1, 0]), ("", 2, []), ("GPU-abc,GPU-def", 2, [0, 1]), ("0,5", 2, [0]),
])
def test_visible_gpu_nvml_indices(monkeypatch, visible, count, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpu_nvml_indices(count) == expected


def test_gpu_memory_is_read_from_the_nvml_gpu_tensorflow_uses(monkeypatch):
    # Four GPUs in the machine, NVML GPU i has (i + 1) * 10 GiB; the job sees only physical GPUs 3 and 1.
    nvml = types.SimpleNamespace(
        NVMLError=RuntimeError, nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(total=(handle + 1) * 10 * 2**30))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [hardware_module._nvml_memory_bytes(position) for position in range(3)] == [40 * 2**30, 20 * 2**30, None]
