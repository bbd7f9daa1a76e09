"""Hardware description: detection on this machine, and the derived facts used by decisions."""

from tests.conftest import FAKE_HARDWARE
from tfopt.hardware import Hardware, detect


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
