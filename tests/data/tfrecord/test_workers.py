"""Tests of tfopt.data.tfrecord.workers: image folders converted by worker processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tfopt.data.image_folder import ImageFolderSource
from tfopt.data.tfrecord import convert as tfrecord
from tfopt.data.tfrecord.convert import to_tfrecord
from tfopt.data.tfrecord.manifest import MANIFEST_NAME, read_manifest
from tfopt.data.tfrecord.verify import verify
from tfopt.data.tfrecord.workers import ShardWriterPool
from tfopt.errors import DataError


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_worker_processes_write_the_same_shards_as_one_in_process_writer(shapes_dir, tmp_path, compression):
    source = ImageFolderSource(shapes_dir, image_size=32)
    to_tfrecord(source, tmp_path / "one", compression=compression, num_workers=1)
    to_tfrecord(source, tmp_path / "two", compression=compression, num_workers=2)
    one, two = read_manifest(tmp_path / "one"), read_manifest(tmp_path / "two")
    assert len(two["shards"]) == 8 and two["num_examples"] == 60
    # Byte for byte: same records, same order, same compressed stream.
    assert [(s["file"], s["records"], s["sha256"]) for s in two["shards"]] == [
        (s["file"], s["records"], s["sha256"]) for s in one["shards"]
    ]
    assert verify(tmp_path / "two")["num_examples"] == 60


def test_an_unreadable_file_fails_the_conversion_naming_it_and_a_rerun_completes(shapes_dir, tmp_path):
    folder = shutil.copytree(shapes_dir, tmp_path / "images")
    source = ImageFolderSource(folder, image_size=32)
    last = source.files[-1]
    content = last.read_bytes()
    last.unlink()
    last.mkdir()  # still listed, but reading it fails inside the worker
    with pytest.raises(DataError, match=rf"shard 7 failed: IsADirectoryError.*{last.name}"):
        to_tfrecord(source, tmp_path / "out", num_workers=2)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()
    last.rmdir()
    last.write_bytes(content)
    source = ImageFolderSource(folder, image_size=32)
    to_tfrecord(source, tmp_path / "out", num_workers=2)
    assert verify(tmp_path / "out")["num_examples"] == 60
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_a_resumed_conversion_removes_what_killed_workers_left_half_written(shapes_dir, tmp_path, monkeypatch):
    source = ImageFolderSource(shapes_dir, image_size=32)
    out = tmp_path / "out"

    def killed(*args):
        raise KeyboardInterrupt  # as if the run was stopped just before its manifest

    with monkeypatch.context() as patch:
        patch.setattr(tfrecord, "write_manifest", killed)
        with pytest.raises(KeyboardInterrupt):
            to_tfrecord(source, out, num_workers=2)
    (out / "part-00005.tfrecord").rename(out / ".part-00005.tfrecord.tmp-4242")  # a shard left half-written
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*")}
    to_tfrecord(source, out, num_workers=2)
    assert verify(out)["num_examples"] == 60
    assert all((out / name).stat().st_mtime_ns == stamp for name, stamp in kept.items())  # resumed, not redone
    assert (out / "part-00005.tfrecord").exists() and len(kept) == 7
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_dead_worker_is_a_clear_error_and_the_others_fail_fast(tmp_path):
    task = {"kind": "image_files", "files": [], "labels": []}
    with pytest.raises(DataError, match="exited with code -9"), ShardWriterPool(1) as pool:
        os.kill(pool._workers[0].pid, 9)
        pool._workers[0].wait()
        pool.write(tmp_path, 0, task, None)
    with ShardWriterPool(1) as pool:
        assert pool.write(tmp_path, 0, task, None)["records"] == 0  # an empty shard is still a valid file


def test_a_conversion_stopped_mid_shard_leaves_no_half_written_shard(tmp_path):
    """A worker killed while it writes (the conversion failed elsewhere, or Ctrl-C) leaves its shard under a
    temporary name: the pool removes it as it stops. Here the worker waits on a named pipe that nobody writes,
    its temporary shard open, when the block is left by an error."""
    import threading
    import time

    fifo = tmp_path / "never-written.jpg"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    out.mkdir()
    task = {"kind": "image_files", "files": [str(fifo)], "labels": [0]}
    with pytest.raises(KeyboardInterrupt), ShardWriterPool(1) as pool:
        threading.Thread(target=pool.write, args=(out, 0, task, None), daemon=True).start()
        deadline = time.monotonic() + 60
        while not list(out.glob(".part-00000.tfrecord.tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(out.glob(".part-00000.tfrecord.tmp-*"))  # the shard being written
        raise KeyboardInterrupt
    assert list(out.iterdir()) == []


def test_workers_import_neither_tensorflow_nor_the_callers_script():
    code = (
        "import sys, tfopt.data.tfrecord.workers, tfopt.data.tfrecord.inputs; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
