"""Each numeric recipe setting against float32, measured side by side in one run on this machine.

Backs the decisions the recipes make on hardware they run on (e.g. "auto" picks bf16 on a CPU with
AVX512-BF16 but never fp16, and leaves XLA off on CPU). Every configuration trains the same small CNN
on one in-memory batch (the compute-only ceiling, so the input pipeline does not blur the comparison);
rounds alternate between configurations so drift on a noisy machine hits all of them alike.

    python benchmarks/recipes.py [--rounds 3] [--steps 20] [--batch 64] [--image-size 64]
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CONFIGS = {
    "float32": dict(dtype_policy="float32", jit_compile=False),
    "mixed_bfloat16": dict(dtype_policy="mixed_bfloat16", jit_compile=False),
    "mixed_float16": dict(dtype_policy="mixed_float16", jit_compile=False),
    "float32 + XLA": dict(dtype_policy="float32", jit_compile=True),
}


def small_cnn(image_size: int, classes: int = 5):
    import keras

    inputs = keras.Input((image_size, image_size, 3))
    x = inputs
    for filters in (32, 64, 128):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(classes, activation="softmax")(x))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=64)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    from tfopt.builder import build
    from tfopt.hardware import detect
    from tfopt.plan import make_plan
    from tfopt.profiling.timing import one_batch_repeated, time_training_steps

    hardware = detect()
    rng = np.random.default_rng(0)
    images = rng.random((args.batch, args.image_size, args.image_size, 3), dtype=np.float32)
    labels = rng.integers(0, 5, args.batch)
    data = one_batch_repeated(tf.data.Dataset.from_tensors((images, labels)))
    baseline = make_plan(small_cnn(args.image_size), data, hardware=hardware)
    models = {
        name: build(
            baseline.replace(dtype_policy=cfg["dtype_policy"]).with_compile(jit_compile=cfg["jit_compile"])
        ).model
        for name, cfg in CONFIGS.items()
    }

    medians: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for round_index in range(args.rounds):
        for name, model in models.items():
            times = time_training_steps(
                model, data, steps=args.steps, warmup_steps=args.warmup_steps, batch_size=args.batch
            )
            medians[name].append(times.median_seconds)
        print(f"round {round_index + 1}/{args.rounds} done", flush=True)

    reference = statistics.median(medians["float32"])
    print(
        f"\nSmall CNN, batch {args.batch}, {args.image_size}x{args.image_size}x3, compute-only (one batch "
        f"repeated); median of {args.rounds} rounds x {args.steps} steps."
    )
    print(f"Measured on: {hardware.describe()}")
    print(f"{'configuration':<18}{'step ms':>10}{'examples/s':>12}{'vs float32':>12}")
    for name in CONFIGS:
        step = statistics.median(medians[name])
        print(f"{name:<18}{step * 1e3:>10.1f}{args.batch / step:>12.1f}{reference / step:>11.2f}x")


if __name__ == "__main__":
    main()
