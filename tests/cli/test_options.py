"""Tests of tfopt.cli.options: durations, overrides, and what a worker repeats and shows."""

from __future__ import annotations

import argparse

import pytest

from tfopt.cli import options


@pytest.mark.parametrize("text, seconds", [("120", 120.0), ("120s", 120.0), ("2m", 120.0), ("1.5h", 5400.0)])
def test_durations(text, seconds):
    assert options.seconds(text) == seconds


@pytest.mark.parametrize("text", ["soon", "0s", "-3m", ""])
def test_bad_durations_are_argparse_errors(text):
    with pytest.raises(argparse.ArgumentTypeError):
        options.seconds(text)


def test_steps_and_budget_become_overrides_and_workers_repeat_them():
    args = argparse.Namespace(overrides=["train.epochs=2"], steps=5, tune_budget=90.0, traceback=True)
    assert options.overrides(args) == ["train.epochs=2", "profile.steps=5", "profile.tune_budget_seconds=90.0"]
    assert options.worker_arguments(args) == [
        "--set",
        "train.epochs=2",
        "--steps",
        "5",
        "--tune-budget",
        "90.0s",
        "--traceback",
    ]


WORKER_LINES = [
    "[worker 0] I0000 00:00:1795702830.290177    2565 port.cc:153] oneDNN custom operations are on.",
    "[worker 1] WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "[worker 1] E0000 00:00:1795702832.661756    2565 collective_ops.cc:7] Collective ops are aborted",
    "[worker 1] tfopt-recipe: error: Training stopped at step 3",
]


def test_worker_lines_hide_tensorflow_info_and_warnings(capsys, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    for line in WORKER_LINES:
        options.worker_line(line)
    assert capsys.readouterr().err.splitlines() == WORKER_LINES[2:]


def test_worker_lines_all_show_where_tensorflow_logs_are_asked_for(capsys, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    for line in WORKER_LINES:
        options.worker_line(line)
    assert capsys.readouterr().err.splitlines() == WORKER_LINES
