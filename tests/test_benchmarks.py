"""The benchmarks say which machine and which device their numbers come from, on any machine (detect() faked).

The benchmarks are scripts, not a package: each is loaded from its file. Their measurements are not run
here (speed lives in benchmarks/, never in tests); only the lines that name the hardware are.
"""

import importlib.util
import pathlib

import pytest

from tests.conftest import FAKE_HARDWARE

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load(name):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("machine", "trains_on"),
    [
        ("h100", "Keras trains on GPU:0 (NVIDIA H100 80GB HBM3)"),
        ("cpu_bf16", "Keras trains on the CPU"),
        ("tpu", "Keras trains on the TPU"),
    ],
)
def test_the_data_pipeline_benchmark_names_the_machine_and_the_training_device(monkeypatch, machine, trains_on):
    benchmark = load("data_pipeline")
    hardware = FAKE_HARDWARE[machine]
    monkeypatch.setattr(benchmark, "detect", lambda: hardware)
    header = benchmark._header()
    assert header.startswith(f"tfopt input-pipeline benchmark. Measured on: {hardware.describe()}. {trains_on}; ")
    assert f"tf.data runs on the host's {hardware.cpu_count} cores" in header


@pytest.mark.parametrize("machine", ["h100", "cpu_bf16"])
def test_the_scaling_benchmark_names_the_machine(monkeypatch, machine):
    import tfopt.hardware

    monkeypatch.setattr(tfopt.hardware, "detect", lambda: FAKE_HARDWARE[machine])
    assert load("scaling").header() == f"Measured on: {FAKE_HARDWARE[machine].describe()}"


@pytest.mark.parametrize(
    ("machine", "kind", "devices", "note"),
    [
        ("cpu_bf16", "mirrored", ["CPU:0", "CPU:1"], "mirrored: 2 logical CPU devices over the same 2 cores"),
        ("cpu_bf16", "multi_worker", ["CPU:0"], "multi_worker: 2 workers sharing the host's 2 cores"),
        ("h100", "mirrored", ["CPU:0", "CPU:1"], "mirrored: 2 logical CPU devices over the same 64 cores"),
        ("h100", "multi_worker", ["GPU:0"], "multi_worker: 2 workers sharing GPU:0"),
        ("h100", "horovod", ["GPU:0"], "horovod: 2 ranks sharing GPU:0"),
        ("a100", "mirrored", ["GPU:0", "GPU:1"], "mirrored: 2 GPUs, one replica each"),
        ("a100", "multi_worker", ["GPU:0", "GPU:1"], "multi_worker: 2 workers sharing GPU:0, GPU:1"),
        ("a100", "horovod", ["GPU:0"], "horovod: 2 ranks, a GPU each"),
    ],
)
def test_the_scaling_benchmark_says_what_the_replicas_of_each_row_shared(machine, kind, devices, note):
    assert load("scaling").sharing_note(kind, devices, FAKE_HARDWARE[machine]) == note


@pytest.mark.parametrize("machine", ["h100", "cpu_plain"])
def test_the_data_service_benchmark_names_the_machine(machine):
    header = load("data_service").header(FAKE_HARDWARE[machine])
    assert header.startswith(f"tfopt tf.data service benchmark. Measured on: {FAKE_HARDWARE[machine].describe()}. ")


@pytest.mark.parametrize("machine", ["h100", "cpu_bf16"])
@pytest.mark.parametrize("name", ["hand_tuned", "steps_per_execution", "gpu_threads"])
def test_the_hand_tuned_steps_per_call_and_gpu_threads_benchmarks_name_the_machine(monkeypatch, machine, name):
    benchmark = load(name)
    monkeypatch.setattr(benchmark, "detect", lambda: FAKE_HARDWARE[machine])
    assert benchmark.header() == f"Measured on: {FAKE_HARDWARE[machine].describe()}"
