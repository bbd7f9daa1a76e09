import numpy as np
import tensorflow as tf

from tfopt.training import peak_memory
from tfopt.training.peak_memory import describe_bytes, track_peak_memory

MIB = 2**20


def allocate_and_free(mib):
    block = np.ones(mib * MIB // 8)
    del block


def test_host_peak_sees_a_freed_allocation():
    with track_peak_memory() as before:
        pass
    with track_peak_memory() as peak:
        allocate_and_free(300)
    assert peak.device == "host"
    assert peak.peak_bytes - before.peak_bytes > 250 * MIB


def test_sampling_fallback_where_the_peak_cannot_be_reset(monkeypatch, tmp_path):
    monkeypatch.setattr(peak_memory, "_CLEAR_REFS", tmp_path / "missing" / "clear_refs")

    def allocate_slowly():
        block = np.ones(300 * MIB // 8)
        import time

        time.sleep(0.05)  # let the sampler see it; not a timing assertion
        del block

    baseline = peak_memory.host_rss_bytes()
    with track_peak_memory(sample_seconds=0.001) as peak:
        allocate_slowly()
    assert peak.peak_bytes - baseline > 250 * MIB


def test_gpu_peak_is_the_largest_over_devices(monkeypatch):
    peaks = {"GPU:0": 5 * MIB, "GPU:1": 7 * MIB}
    reset = []
    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", reset.append)
    monkeypatch.setattr(tf.config.experimental, "get_memory_info", lambda device: {"current": 0, "peak": peaks[device]})
    with track_peak_memory(2) as peak:
        pass
    assert (reset, peak.peak_bytes, peak.device) == (["GPU:0", "GPU:1"], 7 * MIB, "GPU:0,GPU:1")


def test_describe_bytes():
    assert (describe_bytes(None), describe_bytes(300 * MIB), describe_bytes(5 * 2**30)) == (
        "unknown",
        "300 MiB",
        "5.0 GiB",
    )
