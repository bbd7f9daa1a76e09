"""What `tfopt.Monitor` costs a user's `model.fit`: steps/s without and with it, measured side by side.

Each round trains the same model on the same pipeline three ways, in alternating order so that drift on
a noisy machine hits all alike: plain `fit`; `fit` with `Monitor(logdir=...)` at its default 30 s
windows (in a round this short the cost is the wrapped train function, the timed fetch of every step,
the start of each `fit` and one window cut short at its end); and with a window every 10 steps (a sync,
the TensorBoard scalars and a `monitor.jsonl` line per window, all written to a temporary directory as
a real run writes them). Every configuration is warmed up once first (the Monitor runs Keras' one-step
function, traced on its first call). The ratios compare the steps after the 20th, what a long run
pays per step; what the Monitor adds once per `fit` outside them (opening its files, timing one eager
fetch at the first step, the window cut short at the end) is its own column, in milliseconds.

A profiler capture's own cost (5 steps traced, then analysed) is read from the step times of runs with
captures: the steps from the one that starts a capture to the one that stops it, less as many median
steps; median [min-max] over all captures.

    python benchmarks/monitor_overhead.py [--rounds 7] [--steps 300] [--capture-repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# The same models and pipelines as the profiler's overhead benchmark, so the two tables compare.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import keras
from profiler_overhead import mlp, pipeline


def repeated(sleep_seconds: float = 0.0):
    """The profiler benchmark's tuned pipeline (parallel map when it sleeps, prefetch 4), repeated."""
    return pipeline(sleep_seconds=sleep_seconds, parallel=True).repeat()


class Clock(keras.callbacks.Callback):
    """The time at the end of every step of a `fit`. Placed first in every configuration, so its own small
    cost is in all of them alike."""

    def on_train_begin(self, logs=None):
        self.step_ends: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.step_ends.append(time.perf_counter())


def timed_fit(model, dataset, steps: int, callbacks: list, after: int = 20) -> tuple[float, float]:
    """(steady seconds per step after step `after`, seconds of the fit outside those steps)."""
    clock = Clock()
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock, *callbacks])
    whole = time.perf_counter() - start
    steady = clock.step_ends[-1] - clock.step_ends[after - 1]
    return steady / (steps - after), whole - steady


def spread(values: list[float], digits: int = 3) -> str:
    """median [min-max]"""
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def overhead(name: str, model, dataset, logdir: str, *, rounds: int, steps: int) -> None:
    from tfopt.profiling.monitor import Monitor

    configs = {
        "plain": list,
        "default": lambda: [Monitor(logdir=logdir)],
        "every 10": lambda: [Monitor(every_steps=10, logdir=logdir)],
    }
    for make in configs.values():
        model.fit(dataset, steps_per_epoch=20, epochs=1, verbose=0, callbacks=make())
    rates: dict[str, list[float]] = {config: [] for config in configs}
    rest: dict[str, list[float]] = {config: [] for config in configs}
    waits: list[float] = []
    for index in range(rounds):
        order = list(configs) if index % 2 == 0 else list(reversed(configs))
        for config in order:
            callbacks = configs[config]()
            steady, outside = timed_fit(model, dataset, steps, callbacks)
            rates[config].append(1.0 / steady)
            rest[config].append(outside)
            if config == "every 10":
                waits += [window["input_wait_percent"] for window in callbacks[0].records_of("window")]
    plain = rates["plain"]
    cells = [f"{name:<28} {statistics.median(plain):>6.0f}"]
    for config in ("default", "every 10"):
        ratios = [monitored / base for monitored, base in zip(rates[config], plain)]
        cells.append(f"{spread(ratios):>21}")
    fixed = [1000 * (monitored - base) for monitored, base in zip(rest["default"], rest["plain"])]
    cells.append(f"{spread(fixed, 0):>13}  {statistics.median(waits):>5.1f}")
    print("  ".join(cells), flush=True)


def capture_seconds(model, dataset, logdir: str, *, captures: int = 3) -> list[float]:
    """Seconds each profiler capture adds to a run: the steps from the one that starts it (a window's
    last) to the one that stops and analyses it, less as many median steps."""
    from tfopt.profiling.monitor import Monitor
    from tfopt.profiling.training_capture import PROFILE_STEPS

    clock, monitor = Clock(), Monitor(every_steps=50, profile_every=1, logdir=logdir)
    model.fit(
        dataset,
        steps_per_epoch=(50 + PROFILE_STEPS + 1) * captures + 1,
        epochs=1,
        verbose=0,
        callbacks=[clock, monitor],
    )
    durations = [later - earlier for earlier, later in zip(clock.step_ends, clock.step_ends[1:])]
    durations.insert(0, float("nan"))  # the first step's start is not recorded: it is never a capture's
    median = statistics.median(durations[1:])
    first = monitor.records_of("start")[-1]["step"] + 1  # the global step of the fit's first batch
    added = []
    for profile in monitor.records_of("profile"):
        last = profile["step"] - first
        added.append(sum(durations[last - PROFILE_STEPS : last + 1]) - (PROFILE_STEPS + 1) * median)
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--capture-repeats", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    from tfopt.hardware import detect

    print(f"hardware: {detect().describe()}")
    print(
        f"{args.rounds} rounds of {args.steps} steps. plain: steps/s after step 20 (median); default, every 10: "
        "monitored / plain steps/s after step 20 in the same round, median [min-max]; per fit: the default "
        "Monitor's added ms outside those steps (start, first steps, end), median [min-max]; wait: the "
        "every-10 windows' median input wait %"
    )
    print(f"{'workload':<28} {'plain':>6}  {'default':>21}  {'every 10':>21}  {'per fit (ms)':>13}  {'wait':>5}")
    workloads = {
        "tiny MLP (w=64), in-memory": (mlp(64), repeated()),
        "MLP (w=512), in-memory": (mlp(512), repeated()),
        "MLP (w=1024), slow map x32": (mlp(1024), repeated(0.002)),
    }
    with tempfile.TemporaryDirectory(prefix="monitor-overhead-") as logdir:
        for index, (name, (model, dataset)) in enumerate(workloads.items()):
            overhead(
                name, model, dataset, str(Path(logdir) / f"workload-{index}"), rounds=args.rounds, steps=args.steps
            )
        model, dataset = workloads["MLP (w=512), in-memory"]
        seconds = [
            added
            for repeat in range(args.capture_repeats)
            for added in capture_seconds(model, dataset, str(Path(logdir) / f"captures-{repeat}"))
        ]
    print(
        f"\none profiler capture (5 steps traced, then analysed), MLP (w=512), {len(seconds)} captures: "
        f"{spread(seconds, 2)} s added per capture"
    )


if __name__ == "__main__":
    main()
