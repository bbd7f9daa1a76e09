"""Commands whose writes the file system refuses, as on a full disk: one tfopt paragraph naming the file and
what was kept, no partial file left, and the same command run again with space finishes.

The refusal is real: the command runs under a file size limit (RLIMIT_FSIZE), so the kernel fails the write
that crosses it midway (EFBIG), as a full disk fails one with ENOSPC; both reach tfopt as the same error.
"""

import os
import subprocess
import sys

import pytest

from tests.processes import child_environment
from tfopt.data import generate_shapes, verify

LIMITED = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of the signal killing it
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
os.execv(sys.executable, [sys.executable, "-m", "tfopt.cli", *sys.argv[2:]])
"""


def tfopt_recipe(*args, limit_bytes=None, cwd):
    prefix = ["-c", LIMITED, str(limit_bytes)] if limit_bytes else ["-m", "tfopt.cli"]
    return subprocess.run(
        [sys.executable, *prefix, *args], capture_output=True, text=True, cwd=cwd, env=child_environment(), timeout=300
    )


def files_under(directory):
    return sorted(
        os.path.relpath(os.path.join(root, name), directory) for root, _, names in os.walk(directory) for name in names
    )


@pytest.mark.parametrize("source", ["synthetic", "image_folder"])
def test_a_conversion_the_disk_refuses_keeps_no_part_of_a_shard_and_finishes_when_run_again(tmp_path, source):
    """Synthetic data is written by threads here, an image folder by worker processes: both say it the same."""
    if source == "image_folder":
        generate_shapes(tmp_path / "images", images_per_class=8, image_size=32)
        data = f"{{source: image_folder, path: {tmp_path / 'images'}, image_size: [32, 32], batch_size: 4}}"
    else:
        data = "{source: synthetic, kind: image, examples: 64, image_size: [32, 32], batch_size: 4}"
    (tmp_path / "recipe.yaml").write_text(f"model: {{name: small_cnn, filters: [4]}}\ndata: {data}\nrecipes: []\n")
    out = tmp_path / "records"
    refused = tfopt_recipe("convert", "recipe.yaml", "--out", "records", limit_bytes=2_000, cwd=tmp_path)
    assert refused.returncode == 1, refused.stderr
    said = refused.stderr.strip().splitlines()[-1]
    assert said.startswith("tfopt-recipe: error: ") and "Traceback" not in refused.stderr
    assert "the file size limit (ulimit -f) is exceeded writing records/part-0000" in said
    assert f"(in {out}; " in said and "File too large. The shards written before it are kept" in said
    assert "may be a bug" not in said
    assert [name for name in files_under(out) if name.startswith((".part-", "part-"))] == []
    assert not (out / "tfopt_manifest.json").exists()

    written = tfopt_recipe("convert", "recipe.yaml", "--out", "records", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert verify(out)["num_examples"] == (40 if source == "image_folder" else 64) and not any(
        name.startswith(".") for name in files_under(out)
    )


def test_a_run_whose_profile_capture_the_disk_refuses_leaves_no_partial_capture(tmp_path):
    (tmp_path / "recipe.yaml").write_text(
        "model: {name: small_cnn, filters: [4]}\n"
        "data: {source: synthetic, kind: image, examples: 32, image_size: [16, 16], batch_size: 4}\n"
        "recipes: []\n"
        "profile: {steps: 3, warmup_steps: 1}\n"
    )
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "earlier.txt").write_text("an earlier output")
    refused = tfopt_recipe("run", "recipe.yaml", "--out", "runs/new", limit_bytes=20_000, cwd=tmp_path)
    assert refused.returncode == 1, refused.stderr
    said = refused.stderr.strip().splitlines()[-1]
    assert said.startswith(
        "tfopt-recipe: error: the file size limit (ulimit -f) is exceeded writing runs/new/tensorboard/before/"
        "plugins/profile/"
    )
    assert said.endswith("File too large. The capture was not kept; reports written before are untouched.")
    assert "Traceback" not in refused.stderr and "may be a bug" not in refused.stderr
    assert not any(name.endswith(".xplane.pb") for name in files_under(tmp_path / "runs"))
    assert (tmp_path / "runs" / "earlier.txt").read_text() == "an earlier output"
