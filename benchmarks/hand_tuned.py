"""`tfopt.apply` against an expert's hand-tuned setup of the same model, measured side by side in one run.

Four setups of each model start from the same weights and train on the same images, timed in alternating
rounds (`tfopt.profiling.measurement.measure_side_by_side`), so that a change of load hits all alike:

- your model: float32, compiled as Keras compiles by default, on a plain pipeline (map, batch);
- hand-tuned: what NVIDIA's TensorFlow scripts do by hand: mixed bfloat16, XLA, a parallel map and a prefetch;
- tfopt: what `tfopt.apply(model, dataset)` gives back with its defaults, each recipe kept only where it
  measured faster here;
- tfopt, fused_layers flipped: the same setup with its BatchNormalization rewrite the other way round, for the
  rewrite's own ratio on this machine (its kept/left-out decision is printed too).

Models: ResNet-50 (`keras.applications`, weights=None) and the CNN of keras-io's "Image classification from
scratch" (separable convolutions, BatchNormalization, residual adds), both ending in logits.

    python benchmarks/hand_tuned.py [--image-size 64] [--batch 16] [--steps 12]   # a CPU: minutes per model
    python benchmarks/hand_tuned.py --image-size 224 --batch 128 --steps 60        # one GPU
    python benchmarks/hand_tuned.py --model ResNet-50 ...                           # one of the models

The timed steps are split into about four windows, one per round (`tfopt.profiling.timing.window_layout`).
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfopt.hardware import detect

CLASSES = 10


def resnet50(image_size: int):
    import keras

    return keras.applications.ResNet50(
        weights=None, input_shape=(image_size, image_size, 3), classes=CLASSES, classifier_activation=None
    )


def keras_io_cnn(image_size: int):
    """keras-io's "Image classification from scratch" model, as written there (no augmentation)."""
    import keras
    from keras import layers

    inputs = keras.Input((image_size, image_size, 3))
    x = layers.Conv2D(128, 3, strides=2, padding="same")(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous = x
    for size in (256, 512, 728):
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous)
        x = layers.add([x, residual])
        previous = x
    x = layers.SeparableConv2D(1024, 3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.25)(x)
    return keras.Model(inputs, layers.Dense(CLASSES)(x))


MODELS = {"ResNet-50": resnet50, "keras-io CNN from scratch": keras_io_cnn}


def images(image_size: int, batch: int, *, tuned: bool):
    """Random uint8 images, scaled to [0, 1] in a map: as written (plain), or as an expert writes it."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    count = batch * 8
    pixels = rng.integers(0, 256, (count, image_size, image_size, 3), dtype=np.uint8)
    labels = rng.integers(0, CLASSES, count).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((pixels, labels))

    def scale(image, label):
        return tf.cast(image, tf.float32) / 255.0, label

    if tuned:
        return data.map(scale, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE)
    return data.map(scale).batch(batch)


def compiled(model, **settings):
    import keras

    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **settings,
    )
    return model


def setups(make, image_size: int, batch: int, steps: int) -> tuple[dict, bool, str]:
    """The four setups by name, whether tfopt's default kept fused_layers, and its step in `plan.applied`."""
    import keras

    import tfopt
    from tfopt.builder import build

    yours = compiled(make(image_size))
    weights = yours.get_weights()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        tuned = make(image_size)
    finally:
        keras.config.set_dtype_policy("float32")
    tuned.set_weights(weights)
    compiled(tuned, jit_compile=True)
    plain = images(image_size, batch, tuned=False)
    result = tfopt.apply(yours, plain, steps=steps, warmup_steps=2)
    step = next(step for step in result.plan.applied if step.recipe == "fused_layers")
    flipped_plan = result.plan.replace(layer_rewrites=() if result.plan.layer_rewrites else ("batch_norm",))
    flipped = build(flipped_plan)
    return (
        {
            "your model": (yours, plain),
            "hand-tuned bf16 + XLA + prefetch": (tuned, images(image_size, batch, tuned=True)),
            "tfopt.apply": (result.model, result.dataset),
            "tfopt, fused_layers flipped": (flipped.model, flipped.dataset),
        },
        bool(result.plan.layer_rewrites),
        str(step),
    )


def header() -> str:
    return f"Measured on: {detect().describe()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--model", choices=sorted(MODELS), action="append", help="one model (default: every one)")
    args = parser.parse_args()
    from tfopt.profiling.measurement import Side, measure_side_by_side

    hardware = detect()
    print(header())
    print(
        f"{args.image_size}x{args.image_size} images, batch {args.batch}, {args.steps} timed steps per side in "
        "rounds; examples/s median [min-max] over rounds, ratios round by round.\n"
    )
    for name, make in MODELS.items():
        if args.model and name not in args.model:
            continue
        sides, kept, decision = setups(make, args.image_size, args.batch, args.steps)
        measured = measure_side_by_side(
            [Side(model, data, args.batch) for model, data in sides.values()],
            steps=args.steps,
            warmup_steps=2,
            hardware=hardware,
        )
        names = list(sides)
        print(f"### {name}\n\ntfopt's default: {decision}\n")
        print("| setup | examples/s | vs your model | vs hand-tuned |")
        print("|---|---:|---:|---:|")
        for index, side in enumerate(names):
            print(
                f"| {side} | {spread(measured.rounds[index], 1)} | {spread(measured.ratios(index, 0))}x | "
                f"{spread(measured.ratios(index, 1))}x |"
            )
        with_rewrite, without = (2, 3) if kept else (3, 2)
        print(f"\nfused_layers' own ratio (with / without): {spread(measured.ratios(with_rewrite, without))}x\n")


def spread(values, digits: int = 2) -> str:
    """The median [min-max] of `values`."""
    values = list(values)
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


if __name__ == "__main__":
    main()
