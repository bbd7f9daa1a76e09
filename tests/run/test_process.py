"""Tests of tfopt.run.process: GPU memory settings are applied before TensorFlow initialises its devices."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.processes import child_environment

RECIPE = (
    "runtime: {gpu_memory_growth: false, gpu_memory_limit_bytes: 1073741824}\n"
    "model: {name: small_cnn, filters: [4]}\n"
    "data: {source: synthetic, kind: image, examples: 16, image_size: [8, 8], batch_size: 4}\n"
    "recipes:\n  - distribution: {strategy: auto}\n"
)

CHILD = textwrap.dedent("""
    import sys
    import tfopt.runtime as runtime
    from tensorflow.python.eager import context
    from tfopt.run.process import start_process
    from tfopt.recipe_file import load_recipe, read_recipe

    def record(**kwargs):
        print("CONFIGURED", kwargs, "INITIALISED", context.context()._context_handle is not None)
        return []

    runtime.configure_gpu_memory = record
    document = read_recipe(sys.argv[1])
    strategy = start_process(document)
    load_recipe(document)
    print("STRATEGY", strategy, "INITIALISED", context.context()._context_handle is not None)
""")


def test_gpu_memory_is_configured_before_tensorflow_initialises_and_one_process_joins_no_cluster(tmp_path):
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    (tmp_path / "child.py").write_text(CHILD)
    environment = child_environment(TF_CPP_MIN_LOG_LEVEL="2")
    environment.pop("TF_CONFIG", None)
    process = subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), str(tmp_path / "recipe.yaml")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr[-2000:]
    lines = [line for line in process.stdout.splitlines() if line.startswith(("CONFIGURED", "STRATEGY"))]
    assert lines == [
        "CONFIGURED {'growth': False, 'limit_bytes': 1073741824} INITIALISED False",
        "STRATEGY None INITIALISED True",
    ]  # loading the recipe initialises TF: too late for GPUs
