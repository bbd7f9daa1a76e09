"""Steps per second with 1 and 2 replicas (MirroredStrategy), workers (MultiWorkerMirrored) and Horovod ranks.

Each configuration trains the same MLP for a fixed number of steps with tfopt.distribute.fit, each replica
on a batch of 64 (the global batch grows with the replicas, as the distribution recipe does), in its own
processes; step times are read from a callback after warm-up. Prints a table of ratios.

Caveat: on a 2-core CPU machine, two replicas share the same two cores, so the ratio measures overhead,
not the speed-up that two GPUs or two hosts give.

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

PER_REPLICA_BATCH, WARMUP_STEPS = 64, 10
ROOT = Path(__file__).resolve().parent.parent


def worker(kind: str, replicas: int, steps: int) -> None:
    import tensorflow as tf

    if kind == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    import keras
    import numpy as np

    from tfopt.distribute import fit, make_strategy

    strategy = {"mirrored": lambda: make_strategy("mirrored", devices=[f"/cpu:{i}" for i in range(replicas)]),
                "multi_worker": lambda: make_strategy("multi_worker"),
                "horovod": lambda: make_strategy("horovod")}[kind]()
    global_batch = PER_REPLICA_BATCH * strategy.num_replicas_in_sync
    with strategy.scope():
        model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    features = rng.normal(size=(global_batch * 4, 256)).astype("float32")
    labels = rng.integers(0, 10, len(features))
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(global_batch, drop_remainder=True).repeat()
    ends = []
    timer = keras.callbacks.LambdaCallback(on_train_batch_end=lambda step, logs: ends.append(time.perf_counter()))
    fit(model, dataset, strategy=strategy, epochs=1, steps_per_epoch=steps + WARMUP_STEPS, callbacks=[timer],
        engine="tfopt")
    measured = np.diff(ends[WARMUP_STEPS - 1:])
    print("BENCH " + json.dumps({"steps_per_second": float(1 / np.median(measured))}), flush=True)


def run(kind: str, replicas: int, steps: int) -> float:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, __file__, "--worker", kind, "--replicas", str(replicas), "--steps", str(steps)]
    if kind == "multi_worker":
        from tfopt.distribute import launch_local_workers

        lines: list[str] = []
        launch_local_workers(command, replicas, env=env, output=lines.append, timeout_seconds=900)
        output = "\n".join(line.split("] ", 1)[1] for line in lines if line.startswith("[worker 0]"))
    elif kind == "horovod":
        horovodrun = shutil.which("horovodrun", path=str(Path(sys.executable).parent))
        output = subprocess.run([horovodrun, "-np", str(replicas), "-H", f"127.0.0.1:{replicas}", "--gloo",
                                 "--network-interfaces", "lo", *command], env=env, capture_output=True, text=True,
                                timeout=900, check=True).stdout
        output = output.replace("[0]<stdout>:", "")
    else:
        output = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=True).stdout
    line = next(line for line in output.splitlines() if line.startswith("BENCH "))
    return json.loads(line[len("BENCH "):])["steps_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--worker")
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.replicas, args.steps)
        return
    kinds = ["mirrored", "multi_worker"]
    try:
        import horovod.tensorflow  # noqa: F401
        kinds.append("horovod")
    except ImportError:
        print("(horovod not installed: scripts/install_horovod.sh; its row is skipped)")
    print(f"{'strategy':<14}{'1 replica steps/s':>19}{'2 replicas steps/s':>20}{'ratio 2/1':>11}"
          f"{'examples/s ratio':>18}")
    for kind in kinds:
        one, two = run(kind, 1, args.steps), run(kind, 2, args.steps)
        print(f"{kind:<14}{one:>19.2f}{two:>20.2f}{two / one:>11.2f}{2 * two / one:>18.2f}", flush=True)
    print(f"(each replica trains on a batch of {PER_REPLICA_BATCH}; 2 replicas share this machine's "
          f"{os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
