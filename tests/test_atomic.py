"""write_atomic: a failed write leaves the earlier file whole and no temporary file behind."""

import os

import pytest

import tfopt._atomic as atomic_module
from tfopt._atomic import write_atomic


def test_failed_write_leaves_the_earlier_report_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    write_atomic(path, "old")

    def full_disk(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_module.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["report.json"]


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
