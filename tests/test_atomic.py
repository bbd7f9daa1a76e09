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
