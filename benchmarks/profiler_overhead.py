"""What the TF Profiler costs, and what it sees: steps/s with and without it, measured side by side.

For each workload, rounds alternate between an unprofiled timing (`timing.time_training_steps`) and a
profiled capture (`capture.capture`: profiler running, a step marker per step) of the same model on
the same pipeline, so drift on a noisy machine hits both alike. Then the starved and tuned pipelines
of the profiling tests are profiled and their step breakdowns printed.

    python benchmarks/profiler_overhead.py [--rounds 5] [--steps 20] [--warmup-steps 3]
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

FEATURES = 64
BATCH = 32


def mlp(width: int):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    return model


def pipeline(*, sleep_seconds: float, parallel: bool, examples: int = 2048):
    """In-memory examples through a map that sleeps per element (0 = a plain in-memory pipeline)."""
    import numpy as np
    import tensorflow as tf

    features = np.random.default_rng(0).random((examples, FEATURES), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((features, features[:, :1]))
    if sleep_seconds:

        def slow_identity(inputs, targets):
            time.sleep(sleep_seconds)
            return inputs, targets

        def load(inputs, targets):
            inputs, targets = tf.numpy_function(slow_identity, [inputs, targets], [tf.float32, tf.float32])
            return tf.ensure_shape(inputs, [FEATURES]), tf.ensure_shape(targets, [1])

        dataset = dataset.map(load, num_parallel_calls=BATCH if parallel else None)
    dataset = dataset.batch(BATCH)
    if parallel:
        options = tf.data.Options()
        options.threading.private_threadpool_size = BATCH
        dataset = dataset.prefetch(4).with_options(options)
    return dataset


def overhead(name: str, model, dataset, *, rounds: int, steps: int, warmup_steps: int) -> None:
    from tfopt.profiling.capture import capture
    from tfopt.profiling.timing import time_training_steps

    plain, profiled = [], []
    for _ in range(rounds):
        plain.append(
            time_training_steps(
                model, dataset, steps=steps, warmup_steps=warmup_steps, batch_size=BATCH
            ).steps_per_second
        )
        with tempfile.TemporaryDirectory() as logdir:
            profiled.append(
                capture(
                    model, dataset, steps=steps, warmup_steps=warmup_steps, batch_size=BATCH, logdir=Path(logdir)
                ).step_times.steps_per_second
            )
    ratios = [p / q for p, q in zip(profiled, plain)]
    print(
        f"{name:<34} {statistics.median(plain):>10.1f} {statistics.median(profiled):>10.1f} "
        f"{statistics.median(ratios):>8.3f} {min(ratios):>6.3f}-{max(ratios):.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    from tfopt.hardware import detect
    from tfopt.profiling.capture import profile

    print(detect().describe())
    print(f"{'workload (steps/s, median of rounds)':<34} {'plain':>10} {'profiled':>10} {'ratio':>8} {'range':>13}")
    workloads = {
        "tiny MLP (w=64), in-memory": (mlp(64), pipeline(sleep_seconds=0, parallel=False)),
        "MLP (w=2048), in-memory": (mlp(2048), pipeline(sleep_seconds=0, parallel=False)),
        "MLP (w=2048), tuned slow map": (mlp(2048), pipeline(sleep_seconds=0.003, parallel=True)),
    }
    for name, (model, dataset) in workloads.items():
        overhead(name, model, dataset, rounds=args.rounds, steps=args.steps, warmup_steps=args.warmup_steps)

    print("\nstep breakdown (ms per step, profiled run) and diagnosis")
    model = mlp(2048)
    for name, parallel in (("starved (serial sleeping map)", False), ("tuned (32 parallel, prefetch 4)", True)):
        result = profile(
            model, pipeline(sleep_seconds=0.003, parallel=parallel), steps=args.steps, warmup_steps=args.warmup_steps
        )
        parts = ", ".join(
            f"{category.removesuffix('_seconds')} {seconds * 1000:.1f}"
            for category, seconds in result.breakdown.categories.items()
            if seconds > 0
        )
        print(
            f"{name:<34} wall step {result.breakdown.step_seconds_mean * 1000:.1f} ms: {parts}; "
            f"{result.metrics.headline()}; {result.diagnosis.summary}"
        )


if __name__ == "__main__":
    main()
