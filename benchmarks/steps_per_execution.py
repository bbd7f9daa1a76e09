"""Training steps per call of the train function (Keras' `steps_per_execution`), measured side by side in one run.

Each model is compiled at 1, 4, 16 and 64 steps per call from the same weights and trained on the same
in-memory batches (cached, prefetched: the pipeline costs nothing), timed in alternating rounds
(`tfopt.profiling.measurement.measure_side_by_side`), so that a change of load hits all alike. Then
`tfopt.apply(model, data, recipes=["steps_per_execution"])` decides on its own measurement, as a user's run
would, and its line is printed.

Models: keras-io's "Simple MNIST convnet" and an MLP of the same data's shape (28x28 inputs, 10 classes), on
generated images, at keras-io's batch sizes.

    python benchmarks/steps_per_execution.py [--steps 64] [--examples 4096]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfopt.hardware import detect

STEPS_PER_CALL = (1, 4, 16, 64)


def mlp():
    import keras

    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def convnet():
    import keras

    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


# Model, batch size (keras-io's for the convnet).
MODELS = {"MLP 784-128-10": (mlp, 32), "keras-io MNIST convnet": (convnet, 128)}


def images(examples: int, batch: int):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    pixels = rng.random((examples, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, examples)
    return tf.data.Dataset.from_tensor_slices((pixels, labels)).batch(batch).cache().prefetch(tf.data.AUTOTUNE)


def compiled(make, steps_per_call: int, weights=None):
    import keras

    keras.utils.set_random_seed(0)
    model = make()
    if weights is not None:
        model.set_weights(weights)
    model.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=steps_per_call,
    )
    return model


def header() -> str:
    return f"Measured on: {detect().describe()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--examples", type=int, default=4096)
    args = parser.parse_args()
    import tfopt
    from tfopt.profiling.measurement import Side, measure_side_by_side
    from tfopt.profiling.metrics import spread

    def spread_of(values, digits: int = 2) -> str:
        median, low, high = spread(tuple(values))
        return f"{median:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"

    hardware = detect()
    print(header())
    print(
        f"{args.steps} or more timed steps per side in rounds (windows of whole calls); examples/s median [min-max] "
        "over rounds, ratios round by round.\n"
    )
    for name, (make, batch) in MODELS.items():
        data = images(args.examples, batch)
        first = compiled(make, 1)
        models = [first, *(compiled(make, n, first.get_weights()) for n in STEPS_PER_CALL[1:])]
        measured = measure_side_by_side(
            [Side(model, data, batch) for model in models], steps=args.steps, warmup_steps=4, hardware=hardware
        )
        print(f"### {name}, batch {batch}\n")
        print("| steps per call | examples/s | vs 1 per call |")
        print("|---:|---:|---:|")
        for index, steps_per_call in enumerate(STEPS_PER_CALL):
            speed, ratio = spread_of(measured.rounds[index], 0), spread_of(measured.ratios(index, 0))
            print(f"| {steps_per_call} | {speed} | {ratio}x |")
        result = tfopt.apply(compiled(make, 1), data, recipes=["steps_per_execution"], steps=args.steps // 2)
        decision = next(step for step in result.plan.applied if step.recipe == "steps_per_execution")
        print(f"\n`tfopt.apply(..., recipes=['steps_per_execution'])`: {decision}\n")
        result.close()


if __name__ == "__main__":
    main()
