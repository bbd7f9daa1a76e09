"""Tests of tfopt.run.directory: new runs never write over files; --resume only continues the same recipe."""

from __future__ import annotations

import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tests.processes import kill_all, wait_gone
from tfopt.errors import TfoptError
from tfopt.run.directory import (
    LOCK_HELD_ENV,
    LOCK_NAME,
    RESOLVED_RECIPE_NAME,
    check_out_dir,
    differences,
    discard_unused,
    new_run_dir,
    resumed_run_dir,
    run_dir_lock,
)

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_differences_lists_every_changed_key_path_in_order():
    earlier = {"train": {"epochs": 1, "seed": 0}, "recipes": [{"xla": {"jit_compile": False}}]}
    now = {"train": {"epochs": 3, "seed": 0}, "recipes": [{"xla": {"jit_compile": True}}], "extra": 1}
    assert differences(earlier, now) == [
        (("train", "epochs"), 1, 3),
        (("recipes",), [{"xla": {"jit_compile": False}}], [{"xla": {"jit_compile": True}}]),
        (("extra",), None, 1),
    ]
    assert differences(earlier, earlier) == []


def test_new_run_dir_makes_a_fresh_directory_and_refuses_one_with_files(tmp_path):
    first, second = new_run_dir("r", None, tmp_path), new_run_dir("r", None, tmp_path)
    assert first != second and first.parent == second.parent == tmp_path
    assert second.name == f"{first.name}-2" and not any(first.iterdir())
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("keep\n")
    with pytest.raises(TfoptError, match=r"already holds files.*add --resume"):
        new_run_dir("r", tmp_path / "out", tmp_path)


def test_resumed_run_dir_needs_a_directory_holding_a_run(tmp_path):
    with pytest.raises(TfoptError, match="--resume needs --out RUN_DIR"):
        resumed_run_dir(None, {})
    with pytest.raises(TfoptError, match="holds no run to continue"):
        resumed_run_dir(tmp_path, {})


def test_discard_unused_removes_only_a_directory_holding_just_the_saved_recipe(tmp_path):
    unused = tmp_path / "unused"
    (unused / "tensorboard" / "before").mkdir(parents=True)
    (unused / RESOLVED_RECIPE_NAME).write_text("name: tiny\n")
    assert discard_unused(unused) is True and not unused.exists()
    used = tmp_path / "used"
    (used / "tensorboard").mkdir(parents=True)
    (used / RESOLVED_RECIPE_NAME).write_text("name: tiny\n")
    (used / "tensorboard" / "events.out.tfevents.1").write_bytes(b"trace")
    assert discard_unused(used) is False
    assert sorted(str(p.relative_to(used)) for p in used.rglob("*")) == [
        RESOLVED_RECIPE_NAME,
        "tensorboard",
        "tensorboard/events.out.tfevents.1",
    ]


def test_out_that_is_a_file_or_read_only_is_refused_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "report.txt").write_text("mine\n")
    with pytest.raises(TfoptError, match=r"--out .*report.txt is a file, not a directory"):
        check_out_dir(tmp_path / "report.txt", resume=False)
    with pytest.raises(TfoptError, match=r"report.txt is a file, so no directory can be made there"):
        check_out_dir(tmp_path / "report.txt" / "run", resume=False)
    assert (tmp_path / "report.txt").read_text() == "mine\n"
    # What access(2) and statvfs(2) answer for a read-only mount (root may write anywhere else, so the
    # answers are given here rather than made with chmod).
    monkeypatch.setattr(os, "access", lambda path, mode: pathlib.Path(path) != tmp_path)
    with pytest.raises(TfoptError, match=rf"--out {tmp_path}/a/b: {tmp_path} is not writable by this user"):
        check_out_dir(tmp_path / "a" / "b", resume=False)
    monkeypatch.setattr(os, "statvfs", lambda path: type("Statvfs", (), {"f_flag": os.ST_RDONLY})())
    with pytest.raises(TfoptError, match=rf"{tmp_path} is on a read-only file system"):
        check_out_dir(tmp_path / "a", resume=True)
    assert not (tmp_path / "a").exists()


HOLD_LOCK = """
import os, pathlib, subprocess, sys, time
from tfopt.run.directory import LOCK_HELD_ENV, run_dir_lock
run_dir = pathlib.Path(sys.argv[1])
with run_dir_lock(run_dir) as lock:
    if sys.argv[2] == "with-worker":  # a worker that inherits the lock, as `run --workers` starts them
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], pass_fds=(lock,),
                                  env={**os.environ, LOCK_HELD_ENV: os.path.realpath(run_dir)})
        (run_dir / "worker.pid").write_text(str(worker.pid))
    (run_dir / "ready").write_text("")
    time.sleep(120)
"""


def _hold_lock(run_dir, mode):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir), mode], cwd=REPO)
    deadline = time.monotonic() + 60
    while not (run_dir / "ready").exists():
        assert holder.poll() is None and time.monotonic() < deadline, "the lock holder did not start"
        time.sleep(0.05)
    return holder


@pytest.mark.parametrize("mode", ["alone", "with-worker"])
def test_a_live_run_locks_its_directory_and_a_killed_runs_lock_is_taken_over(tmp_path, caplog, mode):
    holder = _hold_lock(tmp_path, mode)
    worker = int((tmp_path / "worker.pid").read_text()) if mode == "with-worker" else None
    try:
        with pytest.raises(TfoptError, match=rf"is in use by another tfopt run \(started by process {holder.pid}\)"):
            with run_dir_lock(tmp_path):
                pass
        holder.kill()
        holder.wait(timeout=30)
        if worker is not None:  # the launcher is gone, its worker still holds the lock
            with pytest.raises(TfoptError, match="in use by another tfopt run"):
                with run_dir_lock(tmp_path):
                    pass
            os.kill(worker, signal.SIGKILL)
            assert wait_gone([worker]) == []
        with caplog.at_level(logging.WARNING, logger="tfopt"):
            with run_dir_lock(tmp_path) as descriptor:
                assert (tmp_path / LOCK_NAME).read_text() == str(os.getpid()) and descriptor is not None
        assert (
            f"taking over the lock of a run that is no longer running (started by process {holder.pid})" in caplog.text
        )
        assert not (tmp_path / LOCK_NAME).exists()
    finally:
        kill_all(holder, [worker] if worker is not None else [])


def test_a_process_that_inherited_the_lock_does_not_take_it_again(tmp_path, monkeypatch):
    with run_dir_lock(tmp_path) as descriptor:
        monkeypatch.setenv(LOCK_HELD_ENV, os.path.realpath(tmp_path))
        with run_dir_lock(tmp_path) as inherited:
            assert inherited is None and descriptor is not None


def test_a_path_the_system_refuses_is_said_as_such(tmp_path):
    """A name longer than the file system takes: `Path.exists` raises, and the user read a bare OSError."""
    from tfopt.run.directory import check_writable

    with pytest.raises(TfoptError, match=r"--out .*: the system refuses this path \(File name too long\)"):
        check_writable(tmp_path / ("d" * 300), "--out")
