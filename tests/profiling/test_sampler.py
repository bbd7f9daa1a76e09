"""DeviceSampler: host sampling through psutil for real, the NVML path through a faked pynvml module."""

from __future__ import annotations

import sys
import time
import types

import pytest

from tfopt.profiling.sampler import HOST, DeviceSampler, Sample, Samples


def _fake_pynvml(*, count: int = 2, fail_init: bool = False) -> types.ModuleType:
    """A stand-in for `pynvml` with `count` GPUs: GPU i is (10 * (i + 1))% busy and uses (i + 1) GiB of 16."""
    module = types.ModuleType("pynvml")
    calls = {"init": 0, "shutdown": 0, "handles": []}

    class NVMLError(Exception):
        pass

    def nvml_init():
        calls["init"] += 1
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    def handle_by_index(index):
        calls["handles"].append(index)
        return index

    module.NVMLError = NVMLError
    module.nvmlInit = nvml_init
    module.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)
    module.nvmlDeviceGetCount = lambda: count
    module.nvmlDeviceGetHandleByIndex = handle_by_index
    module.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=10 * (handle + 1), memory=5)
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(
        used=(handle + 1) * 2**30, total=16 * 2**30, free=(15 - handle) * 2**30
    )
    module.calls = calls
    return module


def test_host_samples_cover_the_interval_from_start_to_stop():
    """A share of CPU time needs an interval: the start only sets the reference point (a reading there was 0%,
    pulling the mean down), and the stop reads the whole run, busy here."""
    with DeviceSampler(interval_seconds=10.0, use_nvml=False) as monitor:
        _ = sum(i * i for i in range(2_000_000))
    samples = monitor.samples
    host = samples.of(HOST)
    assert samples.source == "psutil"
    assert len(host) == 1  # the interval is longer than the run: the stop's reading only
    assert host[0].seconds > 0.0 and 0.0 < host[0].utilization_percent <= 100.0 + 1e-6
    assert samples.peak_memory_bytes() == max(sample.memory_bytes for sample in host) > 10 * 2**20
    assert samples.accelerator_devices == () and samples.peak_memory_fraction is None


def test_nvml_path_samples_every_gpu_and_shuts_down(monkeypatch):
    fake = _fake_pynvml(count=2)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with DeviceSampler(interval_seconds=10.0) as monitor:
        pass
    samples = monitor.samples
    assert samples.source == "nvml"
    assert samples.devices == ("gpu:0", "gpu:1", HOST)
    assert [s.utilization_percent for s in samples.of("gpu:1")] == [20.0, 20.0]
    assert samples.peak_memory_bytes() == 2 * 2**30  # the fullest GPU, not the host
    assert samples.peak_memory_bytes("gpu:0") == 2**30
    assert samples.mean_utilization_percent() == pytest.approx(15.0)
    assert samples.peak_memory_fraction == pytest.approx(2 / 16)
    assert samples.device_memory_total_bytes == {"gpu:0": 16 * 2**30, "gpu:1": 16 * 2**30}
    assert fake.calls["init"] == 1 and fake.calls["shutdown"] == 1


def test_nvml_follows_cuda_visible_devices(monkeypatch):
    fake = _fake_pynvml(count=4)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with DeviceSampler(interval_seconds=10.0) as monitor:
        pass
    # TensorFlow's GPU:0 is physical GPU 3 here, which the fake makes 40% busy.
    assert monitor.samples.accelerator_devices == ("gpu:0",)
    assert {s.utilization_percent for s in monitor.samples.of("gpu:0")} == {40.0}
    assert fake.calls["handles"] == [3]


def test_nvml_failure_falls_back_to_host_unless_required(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail_init=True))
    with DeviceSampler(interval_seconds=10.0) as monitor:
        pass
    assert monitor.samples.source == "psutil" and monitor.samples.devices == (HOST,)
    with pytest.raises(RuntimeError, match="NVML could not start: Driver Not Loaded"):
        DeviceSampler(use_nvml=True).start()


def test_required_nvml_without_bindings_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(ImportError, match="pip install nvidia-ml-py"):
        DeviceSampler(use_nvml=True).start()


def test_background_thread_samples_between_start_and_stop(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(count=1))
    monitor = DeviceSampler(interval_seconds=0.01)
    monitor.start()
    # Wait on the samples, not on the clock: the thread must add readings beyond the first one (the
    # bound only keeps a broken monitor from hanging the suite).
    for _ in range(20_000):
        if len(monitor._collected) >= 6:
            break
        time.sleep(0.001)
    samples = monitor.stop()
    gpu_times = [sample.seconds for sample in samples.of("gpu:0")]
    assert len(gpu_times) >= 3 and gpu_times == sorted(gpu_times)
    assert monitor._thread is None and monitor.stop() is samples  # stopping twice is harmless


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_seconds must be > 0; received 0"):
        DeviceSampler(interval_seconds=0)


def test_samples_to_dict_round_trips_readings():
    samples = Samples(samples=(Sample(0.0, HOST, 12.5, 100),), source="psutil")
    assert samples.to_dict()["samples"] == [
        {"seconds": 0.0, "device": HOST, "utilization_percent": 12.5, "memory_bytes": 100}
    ]
