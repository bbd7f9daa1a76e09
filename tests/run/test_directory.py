"""Tests of tfopt.run.directory: new runs never write over files; --resume only continues the same recipe."""

from __future__ import annotations

import pytest

from tfopt.run.directory import RESOLVED_RECIPE_NAME, differences, discard_unused, new_run_dir, resumed_run_dir
from tfopt.errors import TfoptError


def test_differences_lists_every_changed_key_path_in_order():
    earlier = {"train": {"epochs": 1, "seed": 0}, "recipes": [{"xla": {"jit_compile": False}}]}
    now = {"train": {"epochs": 3, "seed": 0}, "recipes": [{"xla": {"jit_compile": True}}], "extra": 1}
    assert differences(earlier, now) == [(("train", "epochs"), 1, 3),
                                         (("recipes",), [{"xla": {"jit_compile": False}}], [{"xla": {"jit_compile": True}}]),
                                         (("extra",), None, 1)]
    assert differences(earlier, earlier) == []


def test_new_run_dir_makes_a_fresh_directory_and_refuses_one_with_files(tmp_path):
    first, second = new_run_dir("r", None, tmp_path), new_run_dir("r", None, tmp_path)
    assert first != second and first.parent == second.parent == tmp_path
    assert second.name == f"{first.name}-2" and not any(first.iterdir())
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("keep\n")
    with pytest.raises(TfoptError, match="already holds files.*add --resume"):
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
        RESOLVED_RECIPE_NAME, "tensorboard", "tensorboard/events.out.tfevents.1"]
