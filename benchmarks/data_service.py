"""tf.data service offload benchmark: a preprocessing-heavy pipeline on one core, rewritten, then offloaded.

Run: `python benchmarks/data_service.py [--repeats 5] [--images 2000] [--image-size 128] [--input-size 96]
[--batch-size 64] [--epochs 4] [--quick]`. Needs a Linux host with at least 2 cores (CPU affinity pins each
side to one).

Workload: the shapes dataset as JPEG files, read the way a newcomer writes it: `from_tensor_slices(paths)`,
`shuffle`, `map(load)` (read_file, decode_jpeg, resize, to float), `map(augment)` (random crop, flips,
brightness, contrast, saturation, hue: stateful random ops, no py_function), `batch`; a small CNN trains on
it through `model.fit(dataset.repeat(), steps_per_epoch=one pass)`, as `tfopt.training.fit.train` does.
The training process is pinned to one core and one tf.data service worker process to another, the setting
where offloading pays: the preprocessing and the training step compete for the training process's only core,
and the worker's core is otherwise idle.

* (a) local: the pipeline as written, with TensorFlow's default options;
* (b) rewrite: (a) through the `data_pipeline` recipe's `tune_pipeline` (its graph rewrite: parallel maps and
  batch, a bounded prefetch), still in the training process;
* (c) offloaded: (b) planned by `tfopt.data.service.plan_offload(workers=1)` and read back from a
  `LocalCluster(workers=1)` through `tfopt.data.service_client.serve`, as the `data_service` recipe builds it: the
  worker runs the rewritten pipeline on its own core and streams the batches over loopback;
  `plan_offload` turns sharding off for one worker: it runs the whole pipeline, in its own order;
* (c') diagnostic: (c) with dynamic sharding, as several workers are served: the worker asks the dispatcher
  for each split, one file of `from_tensor_slices`, and the dispatcher lives in the training process, on
  the training core: (c') shows what those round trips cost.

All rows are measured in the same run, interleaved round-robin in each repeat (in reverse order every other
repeat) so that background load hits them alike; examples/s is each row's median over epochs 2+ (the first
epoch, which starts the pipeline or the service job, is warm-up), shown as median [min-max] over repeats.
The ratios are medians [min-max] of the ratios within each repeat, whose rows ran seconds apart. The cores
each side used are the CPU time (user + system, `psutil`) of the training process (which also holds the
dispatcher) and of the worker process over the measured epochs, divided by their wall time: a side at 1.00
kept its core busy. For (a) and (b) the worker idles. Target: (c) >= 1.5x (b).

Then the worker alone: (c)'s batches read as fast as they come, no training: what one worker core delivers
of this pipeline, the figure docs/data-service.md sizes CPU hosts from.
"""

from __future__ import annotations

import argparse
import dataclasses
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
import psutil
import tensorflow as tf

from tfopt.data import ImageFolderSource, generate_shapes
from tfopt.data.generated import DEFAULT_CLASSES
from tfopt.data.service import plan_offload
from tfopt.data.service_client import serve
from tfopt.data.service_servers import LocalCluster
from tfopt.hardware import detect
from tfopt.recipes.data_pipeline import tune_pipeline

TARGET_RATIO = 1.5
ROWS = (
    "(a) local, as written",
    "(b) tfopt rewrite (tune_pipeline)",
    "(c) rewrite offloaded to 1 worker",
    "(c') (c) with dynamic sharding",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=2000, help="JPEG files generated (split over the classes)")
    parser.add_argument("--image-size", type=int, default=128, help="side of the generated JPEG files, in pixels")
    parser.add_argument("--input-size", type=int, default=96, help="side of the model's input (random crop)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4, help="per row per repeat; the first is warm-up")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 repeats, 640 images, 3 epochs")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.images, args.epochs = 2, 640, 3
    if args.epochs < 2:
        parser.error(f"--epochs must be at least 2 (the first is warm-up); received {args.epochs}")
    hardware = detect()  # before pinning, so that it describes the whole machine
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        sys.exit(
            f"data_service benchmark: needs a Linux host with at least 2 cores this process may use (one for "
            f"training, one for the worker); this one has {len(cores) or 'no CPU affinity for'} "
            f"{'core' if len(cores) == 1 else 'cores'}. Run it on a larger machine."
        )
    train_core, worker_core = cores[0], cores[1]
    print(header(hardware))
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="tfopt-bench-"))
    cluster = None
    try:
        per_class = max(1, args.images // len(DEFAULT_CLASSES))
        source = ImageFolderSource(
            generate_shapes(workdir / "shapes", images_per_class=per_class, image_size=args.image_size),
            image_size=args.image_size,
        )
        # The worker inherits this process's affinity when it starts; both are pinned again once it serves.
        _pin(os.getpid(), {worker_core})
        cluster = LocalCluster(
            workers=1,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(pathlib.Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
                ),
            },
        )
        worker_pids = cluster.worker_pids
        for pid in worker_pids:
            _pin(pid, {worker_core})
        _pin(os.getpid(), {train_core})
        print(
            f"Pinned: the training process (pid {os.getpid()}, the dispatcher in it) to core {train_core}; the "
            f"worker process{'es' if len(worker_pids) > 1 else ''} (pid {', '.join(map(str, worker_pids))}) "
            f"to core {worker_core}."
        )
        _table(source, cluster, args)
        if cluster.restarts:
            print(f"Measurement problem: the worker died and was restarted during the run: {cluster.restarts}")
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)


def header(hardware) -> str:
    return (
        f"tfopt tf.data service benchmark. Measured on: {hardware.describe()}. TensorFlow {tf.__version__}, "
        f"Keras {keras.__version__}."
    )


def _pin(pid: int, cores: set[int]) -> None:
    """Pins every thread of process `pid` to `cores`: `os.sched_setaffinity(pid)` pins only the thread whose id
    is `pid`. Threads started meanwhile inherit their creator's affinity, so a second pass catches them."""
    for _ in range(3):
        moved = 0
        for name in os.listdir(f"/proc/{pid}/task"):
            try:
                if os.sched_getaffinity(int(name)) != cores:
                    os.sched_setaffinity(int(name), cores)
                    moved += 1
            except (ProcessLookupError, FileNotFoundError):  # the thread ended
                pass
        if not moved:
            return


# ---------------------------------------------------------------------------------------------------
# Pipeline and model


def _load(path, label, crop_from: int):
    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    image = tf.image.resize(image, (crop_from, crop_from))
    return tf.cast(image, tf.float32) / 255.0, label


def _augment(image, label, size: int):
    image = tf.image.random_crop(image, (size, size, 3))
    image = tf.image.random_flip_left_right(image)
    image = tf.image.random_flip_up_down(image)
    image = tf.image.random_brightness(image, 0.1)
    image = tf.image.random_contrast(image, 0.8, 1.2)
    image = tf.image.random_saturation(image, 0.8, 1.2)
    image = tf.image.random_hue(image, 0.05)
    return tf.clip_by_value(image, 0.0, 1.0), label


def _as_written(source, size: int, batch_size: int):
    crop_from = size + size // 8
    files = tf.data.Dataset.from_tensor_slices(([str(p) for p in source.files], source.labels))
    dataset = files.shuffle(len(source.files))
    dataset = dataset.map(lambda p, y: _load(p, y, crop_from))
    dataset = dataset.map(lambda x, y: _augment(x, y, size))
    return dataset.batch(batch_size)


def _model(size: int, classes: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((size, size, 3)),
            # Small on purpose: on one core its step costs about what the preprocessing of a batch costs, so
            # that moving the preprocessing elsewhere can nearly halve the time per step.
            layers.Conv2D(16, 3, strides=2, activation="relu"),
            layers.Conv2D(32, 3, strides=2, activation="relu"),
            layers.Conv2D(32, 3, activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(classes),
        ]
    )
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False
    )
    return model


# ---------------------------------------------------------------------------------------------------
# Timing


class _EpochMeter(keras.callbacks.Callback):
    """Per epoch: its wall seconds and the CPU seconds that this process and the workers spent in it."""

    def __init__(self, workers: list[psutil.Process]):
        super().__init__()
        self._processes = [psutil.Process(), *workers]
        self.epochs = []  # (wall seconds, training CPU seconds, workers' CPU seconds)

    def _snapshot(self):
        cpu = [sum(p.cpu_times()[:2]) for p in self._processes]
        return time.perf_counter(), cpu[0], sum(cpu[1:])

    def on_epoch_begin(self, epoch, logs=None):
        self._start = self._snapshot()

    def on_epoch_end(self, epoch, logs=None):
        end = self._snapshot()
        self.epochs.append(tuple(b - a for a, b in zip(self._start, end)))


def _measure(model, dataset, epochs: int, examples: int, workers) -> tuple[float, float, float]:
    """Examples/s (median over epochs 2+), and the cores the training process and the workers kept busy in them."""
    meter = _EpochMeter(workers)
    model.fit(
        dataset.repeat(),
        steps_per_epoch=int(dataset.cardinality()),
        epochs=epochs,
        verbose=0,
        shuffle=False,
        callbacks=[meter],
    )
    measured = meter.epochs[1:]
    wall = sum(e[0] for e in measured)
    return (
        statistics.median(examples / e[0] for e in measured),
        sum(e[1] for e in measured) / wall,
        sum(e[2] for e in measured) / wall,
    )


def _pipeline_rate(dataset, epochs: int, examples: int, workers) -> tuple[float, float]:
    """Examples/s of reading `dataset` alone (median over epochs 2+), and the cores the workers kept busy."""
    rates, busy, wall = [], 0.0, 0.0
    for epoch in range(epochs):
        began, cpu = time.perf_counter(), sum(sum(p.cpu_times()[:2]) for p in workers)
        for _ in dataset:
            pass
        seconds = time.perf_counter() - began
        if epoch:
            rates.append(examples / seconds)
            busy += sum(sum(p.cpu_times()[:2]) for p in workers) - cpu
            wall += seconds
    return statistics.median(rates), busy / wall


def _table(source, cluster, args) -> None:
    size, batch_size = args.input_size, args.batch_size
    local = _as_written(source, size, batch_size)
    rewritten = tune_pipeline(local)
    offload, why = plan_offload(rewritten, workers=1, batch_size=batch_size)
    if offload is None:
        sys.exit(f"data_service benchmark: the rewritten pipeline cannot be offloaded: {why}")
    # Diagnostic: the worker asks the dispatcher for each split (one file per request, answered by the
    # dispatcher on the training core), as it would beside other workers.
    split = dataclasses.replace(offload, sharding="dynamic")
    variants = {
        ROWS[0]: lambda: _as_written(source, size, batch_size),
        ROWS[1]: lambda: tune_pipeline(_as_written(source, size, batch_size)),
        ROWS[2]: lambda: serve(rewritten, offload, cluster.target, batch_size=batch_size),
        ROWS[3]: lambda: serve(rewritten, split, cluster.target, batch_size=batch_size),
    }
    model = _model(size, len(DEFAULT_CLASSES))
    print(
        f"\nWorkload: {source.num_examples} JPEG files of {args.image_size}x{args.image_size} (shapes dataset), "
        f"decoded, resized to {size + size // 8}, randomly cropped to {size} and augmented (flips, brightness, "
        f"contrast, saturation, hue); batch {batch_size}; a CNN of {model.count_params():,} parameters; "
        f"{args.epochs} epochs per row per repeat, {args.repeats} repeats."
    )
    print(f"Offload plan: {offload.describe()}")
    one_batch = local.take(1).cache()
    model.fit(one_batch.repeat(3), epochs=1, verbose=0, shuffle=False)  # build and trace once, outside the timings
    workers = [psutil.Process(pid) for pid in cluster.worker_pids]
    rates, training_cores, worker_cores = ({name: [] for name in variants} for _ in range(3))
    for repeat in range(args.repeats):
        for name in list(variants)[:: 1 if repeat % 2 == 0 else -1]:
            rate, training, worker = _measure(model, variants[name](), args.epochs, source.num_examples, workers)
            rates[name].append(rate)
            training_cores[name].append(training)
            worker_cores[name].append(worker)
    print(
        f"\nExamples/s of `model.fit`: median [min-max] over {args.repeats} repeats of each row's median over "
        f"epochs 2-{args.epochs}; ratio to (b): median [min-max] of the ratios within each repeat; cores: the "
        "CPU time each side used over those epochs per wall second, median over repeats.\n"
    )
    print("| row | examples/s | ratio to (b) | training-process cores | worker cores |")
    print("|---|---:|---:|---:|---:|")
    for name in variants:
        print(
            f"| {name} | {_spread(rates[name])} | {_ratio_summary(rates[name], rates[ROWS[1]])} | "
            f"{statistics.median(training_cores[name]):.2f} | {statistics.median(worker_cores[name]):.2f} |"
        )
    ratio = statistics.median(a / b for a, b in zip(rates[ROWS[2]], rates[ROWS[1]]))
    print(
        f"\n(c)/(b) = {_ratio_summary(rates[ROWS[2]], rates[ROWS[1]])}; target >= {TARGET_RATIO}: "
        f"{'met' if ratio >= TARGET_RATIO else 'not met'}."
    )
    alone = [
        _pipeline_rate(
            serve(rewritten, offload, cluster.target, batch_size=batch_size), args.epochs, source.num_examples, workers
        )
        for _ in range(args.repeats)
    ]
    print(
        f"The worker alone (its batches read without training): {_spread([rate for rate, _ in alone])} "
        f"examples/s with {statistics.median(cores for _, cores in alone):.2f} worker cores busy: what one "
        "worker core delivers of this pipeline."
    )
    batch_bytes = offload.batch_bytes  # from the static shapes, as plan_offload sized it
    if batch_bytes is None:
        return
    loopback = [batch_bytes * rate / batch_size for rate in rates[ROWS[2]]]
    print(
        f"(c) moves {batch_bytes / 2**20:.2f} MiB per batch (uncompressed, as planned for loopback) from the worker "
        f"to the training process: {statistics.median(loopback) / 2**20:.0f} MiB/s "
        f"[{min(loopback) / 2**20:.0f}-{max(loopback) / 2**20:.0f}] over loopback."
    )


def _spread(values: list[float]) -> str:
    """`median [min-max]` of values measured in separate repeats."""
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def _ratio_summary(numerators: list[float], denominators: list[float]) -> str:
    """`median [min-max]` of the ratios of values measured in the same repeat."""
    ratios = [a / b for a, b in zip(numerators, denominators)]
    return f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"


if __name__ == "__main__":
    main()
