"""Steps per second with 1 and 2 replicas (MirroredStrategy), workers (MultiWorkerMirrored) and Horovod ranks.

Each configuration trains the same MLP for a fixed number of steps with tfopt.distribute.fit, each replica
on a batch of 64 (the global batch grows with the replicas, as the distribution recipe does), in its own
processes; step times are read from a callback after warm-up. Prints the machine as
`tfopt.hardware.detect()` describes it, then a table of ratios with the devices each row trained on.

Mirrored replicas are GPUs where the machine has 2 or more, else logical CPU devices over the same cores;
workers and Horovod ranks each train on the process's first GPU, else its CPU. Caveat: all of them run on
this one machine, so where the replicas of a row share a device (its CPU cores, or one GPU) the ratio
measures the strategy's overhead, not the speed-up that separate GPUs or hosts give; the closing line
says which it was.

Usage: python benchmarks/scaling.py [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PER_REPLICA_BATCH, WARMUP_STEPS, REPLICAS = 64, 10, 2
ROOT = Path(__file__).resolve().parent.parent


def worker(kind: str, replicas: int, steps: int) -> None:
    import tensorflow as tf

    devices = []
    if kind == "mirrored":
        # GPUs where there are enough for the largest run, so that every row of the table uses one kind.
        device_kind = "gpu" if len(tf.config.list_physical_devices("GPU")) >= REPLICAS else "cpu"
        if device_kind == "cpu":
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
        devices = [f"/{device_kind}:{i}" for i in range(replicas)]
    import keras
    import numpy as np

    from tfopt.distribute import fit, make_strategy

    strategy = {
        "mirrored": lambda: make_strategy("mirrored", devices=devices),
        "multi_worker": lambda: make_strategy("multi_worker"),
        "horovod": lambda: make_strategy("horovod"),
    }[kind]()
    global_batch = PER_REPLICA_BATCH * strategy.num_replicas_in_sync
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((256,)),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    features = rng.normal(size=(global_batch * 4, 256)).astype("float32")
    labels = rng.integers(0, 10, len(features))
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(global_batch, drop_remainder=True).repeat()
    ends = []
    timer = keras.callbacks.LambdaCallback(on_train_batch_end=lambda step, logs: ends.append(time.perf_counter()))
    fit(
        model,
        dataset,
        strategy=strategy,
        epochs=1,
        steps_per_epoch=steps + WARMUP_STEPS,
        callbacks=[timer],
        engine="tfopt",
    )
    measured = np.diff(ends[WARMUP_STEPS - 1 :])
    print(
        "BENCH "
        + json.dumps(
            {
                "steps_per_second": float(1 / np.median(measured)),
                "replicas": int(strategy.num_replicas_in_sync),
                "devices": trained_on(model.trainable_variables[0]),
            }
        ),
        flush=True,
    )


def trained_on(variable) -> list[str]:
    """The devices holding a Keras variable's copies in this process, e.g. ["CPU:0", "CPU:1"] or ["GPU:0"]."""
    import tensorflow as tf

    held = variable.value  # the TensorFlow variable: a distributed one holds a copy per local replica
    specs = [tf.DeviceSpec.from_string(copy.device) for copy in getattr(held, "values", None) or (held,)]
    return [f"{spec.device_type}:{spec.device_index}" for spec in specs]


def run(kind: str, replicas: int, steps: int) -> dict:
    # Two worker processes on one GPU each reserve all of its memory unless it grows as needed.
    env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", **os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, __file__, "--worker", kind, "--replicas", str(replicas), "--steps", str(steps)]
    if kind == "multi_worker":
        from tfopt.distribute import launch_local_workers

        lines: list[str] = []
        launch_local_workers(command, replicas, env=env, output=lines.append, timeout_seconds=900)
        output = "\n".join(line.split("] ", 1)[1] for line in lines if line.startswith("[worker 0]"))
    elif kind == "horovod":
        horovodrun = shutil.which("horovodrun", path=str(Path(sys.executable).parent))
        output = subprocess.run(
            [
                horovodrun,
                "-np",
                str(replicas),
                "-H",
                f"127.0.0.1:{replicas}",
                "--gloo",
                "--network-interfaces",
                "lo",
                *command,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        ).stdout
        output = output.replace("[0]<stdout>:", "")
    else:
        output = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=True).stdout
    line = next(line for line in output.splitlines() if line.startswith("BENCH "))
    return json.loads(line[len("BENCH ") :])


def header() -> str:
    """The machine, as `tfopt.hardware.detect()` describes it (GPUs listed, none initialised)."""
    from tfopt.hardware import detect

    return f"Measured on: {detect().describe()}"


def sharing_note(kind: str, devices: list[str], hardware) -> str:
    """What the replicas of a row's larger run shared on this machine, from the devices its process 0 trained
    on: the ratio is a speed-up only where they shared nothing."""
    on_gpus = bool(devices) and all(device.startswith("GPU") for device in devices)
    if kind == "mirrored":
        if on_gpus:
            return f"mirrored: {len(devices)} GPUs, one replica each"
        return f"mirrored: {len(devices)} logical CPU devices over the same {hardware.cpu_count} cores"
    processes = f"{REPLICAS} {'workers' if kind == 'multi_worker' else 'ranks'}"
    if not on_gpus:
        return f"{kind}: {processes} sharing the host's {hardware.cpu_count} cores"
    if kind == "horovod" and len(hardware.gpus) >= REPLICAS:
        return f"horovod: {processes}, a GPU each"  # each rank is pinned to the GPU of its local rank
    # Every worker on this machine uses every GPU it sees; ranks beyond the GPUs share one.
    return f"{kind}: {processes} sharing {', '.join(devices)}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--worker")
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.replicas, args.steps)
        return
    from tfopt.hardware import detect

    print(header())
    kinds = ["mirrored", "multi_worker"]
    try:
        import horovod.tensorflow  # noqa: F401

        kinds.append("horovod")
    except ImportError:
        print("(horovod not installed: scripts/install_horovod.sh; its row is skipped)")
    # "1" and "2" are replicas (mirrored), workers or ranks; with several GPUs a worker holds one replica per GPU.
    print(
        f"{'strategy':<14}{'1: steps/s (replicas)':>23}{f'{REPLICAS}: steps/s (replicas)':>23}{'ratio':>8}"
        f"{'examples/s ratio':>18}  trained on ({REPLICAS}, process 0)"
    )
    notes = []
    for kind in kinds:
        one, many = run(kind, 1, args.steps), run(kind, REPLICAS, args.steps)
        ratio = many["steps_per_second"] / one["steps_per_second"]
        examples = ratio * many["replicas"] / one["replicas"]
        print(
            f"{kind:<14}{one['steps_per_second']:>19.2f} ({one['replicas']}){many['steps_per_second']:>19.2f} "
            f"({many['replicas']}){ratio:>8.2f}{examples:>18.2f}  {', '.join(many['devices'])}",
            flush=True,
        )
        notes.append(sharing_note(kind, many["devices"], detect()))
    print(
        f"(each replica trains on a batch of {PER_REPLICA_BATCH}; {'; '.join(notes)}. Replicas that share a "
        "device measure the strategy's overhead, not a speed-up.)"
    )


if __name__ == "__main__":
    main()
