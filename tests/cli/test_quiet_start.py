"""TensorFlow's start-up lines stay out of `tfopt-recipe`'s output unless the user asks for them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfopt.cli.quiet_start import startup_noise

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


@pytest.mark.slow
def test_a_user_who_asks_for_tensorflows_logs_gets_them():
    stderr = _stderr_of(["validate", "recipes/small_cnn.yaml"], TF_CPP_MIN_LOG_LEVEL="0")
    assert [line for line in stderr.splitlines() if line.startswith(GLOG_RECORD)] != []
