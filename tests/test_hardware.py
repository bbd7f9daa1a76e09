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


UUIDS = ["GPU-1a2b3c4d-0000", "GPU-1a2b9999-0000", "GPU-77ee0000-0000", "GPU-c0ffee00-0000"]


@pytest.mark.parametrize(
    ("visible", "count", "expected"),
    [
        (None, 3, [0, 1, 2]),
        ("1,0", 3, [1, 0]),
        ("", 2, []),
        (" 2 , 0", 3, [2, 0]),
        # CUDA stops at the first entry that names no GPU: out of range, negative, empty, not a number.
        ("0,5,1", 2, [0]),
        ("0,-1,1", 3, [0]),
        ("1,,0", 3, [1]),
        ("1,GPU-77ee", 4, [1]),
        ("-1", 2, []),
        ("1gpu,0", 2, [1, 0]),  # an index is read as strtoul reads it
        ("0,1,0", 3, []),  # a GPU listed twice: CUDA shows none
        # UUIDs, or unique prefixes of them, by NVML's own UUIDs.
        (f"{UUIDS[3]},{UUIDS[0]}", 4, [3, 0]),
        ("GPU-77ee,GPU-c0f", 4, [2, 3]),
        ("GPU-c0ffee00-0000,GPU-1a2b,GPU-77ee", 4, [3]),  # "GPU-1a2b" is ambiguous: the list ends there
        ("GPU-77ee,GPU-0bad,GPU-c0f", 4, [2]),
        ("GPU-77ee,1", 4, [2]),
        ("GPU-77ee,GPU-77ee0000", 4, []),
        # MIG instances are slices NVML's whole-GPU figures do not describe: none is mapped.
        ("MIG-4b1f0c1e-6e2c-5a5a-8a5b-3f0e1c2d3b4a", 4, []),
    ],
)
def test_visible_gpu_nvml_indices_read_the_variable_as_cuda_does(monkeypatch, visible, count, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpu_nvml_indices(count, uuids=UUIDS[:count]) == expected


def _fake_nvml(monkeypatch, *, gpus: int):
    """pynvml for a machine whose NVML GPU i has (i + 1) * 10 GiB and the UUID UUIDS[i]."""
    nvml = types.SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: gpus,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetUUID=lambda handle: UUIDS[handle].encode(),  # bytes, as older bindings return it
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(total=(handle + 1) * 10 * 2**30),
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


@pytest.mark.parametrize("visible", ["3,1", f"{UUIDS[3]},{UUIDS[1]}", "GPU-c0f,GPU-1a2b9"])
def test_gpu_memory_is_read_from_the_nvml_gpu_tensorflow_uses(monkeypatch, visible):
    # Four GPUs in the machine; the job sees only physical GPUs 3 and 1, by index or by UUID.
    _fake_nvml(monkeypatch, gpus=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [hardware_module._nvml_memory_bytes(position) for position in range(3)] == [40 * 2**30, 20 * 2**30, None]


def test_the_monitor_samples_the_nvml_gpus_tensorflow_uses(monkeypatch):
    from tfopt.profiling.sampler import DeviceSampler

    _fake_nvml(monkeypatch, gpus=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUIDS[2]},{UUIDS[0]}")
    sampler = DeviceSampler(interval_seconds=0.05, use_nvml=True)
    reader = sampler._start_nvml()
    assert reader is not None and sampler._totals == {"gpu:0": 30 * 2**30, "gpu:1": 10 * 2**30}
