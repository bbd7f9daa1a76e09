"""write_atomic: a failed write leaves the earlier file whole and no temporary file behind."""

import os

import pytest

import tfopt._atomic as atomic_module
from tfopt._atomic import write_atomic
from tfopt.errors import StorageError


def test_failed_write_leaves_the_earlier_report_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    write_atomic(path, "old")

    def full_disk(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_module.os, "replace", full_disk)
    with pytest.raises(StorageError) as raised:
        write_atomic(path, "new")
    assert str(raised.value).startswith(f"the disk is full writing {path} (in {tmp_path}; ")
    assert str(raised.value).endswith(f"No space left on device. {path} is as it was before.")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["report.json"]


LIMITED = """
import resource, signal, sys
from tfopt._atomic import write_atomic
from tfopt.errors import StorageError
from tfopt.errors import StorageError

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))  # no file may grow past 100 kB
try:
    write_atomic(sys.argv[1], "x" * 200_000)
except StorageError as error:
    print(error)
"""


def test_a_write_the_file_system_refuses_is_said_and_changes_nothing(tmp_path):
    """A real refusal from the kernel (the file size limit, as a full disk refuses: the write fails midway)."""
    import subprocess
    import sys

    from tests.processes import child_environment

    path = tmp_path / "out" / "report.json"
    write_atomic(path, "old")
    finished = subprocess.run(
        [sys.executable, "-c", LIMITED, str(path)], capture_output=True, text=True, env=child_environment(), timeout=60
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.startswith(f"the file size limit (ulimit -f) is exceeded writing {path} (in {path.parent}; ")
    assert finished.stdout.rstrip().endswith(f"File too large. {path} is as it was before.")
    assert path.read_text() == "old" and os.listdir(path.parent) == ["report.json"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_file_gets_the_mode_open_would_give_it_under_the_umask(tmp_path, umask, mode):
    before = os.umask(umask)
    try:
        path = write_atomic(tmp_path / "report.json", "{}")
        plain = tmp_path / "plain.json"
        plain.write_text("{}")
    finally:
        os.umask(before)
    assert path.stat().st_mode & 0o777 == mode == plain.stat().st_mode & 0o777
