"""The program every worker of the multi-worker tests runs (started by tfopt's launcher, not pytest).

Usage: python worker_script.py OUT_DIR --strategy multi_worker|horovod [--epochs N] [--die-at-epoch K]
[--die-worker I] [--checkpoint-dir DIR]. Writes OUT_DIR/worker_<index>.json with the example ids this
worker was fed, its final weights, its loss history and the epochs it trained.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

from tfopt.distribute import fit, make_strategy
from tfopt.distribute.training import worker_role

EXAMPLES, GLOBAL_BATCH = 64, 16


def make_dataset() -> tf.data.Dataset:
    """Example i has feature column 0 equal to i, so a worker's share can be read back from its inputs."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(EXAMPLES, 4)).astype("float32")
    features[:, 0] = np.arange(EXAMPLES)
    targets = (features[:, 1:] @ np.array([[1.0], [-2.0], [0.5]], "float32")).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return (
        tf.data.Dataset.from_tensor_slices((features, targets))
        .batch(GLOBAL_BATCH, drop_remainder=True)
        .with_options(options)
    )


def ids_seen(strategy, dataset) -> list[int]:
    if hasattr(strategy, "shard"):  # Horovod: the trainer shards with this same call
        local = strategy.shard(dataset, GLOBAL_BATCH, None)
        return sorted(int(i) for x, _ in local for i in x[:, 0].numpy())
    ids = []
    for x, _ in strategy.experimental_distribute_dataset(dataset):
        for part in strategy.experimental_local_results(x):
            ids.extend(int(i) for i in part[:, 0].numpy())
    return sorted(ids)


def train_reference(epochs: int) -> tuple[list[float], list[np.ndarray]]:
    """One device, Keras fit, the same global batches and worker 0's initial weights: the exact reference.
    On the CPU, as the workers train (also on a GPU host)."""
    keras.utils.set_random_seed(0)
    with tf.device("/cpu:0"):
        model = make_model()
        history = model.fit(make_dataset(), epochs=epochs, verbose=0, shuffle=False)
    return history.history["loss"], model.get_weights()


def make_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    return model


class DieAt(keras.callbacks.Callback):
    def __init__(self, epoch: int):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            print(f"dying at epoch {epoch}", flush=True)
            os._exit(17)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--strategy", default="multi_worker")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--die-at-epoch", type=int, default=-1)
    parser.add_argument("--die-worker", type=int, default=1)
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    # Two workers on one host would share its one GPU, as no real cluster does: they train on its CPU.
    tf.config.set_visible_devices([], "GPU")
    options = {"communication_timeout_seconds": args.timeout} if args.strategy == "multi_worker" else {}
    strategy = make_strategy(args.strategy, **options)
    index, is_chief = worker_role(strategy)
    keras.utils.set_random_seed(index)  # different initial weights per worker: sync must fix them
    with strategy.scope():
        model = make_model()
    dataset = make_dataset()
    ids = ids_seen(strategy, dataset)
    callbacks = [DieAt(args.die_at_epoch)] if args.die_at_epoch >= 0 and index == args.die_worker else []
    history = fit(
        model,
        dataset,
        strategy=strategy,
        epochs=args.epochs,
        callbacks=callbacks,
        checkpoint_dir=args.checkpoint_dir,
        engine="tfopt",
    )
    result = {
        "index": index,
        "is_chief": is_chief,
        "replicas": strategy.num_replicas_in_sync,
        "ids": ids,
        "epochs": history.epoch,
        "loss": history.history.get("loss", []),
        "weights": [w.tolist() for w in model.get_weights()],
        "iterations": int(model.optimizer.iterations.numpy()),
    }
    with open(os.path.join(args.out_dir, f"worker_{index}.json"), "w") as handle:
        json.dump(result, handle)
    print(f"worker {index} done: loss {result['loss']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
