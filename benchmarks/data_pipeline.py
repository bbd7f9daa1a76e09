"""Input-pipeline benchmark: naive vs hand-tuned vs tfopt vs the compute-only ceiling, plus TFRecord I/O.

Run: `python benchmarks/data_pipeline.py [--repeats 5] [--images-per-class 600] [--image-size 128]
[--conversion-copies 10] [--cases py_function pipeline tfrecord]`.

First the tf.data performance guide's own case, the one `tf.data.Options` cannot fix: a `map` over a
`tf.py_function` that costs 4 ms per element (here a sleep, as in the guide), batch 16, read as fast
as possible with no model. The naive pipeline (sequential map, batch), the guide's
(`num_parallel_calls=AUTOTUNE`, batch, `prefetch(AUTOTUNE)`) and tfopt's (`tune_pipeline`, the
`data_pipeline` recipe's functional form, applied to the naive pipeline: its graph rewrite) are timed
side by side, one full pass each, interleaved within each repeat.

Workload: the shapes dataset as JPEG files (decode + random flip/translation/brightness) feeding a
small CNN through `model.fit`. All variants are measured in the same run, interleaved round-robin in
each repeat (in reverse order every other repeat) so that background load hits them alike; the table
shows medians and [min-max] over repeats (of each variant's median over epochs 2-4). The ratios between
variants are medians of the ratios within each repeat, whose variants ran seconds apart: on a shared
machine the speed drifts by tens of percent between repeats, far more than within one. Each variant's
input efficiency (the ceiling's step time over its own) is read as tfopt reads every measurement
(`tfopt.profiling.measurement.Measurement`, each repeat one window): never above 100%, and a variant faster
than the ceiling beyond the measured spread is reported as a measurement problem.

Each variant's epochs are read from one iterator (`fit(dataset.repeat(), steps_per_epoch=one pass)`,
as `tfopt.training.fit.train` does). Given the finite dataset, Keras makes a new iterator per epoch and keeps the
previous one alive into the next epoch, and with tf.data's autotuning on, about a third of those
epochs run the training step at half speed with a core idle, whichever pipeline feeds it (measured
here; never with one iterator, never with autotuning off). Row (c') shows tfopt's pipeline fed that way.

* (a) naive: what a newcomer writes: `map(load)`, `map(augment)` with stateful random ops, `batch`,
  with TensorFlow's default options;
* (a') the same with TF's automatic rewrites off (`map_parallelization`, `inject_prefetch`), i.e.
  truly sequential: shows how much TF's defaults already rescue (a);
* (a+) (a) through the `data_pipeline` recipe's `tune_pipeline`: its maps (the augmentation's random
  ops included) and batch rewritten to run in parallel, a bounded prefetch at the end;
* (b) hand-tuned as the tf.data performance guide teaches: parallel `map`, `cache` after decode,
  `shuffle`, parallel augment (image by image, as the guide's augmentation examples do), `batch`,
  `prefetch(AUTOTUNE)`;
* (c) tfopt: `ImageFolderSource(..., augment=True).pipeline(optimized=True)`: the same stages, with the
  augmentation vectorized over batches and fused by XLA;
* (c') the same pipeline passed to `fit(dataset, epochs=...)` as is, so Keras iterates it anew each epoch;
* (c-) tfopt's pipeline without augmentation: about half the CPU per image of (c) after the first epoch;
* (d) compute-only ceiling: one batch cached in memory and repeated, so input costs nothing;
* (e) a whole epoch of (c)'s finished batches held in memory: different batches every step, as in (c),
  but no pipeline running beside the model.

(c-) and (e) locate what separates (c) from the ceiling on a CPU-only machine, where the pipeline and
the model share the cores: (e) trains at the ceiling, so fresh, cache-cold batches cost the model
nothing and the gap is the pipeline's work running beside the model; (c-) shows how much of that is
the augmentation's.

Then TFRecord conversion throughput (MB of source JPEG per second) of a plain sequential
`tf.io.TFRecordWriter` loop vs `tfopt.data.to_tfrecord`, and read throughput of a sequential
`TFRecordDataset` vs tfopt's parallel interleave. The conversion input is the image folder repeated
`--conversion-copies` times (hard links), so that a conversion takes long enough to measure.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import keras
import tensorflow as tf

from tfopt.data import ImageFolderSource, TFRecordSource, generate_shapes, to_tfrecord
from tfopt.hardware import detect
from tfopt.profiling.measurement import Measurement
from tfopt.profiling.timing import StepTimes
from tfopt.recipes.data_pipeline import tune_pipeline

BATCH_SIZE = 64
EPOCHS = 4
CASES = ("py_function", "pipeline", "tfrecord")
GUIDE_ELEMENTS = 512
GUIDE_BATCH_SIZE = 16
GUIDE_SECONDS_PER_ELEMENT = 0.004


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images-per-class", type=int, default=600)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--conversion-copies", type=int, default=10)
    parser.add_argument(
        "--cases", nargs="+", choices=CASES, default=list(CASES), help="which tables to measure (default: all)"
    )
    args = parser.parse_args()
    print(_header())
    if "py_function" in args.cases:
        _guide_table(args.repeats)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="tfopt-bench-"))
    try:
        data_dir = generate_shapes(
            workdir / "shapes", images_per_class=args.images_per_class, image_size=args.image_size
        )
        source = ImageFolderSource(data_dir, image_size=args.image_size, augment=True)
        if "pipeline" in args.cases:
            print(f"\nWorkload: {source.describe()}; batch {BATCH_SIZE}; {EPOCHS} epochs per variant per repeat.")
            _pipeline_table(source, args.repeats)
        if "tfrecord" in args.cases:
            _tfrecord_table(
                _repeated_folder(source, workdir / "repeated", args.conversion_copies), workdir, args.repeats
            )
        print(f"\n{_load_average()}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _header() -> str:
    """The machine the numbers come from, as `tfopt.hardware.detect()` describes it: the device that trains
    and the host cores that tf.data runs on."""
    hardware = detect()
    trains_on = f"GPU:0 ({hardware.gpus[0].name})" if hardware.gpus else f"the {hardware.accelerator.upper()}"
    return (
        f"tfopt input-pipeline benchmark. Measured on: {hardware.describe()}. Keras trains on {trains_on}; "
        f"tf.data runs on the host's {hardware.cpu_count} cores (those its CPU affinity lets this process use, of "
        f"{os.cpu_count()} logical cores in all). TensorFlow {tf.__version__}, "
        f"Keras {keras.__version__}. {_load_average()}"
    )


def _load_average() -> str:
    """The load average, printed because other processes on the machine distort every ratio."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return ""
    return f"Load average now: {one:.1f} (1 min), {five:.1f} (5 min)."


# ---------------------------------------------------------------------------------------------------
# The tf.data guide's py_function case


def _costly(element):
    time.sleep(GUIDE_SECONDS_PER_ELEMENT)  # "some hard pre-processing", as the guide's example sleeps
    return element


def _guide_naive():
    return (
        tf.data.Dataset.range(GUIDE_ELEMENTS)
        .map(lambda i: tf.py_function(_costly, [i], tf.int64))
        .batch(GUIDE_BATCH_SIZE)
    )


def _guide_tuned():
    dataset = tf.data.Dataset.range(GUIDE_ELEMENTS).map(
        lambda i: tf.py_function(_costly, [i], tf.int64), num_parallel_calls=tf.data.AUTOTUNE
    )
    return dataset.batch(GUIDE_BATCH_SIZE).prefetch(tf.data.AUTOTUNE)


def _elements_per_second(dataset) -> float:
    """One full pass, the iterator's creation included (every variant pays it alike)."""
    start = time.perf_counter()
    for _ in dataset:
        pass
    return GUIDE_ELEMENTS / (time.perf_counter() - start)


def _guide_table(repeats: int) -> None:
    variants = {
        "naive: map(py_function), batch": _guide_naive,
        "guide: num_parallel_calls=AUTOTUNE, prefetch": _guide_tuned,
        "tfopt: data_pipeline on the naive pipeline": lambda: tune_pipeline(_guide_naive()),
    }
    rates = {name: [] for name in variants}
    for repeat in range(repeats):
        for name in list(variants)[:: 1 if repeat % 2 == 0 else -1]:
            dataset = variants[name]()  # built (and for tfopt, rewritten) outside the timing
            rates[name].append(_elements_per_second(dataset))
    guide = rates["guide: num_parallel_calls=AUTOTUNE, prefetch"]
    print(
        f"\nThe tf.data guide's case: map over a {GUIDE_SECONDS_PER_ELEMENT * 1e3:.0f} ms py_function, batch "
        f"{GUIDE_BATCH_SIZE}, {GUIDE_ELEMENTS} elements per pass, no model; elements/s: median [min-max] of "
        f"{repeats} repeats; /guide: median [min-max] of the ratios within each repeat"
    )
    print(f"{'variant':48s} {'elements/s':>18s} {'/guide':>18s}")
    for name, values in rates.items():
        print(f"{name:48s} {_spread(values):>18s} {_ratio_summary(values, guide):>18s}")
    print("target: tfopt/guide >= 0.95")


# ---------------------------------------------------------------------------------------------------
# Pipelines


def _load(path, label, size):
    image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
    image.set_shape((size, size, 3))
    return tf.cast(image, tf.float32) / 255.0, label


def _stateful_augment(image, label, size):
    image = tf.image.random_flip_left_right(image)
    pad = size // 8
    image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])  # the same ops as tfopt's, to compare pipelines
    image = tf.image.random_crop(image, (size, size, 3))
    image = tf.image.random_brightness(image, 0.1)
    return tf.clip_by_value(image, 0.0, 1.0), label


def _naive(source, *, tf_rewrites: bool):
    size = source.image_size[0]
    files = tf.data.Dataset.from_tensor_slices(([str(p) for p in source.files], source.labels))
    dataset = files.shuffle(len(source.files))
    dataset = dataset.map(lambda p, y: _load(p, y, size))
    dataset = dataset.map(lambda x, y: _stateful_augment(x, y, size))
    dataset = dataset.batch(BATCH_SIZE)
    if not tf_rewrites:
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        dataset = dataset.with_options(options)
    return dataset


def _hand_tuned(source):
    size = source.image_size[0]
    autotune = tf.data.AUTOTUNE
    files = tf.data.Dataset.from_tensor_slices(([str(p) for p in source.files], source.labels))
    dataset = files.map(lambda p, y: _load(p, y, size), num_parallel_calls=autotune).cache()
    dataset = dataset.shuffle(len(source.files))
    dataset = dataset.map(lambda x, y: _stateful_augment(x, y, size), num_parallel_calls=autotune)
    return dataset.batch(BATCH_SIZE).prefetch(autotune)


def _ceiling(source, steps):
    batch = source.pipeline(batch_size=BATCH_SIZE, optimized=True).take(1).cache()
    return batch.repeat(steps)


def _finished_batches(source):
    """One epoch of tfopt's finished batches, read once here so that every later pass only replays memory."""
    batches = source.pipeline(batch_size=BATCH_SIZE, optimized=True, seed=0).cache()
    for _ in batches:
        pass
    return batches


def _model(size: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((size, size, 3)),
            # Small on purpose: the workload must be data-bound (decoding costs more than a step).
            layers.AveragePooling2D(2),
            layers.Conv2D(16, 3, strides=2, activation="relu"),
            layers.Conv2D(32, 3, strides=2, activation="relu"),
            layers.Conv2D(64, 3, activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(5),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,  # explicit, so every variant is compared without XLA
    )
    return model


class _EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def _time_epochs(model, dataset, examples_per_epoch, *, one_iterator=True) -> list[float]:
    """Examples/s of each of EPOCHS epochs of `model.fit` on the finite `dataset` (one pass per epoch).

    one_iterator: read all epochs from one iterator of `dataset.repeat()`; False passes `dataset` as is.
    """
    timer = _EpochTimer()
    if one_iterator:
        steps = int(dataset.cardinality())
        model.fit(dataset.repeat(), steps_per_epoch=steps, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[timer])
    else:
        model.fit(dataset, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[timer])
    return [examples_per_epoch / seconds for seconds in timer.seconds]


def _pipeline_table(source, repeats: int) -> None:
    size = source.image_size[0]
    steps = -(-source.num_examples // BATCH_SIZE)
    examples = source.num_examples
    unaugmented = ImageFolderSource(source.path, image_size=source.image_size, augment=False)
    finished = _finished_batches(source)
    variants = {
        "(a) naive, TF default options": lambda: _naive(source, tf_rewrites=True),
        "(a') naive, TF auto-rewrites off": lambda: _naive(source, tf_rewrites=False),
        "(a+) naive + tfopt data_pipeline": lambda: tune_pipeline(_naive(source, tf_rewrites=True)),
        "(b) hand-tuned (tf.data guide)": lambda: _hand_tuned(source),
        "(c) tfopt optimized": lambda: source.pipeline(batch_size=BATCH_SIZE, optimized=True, seed=0),
        "(c') tfopt, new iterator per epoch": lambda: source.pipeline(batch_size=BATCH_SIZE, optimized=True, seed=0),
        "(c-) tfopt, no augmentation": lambda: unaugmented.pipeline(batch_size=BATCH_SIZE, optimized=True, seed=0),
        "(d) compute-only ceiling": lambda: _ceiling(source, steps),
        "(e) finished batches in memory": lambda: finished,
    }
    model = _model(size)
    model.fit(_ceiling(source, 3), epochs=1, verbose=0, shuffle=False)  # build and trace once, outside the timings
    first_epoch = {name: [] for name in variants}
    later_epochs = {name: [] for name in variants}
    # On an accelerator the fit-based ceiling (d) still copies its batch from the host every step; the
    # ceiling is then the step fed one batch already in device memory (tfopt.profiling.timing).
    on_device = detect().accelerator == "gpu"
    device_ceiling = []
    for repeat in range(repeats):
        # Every other repeat runs the variants in reverse order, so that a drift of the machine's speed
        # within a repeat does not always favour the same variant.
        for name in list(variants)[:: 1 if repeat % 2 == 0 else -1]:
            rates = _time_epochs(
                model,
                variants[name](),
                examples if "ceiling" not in name else steps * BATCH_SIZE,
                one_iterator="new iterator" not in name,
            )
            first_epoch[name].append(rates[0])
            later_epochs[name].append(statistics.median(rates[1:]))
        if on_device:
            from tfopt.profiling.measurement import time_ceiling_steps

            device_ceiling.append(
                time_ceiling_steps(
                    model, finished, steps=steps, warmup_steps=5, batch_size=BATCH_SIZE
                ).examples_per_second
            )
    if on_device:
        first_epoch["(d*) on-device ceiling (timing.py)"] = device_ceiling
        later_epochs["(d*) on-device ceiling (timing.py)"] = device_ceiling
    ceiling = device_ceiling if on_device else later_epochs["(d) compute-only ceiling"]
    print(
        f"\nInput pipeline feeding a small CNN (model.fit), examples/s: median [min-max] of {repeats} repeats; "
        "input efficiency: the ceiling's step time over the variant's (epochs 2+), read by "
        "tfopt.profiling.measurement.Measurement with each repeat as one window"
    )
    print(f"{'variant':36s} {'epoch 1':>8s} {'epochs 2+':>22s} {'input efficiency':>17s}")
    problems = []
    for name in later_epochs:
        measurement = _measurement(later_epochs[name], ceiling)
        efficiency = measurement.input_efficiency
        if efficiency is None:
            problems.append(f"{name}: {measurement.measurement_problem}")
        print(
            f"{name:36s} {statistics.median(first_epoch[name]):8.0f} {_spread(later_epochs[name]):>22s} "
            f"{'measurement problem' if efficiency is None else f'{efficiency:.0%}':>17s}"
        )
    for problem in problems:
        print(f"  {problem}")
    ours = later_epochs["(c) tfopt optimized"]
    print(
        f"(c)/(b) = {_ratio_summary(ours, later_epochs['(b) hand-tuned (tf.data guide)'])}   "
        f"(c)/(a) = {_ratio_summary(ours, later_epochs['(a) naive, TF default options'])}   "
        "targets: (c) input efficiency >= 95%, (c)/(b) >= 1.0"
    )


def _measurement(rates: list[float], ceiling_rates: list[float]) -> Measurement:
    """A variant against the ceiling as tfopt reads a measurement, each repeat's examples/s one window:
    its input efficiency is never above 100%, and a variant beyond the ceiling's spread is a measurement problem."""

    def step_times(values: list[float]) -> StepTimes:
        return StepTimes(seconds=tuple(BATCH_SIZE / value for value in values), batch_size=BATCH_SIZE)

    return Measurement(real=step_times(rates), ceiling=step_times(ceiling_rates))


def _spread(values: list[float]) -> str:
    """`median [min-max]` of values measured in separate repeats."""
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def _ratio_summary(numerators: list[float], denominators: list[float]) -> str:
    """`median [min-max]` of the ratios of values measured in the same repeat."""
    ratios = [a / b for a, b in zip(numerators, denominators)]
    return f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"


# ---------------------------------------------------------------------------------------------------
# TFRecord I/O


def _repeated_folder(source, root: pathlib.Path, copies: int):
    """The source's image folder `copies` times over, as hard links (copies where links fail)."""
    for copy in range(copies):
        for path in source.files:
            target = root / path.parent.name / f"{copy}-{path.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)
    return ImageFolderSource(root, image_size=source.image_size)


def _sequential_tf_writer(source, out_dir: pathlib.Path, compression: str | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    options = tf.io.TFRecordOptions(compression_type=compression or "")
    with tf.io.TFRecordWriter(str(out_dir / "all.tfrecord"), options) as writer:
        for path, label in zip(source.files, source.labels):
            feature = {
                "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[path.read_bytes()])),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _read_all(dataset) -> None:
    for _ in dataset:
        pass


def _tfrecord_writers(source, compression: str | None, label: str, cores: int) -> dict:
    return {
        f"write, sequential tf.io.TFRecordWriter [{label}]": lambda out: _sequential_tf_writer(
            source, out, compression
        ),
        f"write, tfopt to_tfrecord 1 worker [{label}]": lambda out: to_tfrecord(
            source, out, compression=compression, num_workers=1
        ),
        f"write, tfopt to_tfrecord {cores} workers [{label}]": lambda out: to_tfrecord(
            source, out, compression=compression, num_workers=cores
        ),
    }


def _tfrecord_readers(files: list[str], compression: str | None, label: str) -> dict:
    compression_type = compression or ""
    return {
        f"read, sequential TFRecordDataset [{label}]": lambda: tf.data.TFRecordDataset(
            files, compression_type=compression_type
        ),
        f"read, parallel interleave (tfopt) [{label}]": lambda: tf.data.Dataset.from_tensor_slices(files).interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=compression_type),
            cycle_length=len(files),
            num_parallel_calls=tf.data.AUTOTUNE,
        ),
    }


def _tfrecord_table(source, workdir: pathlib.Path, repeats: int) -> None:
    megabytes = sum(p.stat().st_size for p in source.files) / 1e6
    for path in source.files:  # warm the page cache so that every writer reads from memory
        path.read_bytes()
    rows = {}
    cores = detect().cpu_count  # those this process may use
    for compression in (None, "GZIP"):
        label = compression or "none"
        writers = _tfrecord_writers(source, compression, label, cores)
        for repeat in range(repeats):
            for name, write in writers.items():
                out = workdir / f"tfrecord-{len(rows)}-{repeat}-{abs(hash(name))}"
                started = time.perf_counter()
                write(out)
                rows.setdefault(name, []).append(megabytes / (time.perf_counter() - started))
                shutil.rmtree(out)
        converted = to_tfrecord(source, workdir / f"converted-{label}", compression=compression)
        tfrecord = TFRecordSource(converted)
        readers = _tfrecord_readers([str(p) for p in tfrecord.files], compression, label)
        for _ in range(repeats):
            for name, build in readers.items():
                started = time.perf_counter()
                _read_all(build())
                rows.setdefault(name, []).append(megabytes / (time.perf_counter() - started))
    print(
        f"\nTFRecord conversion of {megabytes:.1f} MB of JPEG files ({source.num_examples} images), MB/s, "
        f"median of {repeats} repeats; ratio to the sequential row: median [min-max] within each repeat"
    )
    baselines = {}
    for name, rates in rows.items():
        kind = name.split(",")[0] + name[name.index("[") :]
        baselines.setdefault(kind, rates)
        print(f"{name:52s} {statistics.median(rates):8.1f} MB/s  x{_ratio_summary(rates, baselines[kind])}")


if __name__ == "__main__":
    main()
