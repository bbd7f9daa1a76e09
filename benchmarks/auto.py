"""Auto mode on a small CNN fed by an input-starved pipeline, measured on this machine: the trials table.

The pipeline does heavy per-image work in a `map` with no parallelism and no prefetch (a stack of
5x5 convolutions per image, standing in for decoding and augmentation), so training waits for input.
Auto mode should keep the data pipeline recipe (parallel map, in-memory cache, prefetch), keep bf16
where the CPU computes it natively and it measures faster, and reject XLA where it measures slower.

    python benchmarks/auto.py [--budget 180] [--batch 32] [--image-size 64] [--images 512] [--work 24]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def starved_dataset(*, images: int, image_size: int, batch: int, work: int):
    """Random images with labels, each pushed through `work` convolutions one at a time, unparallelized."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    pixels = rng.random((images, image_size, image_size, 3), dtype=np.float32)
    labels = rng.integers(0, 5, images).astype("int32")
    kernel = tf.constant(rng.normal(0, 0.2, (5, 5, 3, 3)).astype("float32"))

    def heavy(image, label):
        x = image[None]
        for _ in range(work):
            x = tf.tanh(tf.nn.conv2d(x, kernel, 1, "SAME"))
        return x[0], label

    options = tf.data.Options()
    options.autotune.enabled = False  # what a pipeline written without tuning gets on a busy host
    return tf.data.Dataset.from_tensor_slices((pixels, labels)).map(heavy).batch(batch).with_options(options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=180.0, help="tuning budget in seconds")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--work", type=int, default=24, help="convolutions per image in the map")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("tfopt").setLevel(logging.INFO)

    import time

    import keras

    from benchmarks.recipes import small_cnn
    from tfopt.auto import tune
    from tfopt.hardware import detect
    from tfopt.plan import make_plan

    keras.utils.set_random_seed(0)
    hardware = detect()
    data = starved_dataset(images=args.images, image_size=args.image_size, batch=args.batch, work=args.work)
    plan = make_plan(small_cnn(args.image_size), data, hardware=hardware)
    began = time.monotonic()
    tuning = tune(plan, budget_seconds=args.budget, steps=args.steps, warmup_steps=args.warmup_steps)
    took = time.monotonic() - began
    table = tuning.table
    print(
        f"\nSmall CNN, batch {args.batch}, {args.image_size}x{args.image_size}x3, input-starved map "
        f"({args.work} convolutions per image, no parallelism), {args.images} images."
    )
    print(f"Measured on: {hardware.describe()}\n")
    print(table.to_text())
    best = table.best_row
    best_label = (
        best.configuration if best and best.examples_per_second >= table.baseline_examples_per_second else "baseline"
    )
    print(
        f"\nChosen {table.chosen_label}: {table.chosen_examples_per_second:.1f} examples/s; best in the table "
        f"{best_label}: {table.best_examples_per_second:.1f} "
        f"({table.chosen_examples_per_second / table.best_examples_per_second:.0%} of it). "
        f"Tuning took {took:.0f} s for a {args.budget:.0f} s budget ({took / args.budget - 1:+.0%})."
    )


if __name__ == "__main__":
    main()
