"""What `tfopt.Monitor` costs a user's `model.fit`: steps/s without and with it, measured side by side.

Each round trains the same model on the same pipeline three ways, in alternating order so that drift on
a noisy machine hits all alike: plain `fit`, `fit` with the Monitor at its defaults (30 s windows: in a
short round the cost is the wrapped train function and the timed fetch of every step), and with a window
every 10 steps (a sync and a few TensorBoard scalars per window). Every configuration is warmed up once
first (the Monitor runs Keras' one-step function, traced on its first call). A profiler capture's own
cost (5 steps traced, then analysed) is timed apart, per capture.

    python benchmarks/monitor_overhead.py [--rounds 7] [--steps 300]
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
from profiler_overhead import mlp, pipeline  # noqa: E402


def repeated(sleep_seconds: float = 0.0):
    """The profiler benchmark's tuned pipeline (parallel map when it sleeps, prefetch 4), repeated."""
    return pipeline(sleep_seconds=sleep_seconds, parallel=True).repeat()


def seconds_per_step(model, dataset, steps: int, callbacks: list) -> float:
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)
    return (time.perf_counter() - start) / steps


def overhead(name: str, model, dataset, *, rounds: int, steps: int) -> None:
    from tfopt.profiling.live import Monitor

    configs = {"plain": list, "default": lambda: [Monitor()], "every 10": lambda: [Monitor(every_steps=10)]}
    for make in configs.values():
        seconds_per_step(model, dataset, 20, make())
    rates: dict[str, list[float]] = {config: [] for config in configs}
    for index in range(rounds):
        order = list(configs) if index % 2 == 0 else list(reversed(configs))
        for config in order:
            rates[config].append(1.0 / seconds_per_step(model, dataset, steps, configs[config]()))
    plain = rates["plain"]
    cells = [f"{name:<30} {statistics.median(plain):>8.0f}"]
    for config in ("default", "every 10"):
        ratios = [monitored / base for monitored, base in zip(rates[config], plain)]
        cells.append(f"{statistics.median(rates[config]):>8.0f} {statistics.median(ratios):>6.3f} "
                     f"{min(ratios):.3f}-{max(ratios):.3f}")
    print("  ".join(cells), flush=True)


def capture_seconds(model, dataset, *, captures: int = 3) -> float:
    """Seconds one profiler capture (5 steps traced and analysed) adds to a run, against windows alone."""
    from tfopt.profiling.live import Monitor

    steps = 50 * (captures + 1)
    with tempfile.TemporaryDirectory() as logdir:
        seconds_per_step(model, dataset, 20, [Monitor(every_steps=50)])
        windows = seconds_per_step(model, dataset, steps, [Monitor(every_steps=50)])
        profiled = seconds_per_step(model, dataset, steps, [Monitor(every_steps=50, profile_every=1, logdir=logdir)])
    return (profiled - windows) * steps / captures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    from tfopt.hardware import detect

    print(detect().describe())
    print(f"steps/s, median of {args.rounds} rounds of {args.steps} steps; ratio = monitored / plain in the same "
          "round (median, range)")
    print(f"{'workload':<30} {'plain':>8}  {'default':>8} {'ratio':>6} {'range':>11}  {'every 10':>8} {'ratio':>6} "
          f"{'range':>11}")
    workloads = {
        "tiny MLP (w=64), in-memory": (mlp(64), repeated()),
        "MLP (w=512), in-memory": (mlp(512), repeated()),
        "MLP (w=1024), slow map x32": (mlp(1024), repeated(0.002)),
    }
    for name, (model, dataset) in workloads.items():
        overhead(name, model, dataset, rounds=args.rounds, steps=args.steps)
    model, dataset = workloads["MLP (w=512), in-memory"]
    print(f"\none profiler capture (5 steps traced + analysed), MLP (w=512): "
          f"{capture_seconds(model, dataset):.2f} s added per capture")


if __name__ == "__main__":
    main()
