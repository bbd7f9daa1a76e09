"""tfopt.profiling.throughput with plain numbers: window boundaries, pauses, and each rate exactly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tfopt.errors import RecipeConfigError
from tfopt.profiling.throughput import MIN_WINDOW_STEPS, Throughput, WindowStats


def steps(meter, first, last, *, seconds_each=1.0, fetch_each=0.0, start=0.0):
    """Runs global steps `first`..`last` into `meter`, each `seconds_each` long; returns the clock after them."""
    now = start
    for step in range(first, last + 1):
        now += seconds_each
        meter.update(step=step, fetch_seconds=fetch_each)
    return now


def test_every_steps_closes_exactly_and_computes_each_rate():
    meter = Throughput(
        every_steps=4, batch_size=32, flops_per_step=2e9, peak_flops_per_second=1e12, measure_input_wait=True
    )
    meter.open(now=100.0, first_step=2)
    now = 100.0
    for step in range(2, 5):
        now += 0.5
        meter.update(step=step, fetch_seconds=0.1)
        assert not meter.is_due(now=now)
    meter.update(step=5, fetch_seconds=0.1)
    assert meter.is_due(now=102.0) and meter.steps == 4
    window = meter.close(now=102.0)
    # 4 steps in 2 s: 2 steps/s, 64 examples/s; 0.4 s of 2 s waiting; 2 GFLOP x 2/s of 1 TFLOP/s.
    assert window == WindowStats(
        step=5,
        steps=4,
        seconds=2.0,
        rates={
            "steps_per_second": 2.0,
            "examples_per_second": 64.0,
            "input_wait_percent": pytest.approx(20.0),
            "mfu_percent": pytest.approx(0.4),
        },
    )
    assert list(window.rates) == ["steps_per_second", "examples_per_second", "input_wait_percent", "mfu_percent"]
    assert not meter.is_open and meter.steps == 0


def test_window_seconds_closes_on_training_time():
    meter = Throughput(window_seconds=3.0)
    meter.open(now=0.0, first_step=1)
    meter.update(step=1)
    assert not meter.is_due(now=2.999)
    assert meter.is_due(now=3.0)
    rates = {"steps_per_second": 1 / 3.5, "input_wait_percent": 0.0}  # input wait is measured by default
    assert meter.close(now=3.5) == WindowStats(step=1, steps=1, seconds=3.5, rates=rates)


def test_rates_that_do_not_apply_are_left_out():
    meter = Throughput(every_steps=2, measure_input_wait=False, flops_per_step=1e9)  # no peak: no MFU
    meter.open(now=0.0, first_step=1)
    steps(meter, 1, 2, fetch_each=0.5)
    assert meter.compute(now=4.0) == {"steps_per_second": 0.5}
    meter.batch_size, meter.peak_flops_per_second = 0, 1e10  # steps_per_execution > 1: no batch seen
    assert meter.compute(now=4.0) == {"steps_per_second": 0.5, "mfu_percent": pytest.approx(5.0)}


def test_a_window_spans_epochs_without_the_time_between_them():
    """Epochs of 4 steps at 1 s each, 100 s of validation and epoch-end callbacks after each."""
    meter = Throughput(every_steps=4, batch_size=8)
    closed = []
    now, step = 0.0, 0
    for _epoch in range(3):
        meter.resume(now=now)
        for _ in range(4):
            step += 1
            now += 1.0
            if not meter.is_open:  # the untimed first step opens the first window
                meter.open(now=now, first_step=step + 1)
                continue
            meter.update(step=step, fetch_seconds=0.25)
            if meter.is_due(now=now):
                closed.append(meter.close(now=now))
                meter.open(now=now, first_step=step + 1)
        meter.pause(now=now)
        now += 100.0
    assert meter.is_worth_keeping()
    closed.append(meter.close(now=now))  # paused: the 100 s after the pause are not counted
    assert [(window.step, window.steps, window.seconds) for window in closed] == [
        (5, 4, 4.0),
        (9, 4, 4.0),
        (12, 3, 3.0),
    ]
    rates = {"steps_per_second": 1.0, "examples_per_second": 8.0, "input_wait_percent": 25.0}
    assert all(window.rates == rates for window in closed)


def test_pause_and_resume_are_idempotent():
    meter = Throughput()
    meter.resume(now=5.0)  # no window: nothing to resume
    meter.pause(now=6.0)
    assert not meter.is_open and not meter.is_running
    meter.open(now=10.0, first_step=1)
    meter.resume(now=11.0)  # already running: the clock keeps its start
    meter.pause(now=12.0)
    meter.pause(now=50.0)
    assert meter.seconds(now=99.0) == 2.0 and not meter.is_running
    meter.resume(now=60.0)
    assert meter.seconds(now=61.5) == 3.5 and meter.is_running


def test_a_partial_last_window_is_kept_from_min_window_steps():
    meter = Throughput(every_steps=10)
    meter.open(now=0.0, first_step=7)
    for step, keep in zip(range(7, 7 + MIN_WINDOW_STEPS + 1), [False] * (MIN_WINDOW_STEPS - 1) + [True, True]):
        meter.update(step=step)
        assert meter.is_worth_keeping() is keep
    assert not meter.is_due(now=100.0)  # 4 steps of 10: only the end of fit closes it


def test_steps_per_execution_counts_several_steps_per_update():
    meter = Throughput(every_steps=4, batch_size=16)
    meter.open(now=0.0, first_step=3)  # a fit's first call ran steps 1-2
    meter.update(step=4)
    assert not meter.is_due(now=1.0)
    meter.update(step=6)
    window = meter.close(now=2.0)
    assert (window.step, window.steps, window.rates["examples_per_second"]) == (6, 4, 32.0)


def test_a_window_with_no_time_says_so_and_update_needs_an_open_window():
    meter = Throughput()
    with pytest.raises(RuntimeError, match="call open"):
        meter.update(step=1)
    meter.open(now=1.0, first_step=1)
    meter.update(step=1)
    with pytest.raises(RuntimeError, match=r"0\.0 s of training"):
        meter.compute(now=1.0)


def test_discard_drops_the_window_unrecorded():
    meter = Throughput(every_steps=1)
    meter.open(now=0.0, first_step=1)
    meter.update(step=1)
    meter.discard()
    assert not meter.is_open and not meter.is_due(now=10.0) and meter.steps == 0


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"window_seconds": 0}, "window_seconds=0"),
        ({"window_seconds": -1.0}, "window_seconds=-1.0"),
        ({"every_steps": 0}, "every_steps=0"),
        ({"every_steps": 2.5}, "every_steps=2.5"),
    ],
)
def test_bad_window_sizes_name_the_value(kwargs, words):
    with pytest.raises(RecipeConfigError, match=words):
        Throughput(**kwargs)


def test_imports_neither_keras_nor_tensorflow():
    code = (
        "import sys, tfopt.profiling.throughput; "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, sorted(sys.modules)"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr[-2000:]
