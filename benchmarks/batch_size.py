"""Batch-size search on a small CNN (Conv2D stack, 64x64x3 inputs, 5 classes): prints the trial table.

Run: python benchmarks/batch_size.py [--max-batch-size 512] [--trial-steps 8] [--budget-mib N]

The table is what `tfopt.recipes.find_batch_size` measures on this machine: examples/s of short timed trials at
powers of two and around the best, with each trial's peak memory (host RSS on CPU, allocator peak on
GPU). Speeds are side by side in one process, so they compare with each other, not across machines.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def small_cnn():
    import keras

    inputs = keras.Input((64, 64, 3))
    x = inputs
    for filters in (16, 32, 64):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(5, activation="softmax", dtype="float32")(x)
    model = keras.Model(inputs, outputs, name="small_cnn")
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-batch-size", type=int, default=512)
    parser.add_argument("--trial-steps", type=int, default=8)
    parser.add_argument("--budget-mib", type=int, default=None, help="host RAM budget (peak RSS) in MiB")
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    from tfopt.hardware import detect
    from tfopt.plan import make_plan
    from tfopt.recipes.batch_size import find_batch_size

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    images = rng.random((1024, 64, 64, 3), dtype=np.float32)
    labels = rng.integers(0, 5, 1024).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(32).prefetch(tf.data.AUTOTUNE)
    hardware = detect()
    plan = make_plan(small_cnn(), dataset, hardware=hardware)
    budget = args.budget_mib * 2**20 if args.budget_mib else None
    started = time.perf_counter()
    search = find_batch_size(
        plan,
        min_batch_size=8,
        max_batch_size=args.max_batch_size,
        memory_budget_bytes=budget,
        trial_steps=args.trial_steps,
    )
    seconds = time.perf_counter() - started
    print(f"{hardware.describe()}; TensorFlow {tf.__version__}, Keras {keras.__version__}")
    print(
        f"small CNN (3x Conv2D+MaxPool, 64x64x3, 5 classes), {args.trial_steps} timed steps per trial, "
        f"budget {search.memory_budget_bytes / 2**20:,.0f} MiB {search.memory_kind}; search took {seconds:.0f} s\n"
    )
    print(search.to_markdown())
    best = search.best
    baseline = next((t for t in search.trials if t.batch_size == 32 and t.status == "ok"), None)
    if baseline:
        print(
            f"\nbest {best.batch_size}: {best.examples_per_second / baseline.examples_per_second:.2f}x the "
            "examples/s of the dataset's batch of 32"
        )


if __name__ == "__main__":
    main()
