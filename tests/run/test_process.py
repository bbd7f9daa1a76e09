"""Tests of tfopt.run.process: GPU memory and thread settings are applied before TensorFlow initialises its
devices."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.processes import child_environment

RECIPE = (
    "runtime: {gpu_memory_growth: false, gpu_memory_limit_bytes: 1073741824, gpu_thread_mode: gpu_private,\n"
    "          gpu_thread_count: 3}\n"
    "model: {name: small_cnn, filters: [4]}\n"
    "data: {source: synthetic, kind: image, examples: 16, image_size: [8, 8], batch_size: 4}\n"
    "recipes:\n  - distribution: {strategy: auto}\n"
)

CHILD = textwrap.dedent("""
    import os
    import sys
    import tfopt.runtime as runtime
    from tfopt.run.process import start_process
    from tfopt.recipe_file import load_recipe, read_recipe

    def record(**kwargs):
        print("CONFIGURED", kwargs, "INITIALISED", runtime._devices_started())
        return []

    runtime.configure_gpu_memory = record
    document = read_recipe(sys.argv[1])
    strategy = start_process(document)
    print("THREADS", os.environ["TF_GPU_THREAD_MODE"], os.environ["TF_GPU_THREAD_COUNT"], runtime._devices_started())
    load_recipe(document)
    print("STRATEGY", strategy, "INITIALISED", runtime._devices_started())
""")


def test_gpu_settings_are_made_before_tensorflow_initialises_and_one_process_joins_no_cluster(tmp_path):
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    (tmp_path / "child.py").write_text(CHILD)
    environment = child_environment(TF_CPP_MIN_LOG_LEVEL="2")
    for variable in ("TF_CONFIG", "TF_GPU_THREAD_MODE", "TF_GPU_THREAD_COUNT"):
        environment.pop(variable, None)
    process = subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), str(tmp_path / "recipe.yaml")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr[-2000:]
    lines = [line for line in process.stdout.splitlines() if line.startswith(("CONFIGURED", "THREADS", "STRATEGY"))]
    assert lines == [
        "CONFIGURED {'growth': False, 'limit_bytes': 1073741824} INITIALISED False",
        "THREADS gpu_private 3 False",  # in the environment before TensorFlow reads it
        "STRATEGY None INITIALISED True",
    ]  # loading the recipe initialises TF: too late for GPUs (and tfopt.runtime sees that it did)
