"""TensorFlow's start-up lines stay out of `tfopt-recipe`'s output unless the user asks for them."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfopt.cli.quiet_start import forward_without_noise, startup_noise, tensorflow_started_quietly

ROOT = Path(__file__).resolve().parents[2]
GLOG_RECORD = ("I0000 ", "W0000 ", "E0000 ", "WARNING: All log messages before absl")

# What TensorFlow 2.21 writes before absl logging starts: on a CPU machine, and on a GPU machine.
CPU_MACHINE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795703181.503049   10864 port.cc:153] oneDNN custom operations are on. You may see slightly",
    "I0000 00:00:1795703181.503471   10864 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU "
    "will not be used.",
    "I0000 00:00:1795703181.604695   10864 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use",
    "To enable the following instructions: AVX2 AVX512F, in other operations, rebuild TensorFlow.",
    "E0000 00:00:1795703185.736363   10864 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error",
]
GPU_MACHINE = [
    "E0000 00:00:1795703181.1  10864 cuda_dnn.cc:8579] Unable to register cuDNN factory: Attempting to register "
    "factory for plugin cuDNN when one has already been registered",
    "E0000 00:00:1795703185.7  10864 cuda_platform.cc:52] failed call to cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    "/usr/lib/python3/site-packages/keras/src/export.py:3: DeprecationWarning: the imp module is deprecated",
]


def test_a_cpu_machines_start_up_is_all_noise():
    assert startup_noise(CPU_MACHINE) == [True] * len(CPU_MACHINE)


def test_a_failed_cuinit_where_a_driver_is_installed_is_kept():
    """The driver is there (TensorFlow did not say it found none), so a failed cuInit is the user's problem."""
    assert startup_noise(GPU_MACHINE) == [True, False, False]


def test_level_3_drops_errors_too_and_python_lines_end_a_dropped_record():
    lines = [
        "I0000 00:00:1795703181.6  10864 cpu_feature_guard.cc:227] This TensorFlow binary is optimized",
        "WARNING:tensorflow:From a Python module: a deprecation",
        "E0000 00:00:1795703181.7  10864 some_kernel.cc:1] a real error",
    ]
    assert startup_noise(lines) == [True, False, False]
    assert startup_noise(lines, min_level=3) == [True, False, True]


def test_the_filter_passes_lines_on_as_they_come():
    for machine, shown in ((CPU_MACHINE, []), (GPU_MACHINE, GPU_MACHINE[1:])):
        source, sink = io.StringIO("\n".join(machine) + "\n"), io.StringIO()
        forward_without_noise(source, sink, min_level=2)
        assert sink.getvalue().splitlines() == shown


STAND_IN = """
import os
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n")
os.write(2, b"I0000 00:00:1.5  7 port.cc:153] oneDNN custom operations are on.\\n")
os.write(2, b"E0000 00:00:1.6  7 kernel.cc:9] a real error\\n")


class config:
    @staticmethod
    def list_physical_devices():
        os.write(2, b"I0000 00:00:1.7  7 cudart_stub.cc:31] Could not find cuda drivers on your machine\\n")
        os.write(2, b"E0000 00:00:1.8  7 cuda_platform.cc:52] failed call to cuInit: INTERNAL\\n")
"""


def test_the_first_import_runs_through_the_filter_and_leaves_its_loader_as_it_was(tmp_path, monkeypatch, capfd):
    """A stand-in for TensorFlow that writes to descriptor 2 as TensorFlow's C++ start-up does."""
    (tmp_path / "tfopt_stand_in.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    monkeypatch.delitem(sys.modules, "tfopt_stand_in", raising=False)
    with tensorflow_started_quietly("tfopt_stand_in"):
        module = importlib.import_module("tfopt_stand_in")
        assert not any(type(finder).__name__ == "_QuietTensorFlowFinder" for finder in sys.meta_path)
    assert capfd.readouterr().err.splitlines() == ["E0000 00:00:1.6  7 kernel.cc:9] a real error"]
    assert type(module.__loader__).__name__ == "SourceFileLoader" and module.__spec__.loader is module.__loader__


def test_nothing_is_filtered_where_the_user_asks_for_tensorflows_logs(tmp_path, monkeypatch, capfd):
    (tmp_path / "tfopt_stand_in.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    monkeypatch.delitem(sys.modules, "tfopt_stand_in", raising=False)
    with tensorflow_started_quietly("tfopt_stand_in"):
        importlib.import_module("tfopt_stand_in")
    assert len(capfd.readouterr().err.splitlines()) == 3  # config was not called: only the import's lines


def _stderr_of(command: list[str], **env: str) -> str:
    environment = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    completed = subprocess.run(
        [sys.executable, "-m", "tfopt.cli", *command],
        cwd=ROOT,
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    assert "valid" in completed.stdout
    return completed.stderr


@pytest.mark.slow
def test_tensorflows_start_up_lines_stay_out_of_a_commands_output():
    stderr = _stderr_of(["validate", "recipes/small_cnn.yaml"])
    assert [line for line in stderr.splitlines() if line.startswith(GLOG_RECORD)] == []
    assert "cuInit" not in stderr and "oneDNN" not in stderr


def test_tensorflow_datasets_warnings_stay_out_of_validate(tmp_path):
    """A tfds recipe whose dataset folder holds an unprepared version: tfopt's note says so, and TensorFlow
    Datasets' own absl warning about the folder stays out."""
    (tmp_path / "tfds" / "mnist" / "3.0.1").mkdir(parents=True)
    (tmp_path / "recipe.yaml").write_text(
        "model: {name: small_cnn}\n"
        f"data: {{source: tfds, name: mnist, data_dir: {tmp_path / 'tfds'}, download: true}}\n"
    )
    stderr = _stderr_of(["validate", str(tmp_path / "recipe.yaml")])
    assert "absl" not in stderr and "dataset_info.json" not in stderr, stderr


@pytest.mark.slow
def test_a_user_who_asks_for_tensorflows_logs_gets_them():
    stderr = _stderr_of(["validate", "recipes/small_cnn.yaml"], TF_CPP_MIN_LOG_LEVEL="0")
    assert [line for line in stderr.splitlines() if line.startswith(GLOG_RECORD)] != []


def test_tensorflows_and_absls_python_records_below_error_stay_out(monkeypatch, caplog):
    """TensorFlow warns every worker that a collective strategy runs eagerly, through its own Python logger."""
    import logging

    from tfopt.cli.quiet_start import library_records_quieted

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    with caplog.at_level(logging.DEBUG), library_records_quieted():
        logging.getLogger("tensorflow").warning("Using CollectiveAllReduceStrategy eagerly")
        logging.getLogger("absl").warning("Variant folder has no dataset_info.json")
        logging.getLogger("tensorflow").error("a real error")
    assert [record.getMessage() for record in caplog.records] == ["a real error"]
    assert logging.getLogger("tensorflow").level != logging.ERROR  # put back


def test_tfopts_lines_are_said_once_after_absl_configures_the_root_logger(capsys, monkeypatch):
    """absl calls logging.basicConfig() when TensorFlow first logs through it (an asynchronous checkpoint's first
    write): the root's handler said every tfopt line a second time, as INFO:tfopt:..."""
    import argparse
    import logging

    from tfopt.cli.progress import terminal_progress

    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in the command, not under pytest's capture
    with terminal_progress(argparse.Namespace(quiet=False)):
        logging.basicConfig()
        logging.getLogger("tfopt").info("Interrupted: the steps trained so far are in ckpt-27.")
    assert capsys.readouterr().err.splitlines() == ["  Interrupted: the steps trained so far are in ckpt-27."]
    assert logging.getLogger("tfopt").propagate  # put back
